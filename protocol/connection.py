"""Sans-I/O connection state machines, in the manner of h11.

Bytes go in with `receive_data`, typed events come out; bytes to send come back
from `send_*`. No sockets and no event loop: the asyncio glue in each process is a
few lines around these classes.

A server connection answers in request order even when handlers finish out of
order (Kafka's rule): finished responses wait in a bounded reorder buffer until
every earlier one is out.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import NamedTuple
from typing import Protocol

import msgspec

from protocol.errors import DecodeError
from protocol.errors import ErrorCode
from protocol.framing import DEFAULT_MAX_FRAME_SIZE
from protocol.framing import FrameDecoder
from protocol.framing import RequestHeader
from protocol.framing import ResponseHeader
from protocol.framing import decode_request_header
from protocol.framing import decode_response_header
from protocol.framing import encode_request_header
from protocol.framing import encode_response_header
from protocol.messages import API_BY_REQUEST_TYPE
from protocol.messages import API_SPECS
from protocol.messages import ErrorBody
from protocol.messages import FetchResponse
from protocol.messages import Message
from protocol.messages import ProduceRequest

_encoder = msgspec.msgpack.Encoder()
_decoders: dict[type, msgspec.msgpack.Decoder] = {}


def encode_body(body: Message) -> bytes:
    return _encoder.encode(body)


def decode_body(kind: type[Message], data: bytes | memoryview) -> Message:
    """Decode a MessagePack body as `kind`; any failure is a DecodeError."""
    decoder = _decoders.get(kind)
    if decoder is None:
        decoder = _decoders[kind] = msgspec.msgpack.Decoder(kind)
    try:
        return decoder.decode(data)
    # msgspec raises UnicodeDecodeError for a str that is not UTF-8 and RecursionError
    # for deeply nested input (even inside an ignored unknown field): both are bad bytes.
    except (
        msgspec.DecodeError,
        msgspec.ValidationError,
        UnicodeDecodeError,
        RecursionError,
    ) as exc:
        raise DecodeError(f"cannot decode {kind.__name__}: {exc}") from exc


# ------------------------------------------------------------------ scatter-gather

Buffer = bytes | bytearray | memoryview

# A record set smaller than this is copied into the MessagePack body as usual: one
# more list item costs more than copying a few KiB.
SCATTER_MIN_BYTES = 16 * 1024

# Stands in for a record set while the rest of the body is encoded; random per
# process, then a 4-byte index, so it cannot match anything a peer sent us.
_MARKER_PREFIX = os.urandom(12)
_MARKER_BIN = b"\xc4\x10"  # MessagePack bin 8 of 16 bytes: how a marker is encoded
_BIN8 = struct.Struct(">BB")
_BIN16 = struct.Struct(">BH")
_BIN32 = struct.Struct(">BI")
_FRAME_LENGTH = struct.Struct(">i")


def _bin_header(length: int) -> bytes:
    """The MessagePack bin header msgspec writes for `length` bytes (the smallest)."""
    if length < 0x100:
        return _BIN8.pack(0xC4, length)
    if length < 0x10000:
        return _BIN16.pack(0xC5, length)
    return _BIN32.pack(0xC6, length)


def _record_carriers(body: Message) -> list[msgspec.Struct]:
    """The structs whose `records` field holds a big record set."""
    if isinstance(body, FetchResponse):
        return [
            p
            for topic in body.responses
            for p in topic.partitions
            if len(p.records) >= SCATTER_MIN_BYTES
        ]
    if isinstance(body, ProduceRequest):
        return [
            p
            for topic in body.topics
            for p in topic.partitions
            if len(p.records) >= SCATTER_MIN_BYTES
        ]
    return []


def encode_frame_parts(head: bytes, body: Message) -> list[Buffer]:
    """The frame of `head` (a request or response header) and `body` as a list of
    buffers whose concatenation is exactly `frame(head + encode_body(body))`.

    Record sets of SCATTER_MIN_BYTES or more are not copied: each goes out as the very
    object the body holds (a file slice on a fetch, a built batch on a produce), between
    the MessagePack bytes around it, for `transport.writelines`. The body is encoded
    once with a 16-byte marker in place of each record set, then cut at the markers."""
    carriers = _record_carriers(body)
    if not carriers:
        encoded = encode_body(body)
        return [_FRAME_LENGTH.pack(len(head) + len(encoded)) + head + encoded]
    records: list[Buffer] = []
    try:
        for i, carrier in enumerate(carriers):
            records.append(carrier.records)  # type: ignore[attr-defined]
            carrier.records = _MARKER_PREFIX + i.to_bytes(4, "big")  # type: ignore[attr-defined]
        encoded = encode_body(body)
    finally:
        for carrier, data in zip(carriers, records, strict=False):
            carrier.records = data  # type: ignore[attr-defined]
    parts: list[Buffer] = []
    total = len(head)
    start = 0
    pending = head
    for i, data in enumerate(records):
        marker = _MARKER_BIN + _MARKER_PREFIX + i.to_bytes(4, "big")
        at = encoded.find(marker, start)
        assert at >= 0, "record set marker missing from the encoded body"
        piece = pending + encoded[start:at] + _bin_header(len(data))
        parts.append(piece)
        parts.append(data)
        total += len(piece) - len(pending) + len(data)
        pending = b""
        start = at + len(marker)
    tail = encoded[start:]
    parts.append(tail)
    total += len(tail)
    parts[0] = _FRAME_LENGTH.pack(total) + parts[0]
    return parts


def _error_response(correlation_id: int, error: ErrorCode, message: str) -> list[Buffer]:
    return encode_frame_parts(
        encode_response_header(ResponseHeader(correlation_id, int(error))),
        ErrorBody(error_message=message),
    )


# ------------------------------------------------------------------ wire codecs


class DecodedRequest(NamedTuple):
    header: RequestHeader
    body: Message


class Refusal(NamedTuple):
    """A request whose frame was sound but which cannot be served: unknown or unserved
    API, unsupported version, undecodable body."""

    header: RequestHeader
    error: ErrorCode
    message: str


Serves = Callable[[int], bool]


class WireCodec(Protocol):
    """How one wire protocol turns a request frame's payload into a native request and
    a native response into frame buffers: the native protocol (NATIVE below) and
    Apache Kafka's (protocol/kafka/codec.py). ServerConnection does the rest (order,
    bounds, clocks) the same for both."""

    name: str

    def decode_request(self, payload: bytes, serves: Serves | None) -> DecodedRequest | Refusal:
        """Raises DecodeError when the stream cannot go on (close the connection)."""
        ...

    def encode_response(self, header: RequestHeader, body: Message) -> list[Buffer]: ...

    def encode_error(
        self, header: RequestHeader, error: ErrorCode, message: str, serves: Serves | None
    ) -> list[Buffer] | None:
        """The answer to a request that failed as a whole, or None when the protocol
        has no way to say it (the connection is closed instead)."""
        ...

    def raw_sasl_tokens_after(self, header: RequestHeader) -> bool:
        """Whether a successful SASL handshake sent with `header` makes the client send
        its SASL tokens as raw frames next (Kafka's SaslHandshake v0, KIP-43)."""
        ...


class NativeCodec:
    """minibroker's own protocol: the header of protocol/framing.py, MessagePack bodies,
    whole-request errors in the response header with an ErrorBody."""

    name = "native"

    def decode_request(self, payload: bytes, serves: Serves | None) -> DecodedRequest | Refusal:
        header, body_bytes = decode_request_header(payload)
        spec = API_SPECS.get(header.api_key)
        if spec is None or (serves is not None and not serves(header.api_key)):
            return Refusal(
                header, ErrorCode.INVALID_REQUEST, f"unknown or unserved API key {header.api_key}"
            )
        if not spec.min_version <= header.api_version <= spec.max_version:
            return Refusal(
                header,
                ErrorCode.UNSUPPORTED_VERSION,
                f"{spec.key.name} version {header.api_version} is not supported "
                f"(supported: {spec.min_version}..{spec.max_version}); ask ApiVersions",
            )
        try:
            return DecodedRequest(header, decode_body(spec.request, body_bytes))
        except DecodeError as exc:
            return Refusal(header, ErrorCode.INVALID_REQUEST, str(exc))

    def encode_response(self, header: RequestHeader, body: Message) -> list[Buffer]:
        head = encode_response_header(ResponseHeader(header.correlation_id, 0))
        return encode_frame_parts(head, body)

    def encode_error(
        self, header: RequestHeader, error: ErrorCode, message: str, serves: Serves | None
    ) -> list[Buffer]:
        return _error_response(header.correlation_id, error, message)

    def raw_sasl_tokens_after(self, header: RequestHeader) -> bool:
        return False  # the native protocol's tokens always travel in SaslAuthenticate


NATIVE = NativeCodec()


# ------------------------------------------------------------------ server side


class Request(NamedTuple):
    """A decoded request; `seq` orders its response on this connection."""

    seq: int
    header: RequestHeader
    body: Message


class RejectedRequest(NamedTuple):
    """A request whose frame was sound but which cannot be served (unknown API,
    unsupported version, undecodable body). Nothing is sent for it until it is passed
    to `send_rejection`, and responses to later requests wait behind it until then."""

    seq: int
    header: RequestHeader
    error: ErrorCode
    message: str


class SaslToken(NamedTuple):
    """A raw SASL token frame: after Kafka's SaslHandshake v0 (KIP-43) the client sends
    its tokens as bare length-prefixed frames, no request header, until the exchange
    ends (`ServerConnection.raw_sasl_tokens`). Answered with `send_sasl_token_parts`, in
    request order like any request."""

    seq: int
    token: bytes


class CloseReason(NamedTuple):
    """Why a server closes (or refuses) a connection. `kind` groups the log lines of
    one cause (connection_limits.LogThrottle)."""

    kind: str
    message: str


# CloseReason kinds of ServerConnection.expired
FRAME_TIMEOUT = "request-frame-timeout"
FIRST_REQUEST_TIMEOUT = "first-request-timeout"
IDLE = "connections-max-idle"


class ServerConnection:
    """One client connection, server side.

    Bounds (each optional, so the class also serves tests and fakes bare):
    - `max_in_flight` requests handed out and not yet answered;
    - `max_pending_bytes`: the bytes this connection makes the server hold: the frames
      of the requests being served, what `response_reservation` reserves for each
      (a Fetch: the most record data it may return) until its response is built,
      finished responses waiting behind an earlier one, and (given by the caller as
      `unsent`) what the transport has not sent yet. A request that does not fit
      waits, undecoded work stays in the socket, until responses go out; one request
      may always run when nothing else is held, however large, so nothing deadlocks.
      Worst case per connection: max(max_pending_bytes, unsent + one request's
      reservation) plus what one response exceeds its reservation by;
    - clocks, when the caller passes `now` (seconds, any monotonic clock):
      `frame_timeout_s` from the first byte of a frame to its last (not counted
      while the caller has paused reading), `first_request_timeout_s` from
      connecting to the first whole request, `idle_timeout_s` without a byte
      received, a byte of our answers taken by the peer, or a request in service.
      `expired(now)` says which has passed."""

    def __init__(
        self,
        *,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        max_in_flight: int = 1000,
        api_filter: Callable[[int], bool] | None = None,
        max_pending_bytes: int | None = None,
        response_reservation: Callable[[Message], int] | None = None,
        idle_timeout_s: float | None = None,
        frame_timeout_s: float | None = None,
        first_request_timeout_s: float | None = None,
        now: float = 0.0,
        codec: WireCodec = NATIVE,
    ) -> None:
        self._codec = codec
        self._frames = FrameDecoder(max_frame_size)
        self._next_seq = 0
        self._next_out = 0
        self._done: dict[int, tuple[list[Buffer], int]] = {}  # seq -> (parts, bytes)
        self.max_in_flight = max_in_flight
        # A process may serve only some APIs (a controller does not serve Produce).
        self._api_filter = api_filter
        self.max_pending_bytes = max_pending_bytes
        self._reservation = response_reservation
        self._reserved: dict[int, int] = {}  # seq -> bytes held while it is served
        self._reserved_bytes = 0
        self._held_bytes = 0  # finished responses waiting behind an earlier one
        self._waiting: tuple[Request | SaslToken, int] | None = None  # decoded; no room yet
        # Set by the server after a SaslHandshake v0 until the SASL exchange ends: each
        # frame is then a raw SASL token, bounded as every frame (max_frame_size).
        self.raw_sasl_tokens = False
        self.idle_timeout_s = idle_timeout_s
        self.frame_timeout_s = frame_timeout_s
        self.first_request_timeout_s = first_request_timeout_s
        self._opened_at = now
        self._last_receive = now
        self._last_activity = now
        self._frame_started: float | None = None  # first byte of an unfinished frame
        self._reading_paused = False
        self._last_unsent = 0

    @property
    def max_frame_size(self) -> int:
        """The longest frame this connection takes now; the server may lower it for a
        while (a SASL listener, until the peer has authenticated)."""
        return self._frames.max_frame_size

    @max_frame_size.setter
    def max_frame_size(self, value: int) -> None:
        self._frames.max_frame_size = value

    @property
    def in_flight(self) -> int:
        """Requests handed out whose responses have not been written yet."""
        return self._next_seq - self._next_out

    @property
    def pending_bytes(self) -> int:
        """Bytes held for requests in service and responses not yet released."""
        return self._reserved_bytes + self._held_bytes

    @property
    def blocked(self) -> bool:
        """True when no request can start now (in-flight or pending-bytes bound):
        stop reading until a response goes out."""
        return self._waiting is not None or self.in_flight >= self.max_in_flight

    def receive_data(self, data: bytes, now: float | None = None) -> None:
        self._frames.feed(data)
        if data:
            self._received(now)

    def receive_chunks(self, chunks: list[bytes], now: float | None = None) -> None:
        """`receive_data` of several chunks, kept as they are (TLS's decrypted records)."""
        self._frames.feed_chunks(chunks)
        if chunks:
            self._received(now)

    def receive_buffer(self) -> memoryview:
        """Where to read the next bytes (asyncio.BufferedProtocol.get_buffer): a large
        request is read straight into its own buffer (FrameDecoder)."""
        return self._frames.get_buffer()

    def received_into(self, nbytes: int, now: float | None = None) -> None:
        """`nbytes` were read into the last `receive_buffer()`."""
        self._frames.buffer_updated(nbytes)
        if nbytes:
            self._received(now)

    def _received(self, now: float | None) -> None:
        if now is not None:
            self._last_receive = self._last_activity = now
            if self._frame_started is None:
                self._frame_started = now

    def next_event(self, unsent: int = 0) -> Request | RejectedRequest | SaslToken | None:
        """The next request, or None when more bytes are needed or no request can
        start (`blocked`: the caller stops reading until responses go out). `unsent`:
        bytes of earlier responses the transport still holds.

        Raises DecodeError when the stream is malformed: close the connection."""
        waiting = self._waiting
        if waiting is None:
            if self.in_flight >= self.max_in_flight:
                return None
            payload = self._frames.next_frame()
            if payload is None:
                return None
            # What is left is the start of the next frame; it came with the last bytes.
            self._frame_started = self._last_receive if self._frames.buffered else None
            event = self._decode(payload)
            if isinstance(event, RejectedRequest):
                return event
            cost = len(payload)
            if self._reservation is not None and isinstance(event, Request):
                cost += max(0, self._reservation(event.body))
            waiting = (event, cost)
        request, cost = waiting
        if not self._has_room(cost, unsent):
            self._waiting = waiting
            return None
        self._waiting = None
        self._reserved[request.seq] = cost
        self._reserved_bytes += cost
        return request

    def _has_room(self, cost: int, unsent: int) -> bool:
        if self.max_pending_bytes is None or not (self._reserved or self._done):
            return True  # one request may always run alone
        return self.pending_bytes + unsent + cost <= self.max_pending_bytes

    def _decode(self, payload: bytes) -> Request | RejectedRequest | SaslToken:
        seq = self._next_seq
        if self.raw_sasl_tokens:
            self._next_seq += 1
            return SaslToken(seq, bytes(payload))
        decoded = self._codec.decode_request(payload, self._api_filter)
        self._next_seq += 1
        if isinstance(decoded, Refusal):
            return RejectedRequest(seq, decoded.header, decoded.error, decoded.message)
        return Request(seq, decoded.header, decoded.body)

    # ------------------------------------------------------------ clocks

    def pause_clock(self) -> None:
        """The caller stopped reading: a frame cannot progress, so it is not timed."""
        self._reading_paused = True

    def resume_clock(self, now: float) -> None:
        """Reading again: an unfinished frame gets a whole frame timeout from now."""
        if self._reading_paused:
            self._reading_paused = False
            if self._frame_started is not None:
                self._frame_started = now

    def expired(self, now: float, unsent: int = 0) -> CloseReason | None:
        """Whether a deadline has passed (close the connection then). `unsent`: bytes
        the transport holds; a drop since the last call is the peer reading."""
        if unsent < self._last_unsent or self._reserved:
            self._last_activity = now
        self._last_unsent = unsent
        started = self._frame_started
        timeout = self.frame_timeout_s
        if (
            timeout is not None
            and started is not None
            and not self._reading_paused
            and now - started >= timeout
        ):
            return CloseReason(
                FRAME_TIMEOUT,
                f"a request frame is still incomplete {now - started:.1f}s after its "
                f"first byte ({self._frames.buffered} bytes received; "
                f"--request-frame-timeout-ms {timeout * 1000:.0f})",
            )
        timeout = self.first_request_timeout_s
        if timeout is not None and self._next_seq == 0 and now - self._opened_at >= timeout:
            return CloseReason(
                FIRST_REQUEST_TIMEOUT,
                f"no request within {timeout * 1000:.0f} ms of connecting "
                f"(--first-request-timeout-ms)",
            )
        timeout = self.idle_timeout_s
        if timeout is not None and now - self._last_activity >= timeout:
            return CloseReason(
                IDLE,
                f"idle for {now - self._last_activity:.1f}s: nothing received, nothing of "
                f"our answers taken, no request in service (--connections-max-idle-ms "
                f"{timeout * 1000:.0f})",
            )
        return None

    # ------------------------------------------------------------ responses

    def send_response(self, request: Request, body: Message) -> bytes:
        """Queue the response; return the bytes now ready to write, in request order."""
        return b"".join(self.send_response_parts(request, body))

    def send_response_parts(self, request: Request, body: Message) -> list[Buffer]:
        """As `send_response`, as buffers for `transport.writelines`: record sets are
        passed through uncopied (see `encode_frame_parts`)."""
        return self._complete(request.seq, self._codec.encode_response(request.header, body))

    def send_sasl_token_parts(self, event: SaslToken, token: bytes) -> list[Buffer]:
        """The server's raw SASL token answering `event`: a length prefix and the token
        (KIP-43's framing), in request order."""
        return self._complete(event.seq, [_FRAME_LENGTH.pack(len(token)) + token])

    def send_rejection(self, rejected: RejectedRequest) -> bytes:
        return b"".join(self.send_rejection_parts(rejected))

    def send_rejection_parts(self, rejected: RejectedRequest) -> list[Buffer]:
        """The rejection's answer, in request order. Raises DecodeError when the wire
        protocol cannot answer it (Kafka's, but for ApiVersions): close the connection."""
        return self.send_error_parts(rejected, rejected.error, rejected.message)

    def send_error(self, request: Request, error: ErrorCode, message: str) -> bytes:
        """A whole-request failure (a handler crashed): the client gets `error`."""
        return b"".join(self.send_error_parts(request, error, message))

    def send_error_parts(
        self, request: Request | RejectedRequest, error: ErrorCode, message: str
    ) -> list[Buffer]:
        """As `send_rejection_parts`, for a request that failed in service."""
        out = self._codec.encode_error(request.header, error, message, self._api_filter)
        if out is None:
            raise DecodeError(
                f"{error.name} for api {request.header.api_key} v{request.header.api_version}"
                f" cannot be answered on the {self._codec.name} protocol: {message}"
            )
        return self._complete(request.seq, out)

    def _complete(self, seq: int, parts: list[Buffer]) -> list[Buffer]:
        if not self._next_out <= seq < self._next_seq or seq in self._done:
            raise ValueError(f"response for request {seq}: unknown or already answered")
        self._reserved_bytes -= self._reserved.pop(seq, 0)
        if seq != self._next_out:
            size = sum(len(part) for part in parts)
            self._done[seq] = (parts, size)
            self._held_bytes += size
            return []
        ready = parts
        self._next_out += 1
        while self._next_out in self._done:
            more, size = self._done.pop(self._next_out)
            self._held_bytes -= size
            ready += more
            self._next_out += 1
        return ready


# ------------------------------------------------------------------ client side


class Response(NamedTuple):
    correlation_id: int
    body: Message | None  # None when error_code != 0
    error_code: ErrorCode
    error_message: str


class ClientConnection:
    """One connection, client side: correlation ids and response decoding."""

    def __init__(
        self, client_id: str | None = "minibroker", *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    ) -> None:
        self.client_id = client_id
        self._frames = FrameDecoder(max_frame_size)
        self._next_correlation_id = 0
        self._pending: dict[int, type[Message]] = {}

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def send_request(self, body: Message, *, api_version: int | None = None) -> tuple[int, bytes]:
        """Return (correlation id, bytes to write)."""
        correlation_id, parts = self.send_request_parts(body, api_version=api_version)
        return correlation_id, b"".join(parts)

    def send_request_parts(
        self, body: Message, *, api_version: int | None = None
    ) -> tuple[int, list[Buffer]]:
        """As `send_request`, as buffers for `transport.writelines`: a Produce's record
        sets are passed through uncopied (see `encode_frame_parts`)."""
        spec = API_BY_REQUEST_TYPE[type(body)]
        correlation_id = self._next_correlation_id
        self._next_correlation_id = (correlation_id + 1) & 0x7FFFFFFF
        header = RequestHeader(
            int(spec.key),
            spec.max_version if api_version is None else api_version,
            correlation_id,
            self.client_id,
        )
        self._pending[correlation_id] = spec.response
        return correlation_id, encode_frame_parts(encode_request_header(header), body)

    def receive_data(self, data: bytes) -> list[Response]:
        """Feed bytes; return every complete response. Raises DecodeError when the
        server sent something that is not a response to a pending request."""
        self._frames.feed(data)
        return self._responses()

    def receive_buffer(self) -> memoryview:
        """Where to read the next bytes (asyncio.BufferedProtocol.get_buffer): a large
        response is read straight into its own buffer (FrameDecoder)."""
        return self._frames.get_buffer()

    def received_into(self, nbytes: int) -> list[Response]:
        """`receive_data` of the `nbytes` read into the last `receive_buffer()`."""
        self._frames.buffer_updated(nbytes)
        return self._responses()

    def _responses(self) -> list[Response]:
        out: list[Response] = []
        while (payload := self._frames.next_frame()) is not None:
            header, body_bytes = decode_response_header(payload)
            kind = self._pending.pop(header.correlation_id, None)
            if kind is None:
                raise DecodeError(f"response for unknown correlation id {header.correlation_id}")
            try:
                error = ErrorCode(header.error_code)
            except ValueError:
                error = ErrorCode.UNKNOWN_SERVER_ERROR
            if error != ErrorCode.NONE:
                err = decode_body(ErrorBody, body_bytes)
                assert isinstance(err, ErrorBody)
                out.append(Response(header.correlation_id, None, error, err.error_message))
            else:
                out.append(
                    Response(header.correlation_id, decode_body(kind, body_bytes), error, "")
                )
        return out
