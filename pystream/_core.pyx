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
``message_annotations`` and ``header`` (in that order; see :func:`schema`),
and ``error string`` with ``error_policy="raw"``.

The body is the concatenation of the data sections; without any, the
payload of an amqp-value string/symbol/binary, else the encoded amqp-value
or first amqp-sequence; empty when there is none.  ``amqp=False`` keeps the
entry bytes.  Map values and ids are rendered as text by the rules in
csrc/amqp.c (decimal numbers, true/false, ISO 8601 timestamps, canonical
uuids, lowercase hex binary, JSON for lists and maps, null as null).
Header fields absent from the list take the AMQP defaults (durable false,
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
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.ref cimport PyObject, Py_REFCNT
from libc.stdint cimport (int32_t, int64_t, uint8_t, uint16_t, uint32_t,
                           uint64_t, uintptr_t)
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

import numpy as np
import pyarrow as pa

from pystream.errors import (CorruptChunk, DecompressionLimit, FrameTooLarge,
                             MalformedMessage, ProtocolError, StreamError,
                             TruncatedFrame)


cdef extern from "status.h":
    enum:
        PS_OK
        PS_NEED_MORE
        PS_E_TRUNCATED_FRAME
        PS_E_FRAME_TOO_LARGE
        PS_E_CHUNK
        PS_E_CRC
        PS_E_LIMIT
        PS_E_AMQP
        PS_E_PROTOCOL
        PS_E_NOMEM
        PS_E_OVERFLOW
    ctypedef struct ps_error:
        int code
        uint64_t position
        const char *what

cdef extern from "frame.h":
    ctypedef struct ps_reader:
        uint8_t *buf
        size_t cap
        size_t rpos
        size_t wpos
        uint64_t consumed
        uint32_t max_frame
        uint32_t max_deliver
    int ps_reader_next(ps_reader *r, const uint8_t **frame, uint32_t *len,
                       ps_error *err) nogil
    size_t ps_reader_missing(const ps_reader *r) nogil
    void ps_reader_compact(ps_reader *r) nogil
    void ps_reader_rebase(ps_reader *r, uint8_t *nbuf, size_t ncap) nogil

cdef extern from "crc.h":
    uint32_t ps_crc32(uint32_t crc, const uint8_t *p, size_t n) nogil

cdef extern from "buf.h":
    ctypedef struct ps_buf:
        uint8_t *p
        size_t len
        size_t cap

cdef extern from "batch.h":
    enum:
        PS_COL_PROPERTIES
        PS_COL_APPLICATION_PROPERTIES
        PS_COL_MESSAGE_ANNOTATIONS
        PS_COL_HEADER
        PS_POLICY_RAISE
        PS_POLICY_SKIP
        PS_POLICY_RAW
        PS_PROP_FIELDS
        PS_HEADER_FIELDS
    ctypedef struct ps_options:
        int crc
        int amqp
        int body_binary
        int error_policy
        unsigned columns
        uint64_t start_offset
        uint64_t max_subbatch
        uint64_t max_chunk
    ctypedef struct ps_col:
        ps_buf validity
        ps_buf values
        ps_buf data
        size_t length
        size_t nulls
    ctypedef struct ps_region:
        const uint8_t *base
        size_t len
        ps_buf own
    ctypedef struct ps_batch:
        ps_options opt
        size_t rows
        ps_buf offset
        ps_buf timestamp
        ps_buf views
        ps_col body
        ps_col error
        ps_col properties
        ps_col prop[13]
        ps_col header
        ps_col hdr[5]
        ps_col app
        ps_col app_keys
        ps_col app_values
        ps_col ann
        ps_col ann_keys
        ps_col ann_values
        ps_region *regions
        size_t nregions
    int ps_batch_init(ps_batch *b, const ps_options *opt)
    void ps_batch_free(ps_batch *b)
    int ps_batch_reset(ps_batch *b)

cdef extern from "chunk.h":
    enum:
        PS_KEY_DELIVER
    ctypedef struct ps_chunk:
        uint8_t version
        uint8_t subscription_id
        uint64_t committed_chunk_id
        uint8_t type
        uint16_t num_entries
        uint32_t num_records
        int64_t timestamp
        uint64_t epoch
        uint64_t first_offset
        uint32_t crc
        uint32_t data_len
        const uint8_t *data
    uint16_t ps_frame_key(const uint8_t *frame) nogil
    int ps_deliver_parse(const uint8_t *frame, size_t len, uint64_t pos,
                         ps_chunk *c, ps_error *err) nogil
    int ps_chunk_decode(const ps_chunk *c, ps_batch *b, ps_error *err) nogil
    int ps_decode_buffer(const uint8_t *p, size_t n, ps_batch *b,
                         ps_error *err) nogil


cdef extern from "codec.h":
    ctypedef struct ps_codecs:
        pass
    ps_codecs *ps_codecs_new()
    void ps_codecs_free(ps_codecs *c)

cdef extern from "encode.h":
    enum:
        PS_STRS_ABSENT
        PS_STRS_OFFSETS32
        PS_STRS_OFFSETS64
        PS_STRS_VIEWS
    ctypedef struct ps_strs:
        int layout
        int binary
        const uint8_t *validity
        size_t offset
        const void *offsets
        const uint8_t *data
        const uint8_t *const *buffers
    ctypedef struct ps_ints:
        const int64_t *values
        const uint8_t *validity
        size_t offset
        int64_t mul
        int64_t div
    ctypedef struct ps_props:
        int present
        const uint8_t *validity
        size_t offset
        ps_strs text[13]
        ps_ints num[13]
    ctypedef struct ps_map:
        const int32_t *offsets
        const uint8_t *validity
        size_t offset
        ps_strs keys
        ps_strs values
    ctypedef struct ps_publish:
        uint8_t publisher_id
        uint64_t first_id
        size_t count
        int amqp
        int codec
        uint32_t sub_batch
        uint64_t max_frame
        ps_strs body
        ps_strs filter
        ps_props properties
        ps_map application_properties
        ps_map message_annotations
    int ps_encode_publish(const ps_publish *p, ps_codecs *codecs, ps_buf *frames,
                          ps_buf *counts, ps_error *err) nogil
    void ps_murmur3_32(const ps_strs *keys, size_t n, uint32_t seed,
                       uint32_t *out) nogil


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
    raise SystemError(f"pystream._core: unknown error code {code}: {msg}")


# --- CRC --------------------------------------------------------------------

def crc32(data, value=0):
    """CRC-32 of ``data`` (any bytes-like), continuing from ``value``:
    the same result as :func:`zlib.crc32`."""
    cdef Py_buffer view
    cdef uint32_t crc = <uint32_t>(value & 0xFFFFFFFF)
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        with nogil:
            crc = ps_crc32(crc, <const uint8_t *>view.buf, <size_t>view.len)
    finally:
        PyBuffer_Release(&view)
    return crc


# --- receive blocks ---------------------------------------------------------
#
# A receive block is one malloc'd region that socket reads land in.  Decoded
# columns point into it (zero copy), holding a reference to the _Block object
# through their Arrow buffers; when the last reference goes, the region returns
# to a small pool and the next reader that needs room reuses it.

cdef enum:
    POOL_SLOTS = 16
    POOL_BYTES = 64 * 1024 * 1024
    BLOCK_SIZE = 1024 * 1024

cdef uint8_t *pool_data[POOL_SLOTS]
cdef size_t pool_cap[POOL_SLOTS]
cdef int pool_len = 0
cdef size_t pool_total = 0


cdef class _Block:
    """One receive region; exports it through the buffer protocol."""
    cdef uint8_t *data
    cdef size_t cap

    def __dealloc__(self):
        global pool_len, pool_total
        if self.data == NULL:
            return
        if pool_len < POOL_SLOTS and pool_total + self.cap <= POOL_BYTES:
            pool_data[pool_len] = self.data
            pool_cap[pool_len] = self.cap
            pool_len += 1
            pool_total += self.cap
        else:
            free(self.data)
        self.data = NULL

    def __getbuffer__(self, Py_buffer *view, int flags):
        PyBuffer_FillInfo(view, self, self.data, <Py_ssize_t>self.cap, 0, flags)

    def __releasebuffer__(self, Py_buffer *view):
        pass


cdef _Block new_block(size_t need):
    """A block of at least ``need`` bytes, from the pool when one fits."""
    global pool_len, pool_total
    cdef _Block b = _Block.__new__(_Block)
    cdef int i
    for i in range(pool_len):
        if pool_cap[i] >= need:
            b.data = pool_data[i]
            b.cap = pool_cap[i]
            pool_total -= b.cap
            pool_len -= 1
            pool_data[i] = pool_data[pool_len]
            pool_cap[i] = pool_cap[pool_len]
            return b
    cdef size_t cap = BLOCK_SIZE
    while cap < need:
        cap *= 2
    b.data = <uint8_t *>malloc(cap)
    if b.data == NULL:
        raise MemoryError()
    b.cap = cap
    return b


# --- frame reader -----------------------------------------------------------

cdef class FrameReader:
    """Splits the bytes of a stream connection into frames.

    ``sock.recv_into(reader.writable())``, ``reader.commit(n)``, then call
    :meth:`next_frame` until it returns ``None``.
    """
    cdef ps_reader r
    cdef _Block block
    cdef bint busy          # a chunk of this buffer is being decoded without the GIL

    def __cinit__(self, max_frame_size=1048576):
        self.block = new_block(BLOCK_SIZE)
        self.r.buf = self.block.data
        self.r.cap = self.block.cap
        self.r.rpos = 0
        self.r.wpos = 0
        self.r.consumed = 0
        self.r.max_deliver = 0
        self.max_frame_size = max_frame_size

    @property
    def max_frame_size(self):
        """Largest accepted frame size (without the size prefix); 0 means
        unlimited.  Set it after Tune."""
        return self.r.max_frame

    @max_frame_size.setter
    def max_frame_size(self, value):
        if not 0 <= value <= 0xFFFFFFFF:
            raise ValueError("max_frame_size must be in [0, 2**32)")
        self.r.max_frame = value

    @property
    def max_deliver_size(self):
        """Largest accepted Deliver frame when above ``max_frame_size``:
        brokers send each chunk whole, whatever frame_max says."""
        return self.r.max_deliver

    @max_deliver_size.setter
    def max_deliver_size(self, value):
        if not 0 <= value <= 0xFFFFFFFF:
            raise ValueError("max_deliver_size must be in [0, 2**32)")
        self.r.max_deliver = value

    cdef bint block_shared(self):
        # Only this reader holds the block: nothing points into it.
        return Py_REFCNT(<object><PyObject *>self.block) > 1

    cdef int check_idle(self) except -1:
        if self.busy:
            raise RuntimeError("the decoder is in use by another thread")
        return 0

    cdef int reserve(self, size_t min_size) except -1:
        """Make at least min_size bytes (and room for the whole pending
        frame) free at the end of the buffer."""
        cdef size_t missing = ps_reader_missing(&self.r)
        cdef size_t need = min_size if min_size > missing else missing
        cdef size_t unread = self.r.wpos - self.r.rpos
        cdef _Block nb
        if self.r.cap - self.r.wpos >= need:
            return 0
        if not self.block_shared() and unread + need <= self.r.cap:
            ps_reader_compact(&self.r)
            return 0
        nb = new_block(unread + need)
        ps_reader_rebase(&self.r, nb.data, nb.cap)
        self.block = nb
        return 0

    def writable(self, Py_ssize_t min_size=65536):
        """Free space at the end of the receive buffer, as a writable
        memoryview; write into it, then :meth:`commit` the count."""
        if min_size < 1:
            raise ValueError("min_size must be positive")
        self.check_idle()
        if self.r.rpos == self.r.wpos and self.r.rpos and not self.block_shared():
            self.r.rpos = self.r.wpos = 0
        self.reserve(<size_t>min_size)
        return memoryview(self.block)[self.r.wpos:self.r.cap]

    def commit(self, Py_ssize_t n):
        """``n`` bytes were written at the start of the last :meth:`writable`."""
        self.check_idle()
        if n < 0 or <size_t>n > self.r.cap - self.r.wpos:
            raise ValueError("commit count exceeds the writable space")
        self.r.wpos += n

    def feed(self, data):
        """Append a copy of ``data`` (any bytes-like) to the buffer."""
        cdef Py_buffer view
        self.check_idle()
        PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
        try:
            if view.len:
                self.reserve(<size_t>view.len)
                memcpy(self.r.buf + self.r.wpos, view.buf, <size_t>view.len)
                self.r.wpos += <size_t>view.len
        finally:
            PyBuffer_Release(&view)

    def next_frame(self):
        """The next complete frame without its size prefix, or ``None``."""
        cdef const uint8_t *frame
        cdef uint32_t n
        cdef ps_error err
        self.check_idle()
        cdef int rc = ps_reader_next(&self.r, &frame, &n, &err)
        if rc == PS_OK:
            return PyBytes_FromStringAndSize(<const char *>frame, n)
        if rc == PS_NEED_MORE:
            return None
        raise_error(&err)

    def buffered(self):
        """Bytes received but not yet returned as frames."""
        return self.r.wpos - self.r.rpos


# --- Arrow export -----------------------------------------------------------
#
# The C batch owns malloc'd column buffers; each is handed to Arrow wrapped in
# an _Owned object (Arrow buffer parent) that frees it when Arrow lets go.
# Views into the input point at it through a buffer whose parent keeps the
# input (bytes-like or receive block) alive.

cdef class _Owned:
    cdef void *p

    def __dealloc__(self):
        free(self.p)


cdef object EMPTY = pa.py_buffer(b"")


cdef object take(ps_buf *b):
    """An Arrow buffer owning b's memory (b is left empty)."""
    if b.p == NULL or b.len == 0:
        free(b.p)
        b.p = NULL
        b.len = b.cap = 0
        return EMPTY
    cdef _Owned o = _Owned.__new__(_Owned)
    o.p = b.p
    n = b.len
    b.p = NULL
    b.len = b.cap = 0
    return pa.foreign_buffer(<uintptr_t>o.p, n, base=o)


cdef object take_validity(ps_col *c):
    if c.nulls == 0:
        free(c.validity.p)
        c.validity.p = NULL
        c.validity.len = c.validity.cap = 0
        return None
    return take(&c.validity)


cdef object export_col(ps_col *c, object typ, list children=None):
    """One Arrow array from a C column of the matching kind."""
    cdef size_t n = c.length, nulls = c.nulls
    validity = take_validity(c)
    if children is not None:           # struct or map
        bufs = [validity] if typ.num_buffers == 1 else [validity, take(&c.values)]
        return pa.Array.from_buffers(typ, n, bufs, nulls, children=children)
    if typ.num_buffers == 3:           # string / binary
        offsets = take(&c.values)
        return pa.Array.from_buffers(typ, n, [validity, offsets, take(&c.data)], nulls)
    return pa.Array.from_buffers(typ, n, [validity, take(&c.values)], nulls)


TS = pa.timestamp("us", tz="UTC")

PROPERTIES = pa.struct([
    ("message_id", pa.string()), ("user_id", pa.binary()), ("to", pa.string()),
    ("subject", pa.string()), ("reply_to", pa.string()),
    ("correlation_id", pa.string()), ("content_type", pa.string()),
    ("content_encoding", pa.string()), ("absolute_expiry_time", TS),
    ("creation_time", TS), ("group_id", pa.string()),
    ("group_sequence", pa.int64()), ("reply_to_group_id", pa.string()),
])
STRING_MAP = pa.map_(pa.string(), pa.string())
HEADER = pa.struct([
    ("durable", pa.bool_()), ("priority", pa.int32()), ("ttl", pa.int64()),
    ("first_acquirer", pa.bool_()), ("delivery_count", pa.int64()),
])
OPTIONAL_COLUMNS = {
    "properties": (PS_COL_PROPERTIES, PROPERTIES),
    "application_properties": (PS_COL_APPLICATION_PROPERTIES, STRING_MAP),
    "message_annotations": (PS_COL_MESSAGE_ANNOTATIONS, STRING_MAP),
    "header": (PS_COL_HEADER, HEADER),
}
POLICIES = {"raise": PS_POLICY_RAISE, "skip": PS_POLICY_SKIP, "raw": PS_POLICY_RAW}


def schema(*, columns=None, body="view", error_policy="raise"):
    """The schema of the batches decoded with these options."""
    return _Options(True, True, 0, columns, body, error_policy,
                    64 << 20, 1 << 30).schema


cdef class _Options:
    """Validated decode options and the matching schema."""
    cdef ps_options o
    cdef readonly object schema

    def __init__(self, crc, amqp, start_offset, columns, body, error_policy,
                 max_subbatch_size, max_chunk_size):
        if body not in ("view", "binary"):
            raise ValueError('body must be "view" or "binary"')
        if error_policy not in POLICIES:
            raise ValueError('error_policy must be "raise", "skip" or "raw"')
        if start_offset < 0:
            raise ValueError("start_offset must be >= 0")
        if not 0 < max_subbatch_size <= max_chunk_size < 2 ** 31:
            raise ValueError("need 0 < max_subbatch_size <= max_chunk_size < 2 GiB")
        names = list(columns or ())
        for name in names:
            if name not in OPTIONAL_COLUMNS:
                raise ValueError(f"unknown column {name!r}; optional columns are "
                                 f"{', '.join(OPTIONAL_COLUMNS)}")
        if names and not amqp:
            raise ValueError("optional columns need amqp=True")
        self.o.crc = bool(crc)
        self.o.amqp = bool(amqp)
        self.o.body_binary = body == "binary"
        self.o.error_policy = POLICIES[error_policy]
        self.o.start_offset = start_offset
        self.o.max_subbatch = max_subbatch_size
        self.o.max_chunk = max_chunk_size
        self.o.columns = 0
        fields = [pa.field("offset", pa.int64(), nullable=False),
                  pa.field("chunk_timestamp", TS, nullable=False),
                  pa.field("body", pa.binary() if self.o.body_binary else pa.binary_view(),
                           nullable=False)]
        for name, (bit, typ) in OPTIONAL_COLUMNS.items():   # fixed order
            if name in names:
                self.o.columns |= bit
                fields.append(pa.field(name, typ))
        if self.o.error_policy == PS_POLICY_RAW:
            fields.append(pa.field("error", pa.string()))
        self.schema = pa.schema(fields)


cdef class _Builder:
    """A C batch with its options; exports what it decoded as a RecordBatch."""
    cdef ps_batch b
    cdef _Options options

    def __cinit__(self, _Options options):
        self.options = options
        if ps_batch_init(&self.b, &options.o) != PS_OK:
            raise MemoryError()

    def __dealloc__(self):
        ps_batch_free(&self.b)

    cdef object export(self, object owner):
        """The RecordBatch of everything decoded since the last export;
        `owner` keeps the input bytes alive."""
        cdef ps_batch *b = &self.b
        cdef size_t rows = b.rows, i
        cdef ps_region *r
        cdef unsigned cols = b.opt.columns
        arrays = [
            pa.Array.from_buffers(pa.int64(), rows, [None, take(&b.offset)]),
            pa.Array.from_buffers(TS, rows, [None, take(&b.timestamp)]),
        ]
        if b.opt.body_binary:
            arrays.append(export_col(&b.body, pa.binary()))
        else:
            regions = []
            for i in range(b.nregions):
                r = &b.regions[i]
                if r.own.p != NULL:
                    regions.append(take(&r.own))
                else:
                    regions.append(pa.foreign_buffer(<uintptr_t>r.base, r.len, base=owner))
            arrays.append(pa.Array.from_buffers(
                pa.binary_view(), rows, [None, take(&b.views)] + regions))
        if cols & PS_COL_PROPERTIES:
            children = [export_col(&b.prop[i], PROPERTIES.field(i).type)
                        for i in range(PS_PROP_FIELDS)]
            arrays.append(export_col(&b.properties, PROPERTIES, children))
        if cols & PS_COL_APPLICATION_PROPERTIES:
            arrays.append(self.export_map(&b.app, &b.app_keys, &b.app_values))
        if cols & PS_COL_MESSAGE_ANNOTATIONS:
            arrays.append(self.export_map(&b.ann, &b.ann_keys, &b.ann_values))
        if cols & PS_COL_HEADER:
            children = [export_col(&b.hdr[i], HEADER.field(i).type)
                        for i in range(PS_HEADER_FIELDS)]
            arrays.append(export_col(&b.header, HEADER, children))
        if b.opt.error_policy == PS_POLICY_RAW:
            arrays.append(export_col(&b.error, pa.string()))
        if ps_batch_reset(b) != PS_OK:
            raise MemoryError()
        return pa.RecordBatch.from_arrays(arrays, schema=self.options.schema)

    cdef object export_map(self, ps_col *m, ps_col *k, ps_col *v):
        keys = export_col(k, pa.string())
        values = export_col(v, pa.string())
        entries = pa.StructArray.from_arrays(
            [keys, values], fields=[STRING_MAP.key_field, STRING_MAP.item_field])
        return export_col(m, STRING_MAP, [entries])

    cdef int fail(self, ps_error *err) except -1:
        """Drop what a failed decode appended, then raise its error."""
        ps_batch_reset(&self.b)
        return raise_error(err)


def decode(buffer, *, crc=True, amqp=True, start_offset=0, columns=None,
           body="view", error_policy="raise", max_subbatch_size=64 << 20,
           max_chunk_size=1 << 30):
    """Decode the size-prefixed Deliver frames in ``buffer`` (any bytes-like)
    into one :class:`pyarrow.RecordBatch`; see the module documentation for
    the schema and the options."""
    cdef _Options opts = _Options(crc, amqp, start_offset, columns, body,
                                  error_policy, max_subbatch_size, max_chunk_size)
    cdef _Builder builder = _Builder(opts)
    cdef ps_error err
    cdef int rc
    view = memoryview(buffer)      # pins the bytes (a bytearray cannot resize)
    if not view.c_contiguous:
        raise ValueError("buffer must be contiguous")
    view = view.cast("B")
    cdef const uint8_t[::1] data = view
    cdef const uint8_t *p = &data[0] if data.shape[0] else NULL
    cdef size_t n = data.shape[0]
    with nogil:
        rc = ps_decode_buffer(p, n, &builder.b, &err)
    if rc != PS_OK:
        builder.fail(&err)
    return builder.export(view)


# --- streaming decoder --------------------------------------------------------

cdef class Chunk:
    """One decoded Deliver frame of a subscription."""
    cdef readonly int subscription_id
    cdef readonly object batch          # pyarrow.RecordBatch
    cdef readonly uint64_t first_offset
    cdef readonly uint32_t num_records  # records in the chunk, dropped ones included
    cdef readonly object committed_chunk_id  # Deliver v2, else None
    cdef readonly int64_t timestamp     # ms since the epoch (broker clock)
    cdef readonly int chunk_type        # 0 user; 1, 2 tracking (no rows)
    cdef readonly uint64_t size         # frame bytes, size prefix included
    cdef readonly int64_t decode_ns     # time spent decoding it (monotonic clock)

    @property
    def next_offset(self):
        """The offset that follows this chunk (records, not entries)."""
        return self.first_offset + self.num_records

    def __repr__(self):
        return (f"Chunk(subscription_id={self.subscription_id}, "
                f"first_offset={self.first_offset}, num_records={self.num_records}, "
                f"rows={self.batch.num_rows}, size={self.size})")


cdef class StreamDecoder(FrameReader):
    """A :class:`FrameReader` that also decodes the Deliver frames of the
    subscriptions registered with :meth:`subscribe`.

    :meth:`next_event` returns the next frame: a :class:`Chunk` for a Deliver
    of a registered subscription, otherwise the frame's bytes (control frames
    and Deliver frames of other subscription ids, untouched), or ``None``
    when no complete frame is buffered.  Columns of body="view" batches point
    into the receive buffer, which stays alive (and out of reuse) while they do.
    """
    cdef dict subs

    def __init__(self, max_frame_size=1048576):
        self.subs = {}

    def subscribe(self, int subscription_id, *, crc=True, amqp=True,
                  start_offset=0, columns=None, body="view",
                  error_policy="raise", max_subbatch_size=64 << 20,
                  max_chunk_size=1 << 30):
        """Decode this subscription's chunks with these options (replacing
        earlier ones).  Safe from any thread, also while another one is in
        :meth:`next_event`: a chunk being decoded keeps the options it
        started with."""
        if not 0 <= subscription_id <= 255:
            raise ValueError("subscription_id is a u8")
        opts = _Options(crc, amqp, start_offset, columns, body, error_policy,
                        max_subbatch_size, max_chunk_size)
        self.subs[subscription_id] = _Builder(opts)

    def unsubscribe(self, int subscription_id):
        """Stop decoding this subscription's chunks (a no-op if unknown)."""
        self.subs.pop(subscription_id, None)

    def next_event(self):
        """The next :class:`Chunk` or control frame (bytes), or ``None``."""
        cdef const uint8_t *frame
        cdef uint32_t n
        cdef ps_error err
        cdef ps_chunk c
        cdef _Builder builder
        cdef int rc
        cdef uint64_t pos
        cdef timespec t0, t1
        self.check_idle()
        rc = ps_reader_next(&self.r, &frame, &n, &err)
        if rc == PS_NEED_MORE:
            return None
        if rc != PS_OK:
            raise_error(&err)
        builder = None
        if n >= 5 and ps_frame_key(frame) == PS_KEY_DELIVER:
            builder = self.subs.get(frame[4])
        if builder is None:
            return PyBytes_FromStringAndSize(<const char *>frame, n)
        pos = self.r.consumed - n
        try:
            if ps_deliver_parse(frame, n, pos, &c, &err) != PS_OK:
                raise_error(&err)
            self.busy = True
            with nogil:
                clock_gettime(CLOCK_MONOTONIC, &t0)
                rc = ps_chunk_decode(&c, &builder.b, &err)
                clock_gettime(CLOCK_MONOTONIC, &t1)
            self.busy = False
            if rc != PS_OK:
                builder.fail(&err)
        except StreamError as exc:
            # The frame is consumed and the reader stays in step: only this
            # subscription's chunk is bad, so say whose it is.
            exc.subscription_id = frame[4]
            raise
        cdef Chunk chunk = Chunk.__new__(Chunk)
        chunk.batch = builder.export(self.block)
        chunk.subscription_id = c.subscription_id
        chunk.first_offset = c.first_offset
        chunk.num_records = c.num_records
        chunk.committed_chunk_id = c.committed_chunk_id if c.version == 2 else None
        chunk.timestamp = c.timestamp
        chunk.chunk_type = c.type
        chunk.size = 4 + <uint64_t>n
        chunk.decode_ns = ((t1.tv_sec - t0.tv_sec) * 1000000000
                           + (t1.tv_nsec - t0.tv_nsec))
        return chunk


# --- Publish frames (the producer) ----------------------------------------------
#
# Arrow arrays are read in place by the C encoder (csrc/encode.c): each is
# described by pointers into its buffers, which the arrays keep alive for the
# call; the GIL is released while the frames are written.

cdef int64_t NO_BYTES[2]       # stands in for absent buffers of empty arrays

cdef const uint8_t *address(buf):
    if buf is None or buf.size == 0:
        return <const uint8_t *>NO_BYTES
    return <const uint8_t *><uintptr_t>buf.address


cdef class _Strs:
    """A column of byte strings as the C encoder reads it."""
    cdef ps_strs s
    cdef const uint8_t **buffers    # views layout: the data buffers
    cdef object array

    def __dealloc__(self):
        free(self.buffers)


cdef object flat(arr):
    """One contiguous Array: chunks combined, dictionaries decoded."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if not isinstance(arr, pa.Array):
        raise TypeError(f"expected a pyarrow Array, got {type(arr).__name__}")
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    arr.validate()
    return arr


cdef _Strs strs_of(arr, str what, bint text):
    """``arr`` (string types, and binary types unless ``text``) for C."""
    cdef _Strs out = _Strs.__new__(_Strs)
    cdef Py_ssize_t i
    if pa.types.is_null(arr.type):      # pa.array([None, ...]): all null
        arr = arr.cast(pa.string())
    t = arr.type
    binary = (pa.types.is_binary(t) or pa.types.is_large_binary(t)
              or pa.types.is_binary_view(t))
    if pa.types.is_string(t) or pa.types.is_binary(t):
        out.s.layout = PS_STRS_OFFSETS32
    elif pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        out.s.layout = PS_STRS_OFFSETS64
    elif pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        out.s.layout = PS_STRS_VIEWS
    else:
        out.s.layout = PS_STRS_ABSENT
    if out.s.layout == PS_STRS_ABSENT or (text and binary):
        kinds = "a string" if text else "a binary or string"
        raise TypeError(f"{what} must be {kinds} array, not {t}")
    out.array = arr
    bufs = arr.buffers()
    out.s.binary = binary
    out.s.validity = address(bufs[0]) if arr.null_count else NULL
    out.s.offset = arr.offset
    out.s.offsets = address(bufs[1])
    if out.s.layout == PS_STRS_VIEWS:
        data = bufs[2:]
        out.buffers = <const uint8_t **>malloc((len(data) + 1) * sizeof(uint8_t *))
        if out.buffers == NULL:
            raise MemoryError()
        for i in range(len(data)):
            out.buffers[i] = address(data[i])
        out.s.buffers = out.buffers
    else:
        out.s.data = address(bufs[2])
    return out


cdef int ints_of(ps_ints *c, arr, int64_t mul, int64_t div) except -1:
    """An int64 array for C (values scaled by mul / div)."""
    bufs = arr.buffers()
    c.values = <const int64_t *>address(bufs[1])
    c.validity = address(bufs[0]) if arr.null_count else NULL
    c.offset = arr.offset
    c.mul = mul
    c.div = div
    return 0


# Timestamp units to AMQP milliseconds: (mul, div).
MS_SCALE = {"s": (1000, 1), "ms": (1, 1), "us": (1, 1000), "ns": (1, 1000000)}
PROPERTY_INDEX = {name: i for i, name in enumerate(PROPERTIES.names)}
TIMESTAMP_FIELDS = (8, 9)
GROUP_SEQUENCE = 11
BINARY_FIELDS = (0, 1, 5)       # message_id, user_id, correlation_id


cdef int props_of(ps_props *pr, arr, Py_ssize_t n, list keep) except -1:
    arr = flat(arr)
    if not pa.types.is_struct(arr.type):
        raise TypeError(f"properties must be a struct array, not {arr.type}")
    if len(arr) != n:
        raise ValueError(f"properties has {len(arr)} rows for {n} bodies")
    pr.present = 1
    pr.validity = address(arr.buffers()[0]) if arr.null_count else NULL
    pr.offset = arr.offset
    cdef _Strs s
    cdef int f
    for j in range(arr.type.num_fields):
        name = arr.type.field(j).name
        if name not in PROPERTY_INDEX:
            raise ValueError(f"unknown properties field {name!r}; fields are "
                             f"{', '.join(PROPERTIES.names)}")
        f = PROPERTY_INDEX[name]
        child = flat(arr.field(j))
        t = child.type
        if f in TIMESTAMP_FIELDS:
            if not pa.types.is_timestamp(t):
                raise TypeError(f"properties.{name} must be a timestamp array, not {t}")
            keep.append(child)
            mul, div = MS_SCALE[t.unit]
            ints_of(&pr.num[f], child, mul, div)
        elif f == GROUP_SEQUENCE:
            if not pa.types.is_integer(t):
                raise TypeError(f"properties.{name} must be an integer array, not {t}")
            child = child.cast(pa.int64())
            keep.append(child)
            ints_of(&pr.num[f], child, 1, 1)
        else:
            s = strs_of(child, f"properties.{name}", f not in BINARY_FIELDS)
            keep.append(s)
            pr.text[f] = s.s
    return 0


cdef int map_of(ps_map *m, arr, str what, Py_ssize_t n, list keep) except -1:
    arr = flat(arr)
    if not pa.types.is_map(arr.type):
        raise TypeError(f"{what} must be a map<string, string> array, not {arr.type}")
    if len(arr) != n:
        raise ValueError(f"{what} has {len(arr)} rows for {n} bodies")
    bufs = arr.buffers()
    m.offsets = <const int32_t *>address(bufs[1])
    m.validity = address(bufs[0]) if arr.null_count else NULL
    m.offset = arr.offset
    # offsets index the entries ignoring the map's own offset (.values);
    # .field() applies the entries' offset
    cdef _Strs keys = strs_of(flat(arr.values.field(0)), f"{what} keys", True)
    cdef _Strs values = strs_of(flat(arr.values.field(1)), f"{what} values", True)
    keep.append(keys)
    keep.append(values)
    m.keys = keys.s
    m.values = values.s
    return 0


cdef class _Codecs:
    """Compression contexts, reused across calls (one call at a time)."""
    cdef ps_codecs *c

    def __cinit__(self):
        self.c = ps_codecs_new()
        if self.c == NULL:
            raise MemoryError()

    def __dealloc__(self):
        ps_codecs_free(self.c)


cdef list free_codecs = []      # list.pop / append are atomic under the GIL

CODECS = {None: -1, "none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def encode_publish(publisher_id, first_publishing_id, bodies, *,
                   properties=None, application_properties=None,
                   message_annotations=None, filter_values=None, amqp=True,
                   compression=None, sub_batch_size=100,
                   max_frame_size=1 << 20):
    """Encode messages into size-prefixed Publish frames, back to back.

    ``bodies``: a pyarrow binary, large_binary, string, large_string,
    binary_view or string_view array (or a list of bytes); nulls are refused.
    With ``amqp`` each becomes an AMQP 1.0 message: message annotations,
    properties, application properties (each only where its row is not null;
    optional columns as in :func:`schema`, ``properties`` with any subset of
    the fields), then the body as one data section; without, the body is sent
    as is.  ``filter_values`` (strings, nulls allowed) makes Publish v2
    frames.  ``compression`` (``"none"``, ``"gzip"``, ``"snappy"``, ``"lz4"``,
    ``"zstd"``; not with filter values) groups up to ``sub_batch_size``
    messages per sub-batch entry (``"none"``: sub-batches left uncompressed;
    ``None``: no sub-batches).  No frame exceeds ``max_frame_size`` bytes,
    its size prefix included (0: only the 4 GiB of the size field).

    Returns ``(frames, entry_counts)``: a pyarrow Buffer holding the frames,
    and an int64 array with the number of messages of each entry, in the
    order of their publishing ids ``first_publishing_id, +1, ...``.
    """
    if not 0 <= publisher_id <= 255:
        raise ValueError("publisher_id is a u8")
    if not 0 <= first_publishing_id < 2 ** 64:
        raise ValueError("first_publishing_id is a u64")
    if compression not in CODECS:
        raise ValueError('compression must be None, "none", "gzip", "snappy", '
                         '"lz4" or "zstd"')
    if compression is not None and filter_values is not None:
        raise ValueError("filter values need Publish v2, which has no sub-batches: "
                         "compression must be None")
    if not 1 <= sub_batch_size <= 65535:
        raise ValueError("sub_batch_size must be in [1, 65535]")
    if not 0 <= max_frame_size < 2 ** 32:
        raise ValueError("max_frame_size must be in [0, 2**32)")
    if not amqp and (properties is not None or application_properties is not None
                     or message_annotations is not None):
        raise ValueError("properties, application_properties and "
                         "message_annotations need amqp=True")
    if isinstance(bodies, (list, tuple)):
        bodies = pa.array(bodies, pa.binary())
    cdef ps_publish pub
    memset(&pub, 0, sizeof(pub))
    cdef list keep = []
    cdef _Strs body = strs_of(flat(bodies), "bodies", False)
    cdef _Strs filters
    cdef Py_ssize_t n = len(body.array)
    pub.publisher_id = publisher_id
    pub.first_id = first_publishing_id
    pub.count = n
    pub.amqp = bool(amqp)
    pub.codec = CODECS[compression]
    pub.sub_batch = sub_batch_size
    pub.max_frame = max_frame_size or 0xFFFFFFFF
    pub.body = body.s
    if filter_values is not None:
        filters = strs_of(flat(filter_values), "filter_values", True)
        if len(filters.array) != n:
            raise ValueError(f"filter_values has {len(filters.array)} rows for {n} bodies")
        keep.append(filters)
        pub.filter = filters.s
    if properties is not None:
        props_of(&pub.properties, properties, n, keep)
    if application_properties is not None:
        map_of(&pub.application_properties, application_properties,
               "application_properties", n, keep)
    if message_annotations is not None:
        map_of(&pub.message_annotations, message_annotations,
               "message_annotations", n, keep)

    cdef _Codecs codecs = free_codecs.pop() if free_codecs else _Codecs()
    cdef ps_buf frames
    cdef ps_buf counts
    cdef ps_error err
    cdef int rc
    memset(&frames, 0, sizeof(frames))
    memset(&counts, 0, sizeof(counts))
    with nogil:
        rc = ps_encode_publish(&pub, codecs.c, &frames, &counts, &err)
    free_codecs.append(codecs)
    if rc != PS_OK:
        free(frames.p)
        free(counts.p)
        what = err.what.decode()
        if rc == PS_E_NOMEM:
            raise MemoryError(what)
        if rc == PS_E_FRAME_TOO_LARGE:
            raise ValueError(f"message {err.position}: {what} ({max_frame_size} "
                             "bytes with its size prefix)")
        raise ValueError(f"message {err.position}: {what}")
    return take(&frames), np.frombuffer(take(&counts), dtype=np.int64)


def murmur3_32(keys, seed=104729):
    """MurmurHash3 x86_32 of each key (a pyarrow string or binary array, or a
    list of str / bytes; str as UTF-8, a null as the empty key): the hash by
    which the stream clients route super stream messages,
    ``(hash & 0x7FFFFFFF) % partitions``.  A numpy uint32 array."""
    if isinstance(keys, (list, tuple)):
        keys = pa.array(keys)
    cdef _Strs s = strs_of(flat(keys), "keys", False)
    cdef size_t n = len(s.array)
    cdef uint32_t c_seed = <uint32_t>(seed & 0xFFFFFFFF)
    out = np.empty(n, dtype=np.uint32)
    cdef uint32_t[::1] view = out
    cdef uint32_t *dst = &view[0] if n else NULL
    with nogil:
        ps_murmur3_32(&s.s, n, c_seed, dst)
    return out
