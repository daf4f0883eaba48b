"""Every error pystream raises, as classes the user can catch.

All derive from :class:`StreamError`. Broker answers carry the protocol's
response code in ``code``; errors found in received bytes carry the byte
``position`` where the decoder stopped.
"""

from __future__ import annotations


class StreamError(Exception):
    """Base class of every pystream error."""

    code: int | None = None
    #: Set when the error concerns one subscription's chunk only (the
    #: connection and the other subscriptions carry on).
    subscription_id: int | None = None

    def __init__(self, message: str = "", *, code: int | None = None,
                 position: int | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.position = position


# --- the connection ---------------------------------------------------------

class ConnectionLost(StreamError):
    """The socket closed, the peer went silent past two heartbeats, or the
    broker stayed away longer than the recovery timeout."""


class SendInterrupted(ConnectionLost):
    """A ``KeyboardInterrupt`` (or another exception raised by a signal
    handler) stopped this thread's send on a connection after part of
    its frames went (or, over TLS, while the TLS layer held part of them;
    a producer's send of a batch: at any point): part of
    a frame may be on the wire, and the next frame must not follow it, so
    the connection ends. A producer sends its unconfirmed batches again from
    a new one (once each with a ``name``), a consumer resubscribes from
    the application's position. Raised to no one: the interrupt itself
    goes on up."""


class ReadInterrupted(ConnectionLost):
    """A ``KeyboardInterrupt`` (or another exception raised by a signal
    handler) stopped this thread's read of a connection halfway: what that
    read took off the socket may be lost, so the connection ends, and the
    consumers on it take back what they queued and resubscribe from the
    application's position. Raised to no one: the interrupt itself goes on
    up."""


class CertificateVerificationError(StreamError):
    """The broker's TLS certificate did not verify (an untrusted CA, or a
    host name it does not list). Reconnecting cannot cure it, so consumers
    and producers do not retry it.

    ``reason`` is OpenSSL's, ``untrusted`` tells a CA problem from a host
    name one, and ``hint`` says what to change, in the Python API's terms;
    :meth:`with_trust_hint` says how to trust the CA in a front end's (a
    CLI flag, a Spark option).
    """

    def __init__(self, where: str = "", reason: str = "", hint: str = "", *,
                 untrusted: bool = True) -> None:
        super().__init__(f"TLS handshake with {where} failed: the broker's "
                         f"certificate did not verify: {reason} ({hint})")
        self.where, self.reason, self.hint = where, reason, hint
        self.untrusted = untrusted

    def __reduce__(self) -> tuple[type[StreamError], tuple[str, str, str], dict[str, object]]:
        return (type(self), (self.where, self.reason, self.hint), self.__dict__)

    def with_trust_hint(self, hint: str) -> CertificateVerificationError:
        """An untrusted CA's failure with ``hint`` as the way to trust it; a
        host name failure as it is (its fix is the same everywhere)."""
        if not self.untrusted:
            return self
        return CertificateVerificationError(self.where, self.reason, hint)


class MissingPassword(StreamError):
    """The password is to be read from an environment variable (or file)
    that is not there where the connection is made, e.g. on a Spark
    executor: logging in without it would be as another user, or fail as a
    wrong password. ``source`` names the variable or file."""

    def __init__(self, message: str = "", *, source: str = "") -> None:
        super().__init__(message)
        self.source = source


class ConnectionClosed(StreamError):
    """The broker closed the connection with a Close command (reason in the
    message, response code in ``code``)."""


class RequestTimeout(StreamError):
    """The broker did not answer a request in time."""


class ConfirmTimeout(RequestTimeout):
    """Messages a producer sent were not confirmed in time (``flush``,
    ``close``): the broker may or may not have stored them. A named
    producer can send them again with their publishing ids and the broker
    drops those it has."""


class SendTimeout(RequestTimeout):
    """A send waited past its ``timeout`` for room in the producer's
    in-flight window (``max_in_flight``): nothing of it was sent."""


class ProducerClosed(ConnectionClosed):
    """The producer was closed: a send after ``close()``, or a message
    that ``close()`` found not yet sent (nothing of it was sent)."""


class UnsupportedFeature(StreamError):
    """The broker is too old for the requested feature; refused before anything
    is sent, so the connection stays usable."""


# --- bytes from the peer ----------------------------------------------------

class ProtocolError(StreamError):
    """The peer sent bytes that break the stream protocol."""


class TruncatedFrame(ProtocolError):
    """A frame ends before the fields its layout requires."""


class FrameTooLarge(ProtocolError):
    """A frame is larger than the negotiated frame_max (also the broker's
    answer, code 14, to a frame of ours that it found too large)."""


class CorruptChunk(StreamError):
    """A chunk fails its checks: magic byte, lengths, CRC-32, codec."""


class DecompressionLimit(CorruptChunk):
    """A compressed sub-batch would decompress past the configured limit, or
    not to its announced size."""


class CodecUnavailable(StreamError):
    """A sub-batch (read or to publish) uses a codec this build of pystream
    lacks: a source build made without that codec's library. The message
    names the codec and the library to install before rebuilding;
    :func:`pystream.build_info` lists what the build has."""


class MalformedMessage(StreamError):
    """An AMQP 1.0 message inside an entry cannot be decoded."""


class DataLoss(StreamError):
    """Records a read asked for were removed by the stream's retention
    before they were read (raised where the reader asks to fail on it)."""


class ExactlyOnceError(StreamError):
    """The Spark sink cannot publish a write exactly once (the message says
    why, e.g. a super stream's partitions changed between a micro-batch's
    first attempt and its replay): it refuses rather than lose or repeat rows."""


class PublishError(StreamError):
    """The broker refused a published message: ``publishing_id`` says which,
    ``code`` why (e.g. 0x12 publisher does not exist, 0x10 access refused)."""

    def __init__(self, message: str, *, publishing_id: int, code: int) -> None:
        super().__init__(message, code=code)
        self.publishing_id = publishing_id


class RoutingError(StreamError, ValueError):
    """A super stream producer cannot route a message of a batch: its
    routing key is null or missing, or ``route`` gave no valid partition
    index for it. ``index`` is the message's position in the batch, and
    nothing of the batch was sent."""

    def __init__(self, message: str, *, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index


class PartitionsFailed(StreamError):
    """An operation on a super stream's partitions failed on some of them
    and may have succeeded on others: ``failed`` maps each failed partition
    to its error, ``succeeded`` each other one to its last publishing id.
    After ``send_batch``, ``publishing_ids`` maps each partition that was
    sent its share to the share's first and last publishing ids, so that a
    named producer can send the batch again with ``resend_ids`` and the
    broker drops what it stored already."""

    def __init__(self, message: str, *,
                 failed: dict[str, BaseException] | None = None,
                 succeeded: dict[str, int] | None = None,
                 publishing_ids: dict[str, tuple[int, int]] | None = None) -> None:
        super().__init__(message)
        self.failed = failed or {}
        self.succeeded = succeeded or {}
        self.publishing_ids = publishing_ids or {}

    def __str__(self) -> str:
        names = ", ".join(f"{p!r} ({type(e).__name__}: {e})"
                          for p, e in self.failed.items())
        done = ", ".join(f"{p!r} (last publishing id {i})"
                         for p, i in self.succeeded.items())
        return (f"{super().__str__()}: failed on {names}"
                + (f"; succeeded on {done}" if done else ""))

    @property
    def resend_ids(self) -> dict[str, int]:
        """The first publishing id of each partition's share: pass it as
        ``send_batch(..., publishing_ids=)`` to send the batch again."""
        return {p: first for p, (first, _) in self.publishing_ids.items()}


# --- broker answers (response codes) ----------------------------------------

class ResponseError(StreamError):
    """The broker answered a request with a response code other than OK."""


class StreamDoesNotExist(ResponseError):
    """The stream (or super stream) does not exist."""
    code = 0x02


class SubscriptionIdAlreadyExists(ResponseError):
    """The connection already has a subscription with this id."""
    code = 0x03


class SubscriptionIdDoesNotExist(ResponseError):
    """The connection has no subscription with this id."""
    code = 0x04


class StreamAlreadyExists(ResponseError):
    """A stream of this name exists already (``exist_ok=True`` tolerates it)."""
    code = 0x05


class StreamNotAvailable(ResponseError):
    """The stream exists but cannot serve now (its leader is moving or down)."""
    code = 0x06


class SaslMechanismNotSupported(ResponseError):
    """The broker does not offer this SASL mechanism (EXTERNAL: TLS only)."""
    code = 0x07


class AuthenticationFailure(ResponseError):
    """The broker refused the user name and password (or certificate)."""
    code = 0x08


class SaslError(ResponseError):
    """The SASL exchange failed."""
    code = 0x09


class AuthenticationFailureLoopback(AuthenticationFailure):
    """The user (e.g. guest) may only connect from localhost."""
    code = 0x0B


class VirtualHostAccessFailure(ResponseError):
    """The user may not use this virtual host, or it does not exist."""
    code = 0x0C


class UnknownFrame(ResponseError):
    """The broker did not know a command the client sent."""
    code = 0x0D


class InternalError(ResponseError):
    """The broker failed internally while answering."""
    code = 0x0F


class AccessRefused(ResponseError):
    """The user lacks the permission the request needs."""
    code = 0x10


class PreconditionFailed(ResponseError):
    """The broker refused the request's arguments (e.g. a stream's settings)."""
    code = 0x11


class PublisherDoesNotExist(ResponseError):
    """The connection has no publisher with this id."""
    code = 0x12


class NoOffset(ResponseError):
    """No offset is stored for this consumer name on this stream."""
    code = 0x13


_BY_CODE: dict[int, type[StreamError]] = {
    cls.code: cls for cls in (
        StreamDoesNotExist, SubscriptionIdAlreadyExists,
        SubscriptionIdDoesNotExist, StreamAlreadyExists, StreamNotAvailable,
        SaslMechanismNotSupported, AuthenticationFailure, SaslError,
        AuthenticationFailureLoopback, VirtualHostAccessFailure, UnknownFrame,
        InternalError, AccessRefused, PreconditionFailed,
        PublisherDoesNotExist, NoOffset,
    )
}
_BY_CODE[0x0E] = FrameTooLarge


def error_for_code(code: int, context: str) -> StreamError:
    """The exception for a broker response code, its message naming what was
    asked (``context``) and the code."""
    cls = _BY_CODE.get(code, ResponseError)
    return cls(f"{context}: {cls.__name__} (response code {code:#04x})",
               code=code)
