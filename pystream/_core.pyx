# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""pystream._core: the Cython bridge over the C core in csrc/.

The C side parses bytes and fills buffers; this module owns memory lifetimes
(receive blocks that Arrow arrays point into) and turns C error codes into the
exceptions of :mod:`pystream.errors`.

Batches have the columns ``offset int64``, ``chunk_timestamp timestamp[us,
UTC]``, ``body`` (``binary_view`` into the input / receive buffer, or into
owned buffers for compressed sub-batches and multi-section bodies, with
``body="view"``; contiguous ``binary`` with ``body="binary"``), then, only
when named in ``columns``, ``properties``, ``application_properties``,
``message_annotations``, ``header`` and ``footer`` (in that order; see
:func:`schema`), and ``error string`` with ``error_policy="raw"``.

The body is the concatenation of the data sections; without any, the
payload of an amqp-value string/symbol/binary that is not described, else
the encoding of the amqp-value (a described one with its descriptor) or of
the amqp-sequences' lists, back to back; empty when there is none.
``amqp=False`` keeps the entry bytes.  Map values and ids are rendered as
text by the rules in csrc/amqp.c (decimal numbers, true/false, ISO 8601
timestamps, canonical uuids, lowercase hex binary, JSON for lists and maps,
``{"descriptor": d, "value": v}`` for described values, null as null).  An
absent section reads as null (the whole struct or map); header fields absent
from a header that is present take the AMQP defaults (durable false,
priority 4, first_acquirer false, delivery_count 0; ttl null).

error_policy for a message that is not valid AMQP 1.0: "raise"
(MalformedMessage with the byte position, the default), "skip" (drop the
record), "raw" (keep the entry bytes as body and the reason in ``error``).
Numpy views without copies: ``batch.column("offset").to_numpy()`` (and
``chunk_timestamp``); body positions and lengths are the Arrow buffers of
the body column (``.buffers()``).
"""

from cpython.buffer cimport (PyBUF_SIMPLE, PyBuffer_FillInfo,
                             PyBuffer_Release, PyObject_GetBuffer)
# functions, not the macros: the abi3 build has the limited API only
from cpython.bytes cimport PyBytes_AsString, PyBytes_FromStringAndSize, PyBytes_Size
from cpython.ref cimport PyObject, Py_DECREF, Py_INCREF, Py_REFCNT
from libc.stdint cimport (int32_t, int64_t, uint8_t, uint16_t, uint32_t,
                           uint64_t, uintptr_t)
from libc.errno cimport EINTR, errno
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

import os

import numpy as np
import pyarrow as pa

from pystream.errors import (CodecUnavailable, CorruptChunk, DecompressionLimit,
                             FrameTooLarge,
                             MalformedMessage, ProtocolError, StreamError,
                             TruncatedFrame)
# The module is one extension split by concern into these includes.
include "_core_decls.pxi"

# --- errors -----------------------------------------------------------------

cdef int raise_error(const ps_error *err) except -1:
    """Raise the pystream exception for a C error code."""
    what = err.what.decode() if err.what != NULL else "error"
    msg = f"{what} (at byte {err.position})"
    code = err.code
    if code == PS_E_TRUNCATED_FRAME:
        raise TruncatedFrame(msg, position=err.position)
    if code == PS_E_FRAME_TOO_LARGE:
        raise FrameTooLarge(msg, position=err.position)
    if code == PS_E_CRC or code == PS_E_CHUNK:
        raise CorruptChunk(msg, position=err.position)
    if code == PS_E_LIMIT:
        raise DecompressionLimit(msg, position=err.position)
    if code == PS_E_AMQP:
        raise MalformedMessage(msg, position=err.position)
    if code == PS_E_PROTOCOL:
        raise ProtocolError(msg, position=err.position)
    if code == PS_E_NOMEM:
        raise MemoryError(msg)
    if code == PS_E_OVERFLOW:
        raise OverflowError(msg)
    if code == PS_E_CODEC_MISSING:
        raise CodecUnavailable(what)
    raise SystemError(f"pystream._core: unknown error code {code}: {msg}")


include "_core_crc.pxi"
include "_core_frames.pxi"
include "_core_decode.pxi"
include "_core_encode.pxi"
include "_core_stream.pxi"
