"""Framing and the fixed request/response headers.

Every message on a connection is a frame::

    int32  length      big-endian, bytes that follow (never negative)
    bytes  payload

Request payload::

    int16  api_key
    int16  api_version
    int32  correlation_id
    int16  client_id length (-1 = null), then that many UTF-8 bytes
    bytes  body: the API's request struct as MessagePack

Response payload::

    int32  correlation_id
    int16  error_code    0: body is the API's response struct (MessagePack);
                         otherwise the request could not be served at all (unknown
                         API, unsupported version, undecodable body) and the body is
                         an `ErrorBody`
    bytes  body
"""

from __future__ import annotations

import struct
import threading
from typing import NamedTuple

from protocol.errors import DecodeError
from protocol.errors import FrameTooLargeError
from protocol.invariants import invariant

DEFAULT_MAX_FRAME_SIZE = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes

_LENGTH = struct.Struct(">i")
_REQUEST_HEADER = struct.Struct(">hhih")
_RESPONSE_HEADER = struct.Struct(">ih")


class RequestHeader(NamedTuple):
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


class ResponseHeader(NamedTuple):
    correlation_id: int
    error_code: int


def frame(payload: bytes) -> bytes:
    return _LENGTH.pack(len(payload)) + payload


# A frame at least this long is gathered as its received chunks and joined once,
# instead of being appended to the stream buffer and then copied out of it.
LARGE_FRAME_BYTES = 64 * 1024
# What a transport reading into the decoder (`get_buffer`) reads at most at a time
# when no large frame has its own buffer: the scratch buffer, one per thread, reused
# by every connection of the thread's event loop (a read is copied out of it before
# the loop does anything else), so idle connections hold none.
SCRATCH_BYTES = 256 * 1024
# A large frame gets its own buffer, of the length its prefix claims, only once this
# share of it has arrived (gathered as chunks until then): four bytes claiming 100 MiB
# allocate nothing, and a peer makes the decoder allocate at most 8 times what it
# sent. 1 MiB frames earn it with their first read.
READ_INTO_AFTER = 1 / 8
# ... and only up to this length: a larger frame is always gathered as it arrives, so
# what a peer makes the decoder hold stays what it sent. Without the cap, 12.5 MiB of a
# frame claiming 100 MiB would make the process zero-fill 100 MiB. Produce requests
# and fetch answers (1 MiB batches, fetch.max.bytes of a few MiB) stay under it.
READ_INTO_MAX_BYTES = 8 * 1024 * 1024
_scratch = threading.local()


def read_scratch() -> memoryview:
    """This thread's scratch buffer: where a transport reads what has no buffer of its
    own (small frames, TLS records); its bytes are valid until the next read."""
    view: memoryview | None = getattr(_scratch, "view", None)
    if view is None:
        view = _scratch.view = memoryview(bytearray(SCRATCH_BYTES))
    return view


class FrameDecoder:
    """Splits a byte stream into frame payloads. Bounded: a frame longer than
    `max_frame_size` raises FrameTooLargeError before any of it is buffered.

    Two ways in. `feed` (asyncio.Protocol's data_received, TLS's plaintext): a payload
    is `bytes`; a frame of LARGE_FRAME_BYTES or more is gathered as the list of
    received chunks (kept as they are, not copied) and joined once when complete.
    `get_buffer` / `buffer_updated` (asyncio.BufferedProtocol): the transport reads
    into the decoder's memory, one reused scratch buffer, until READ_INTO_AFTER of a
    large frame (up to READ_INTO_MAX_BYTES; a larger one is gathered as with `feed`)
    has arrived; the rest of that frame is read straight into its own
    bytearray (what arrived before is copied there once), which is the payload handed
    out: no join. A decoder is used one way or the other; `get_buffer` and the
    `buffer_updated` after it run on one thread (an event loop's callback)."""

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self.max_frame_size = max_frame_size
        self._buf = bytearray()
        self._pos = 0
        self._large: list[bytes] = []  # chunks of the large frame being gathered
        self._large_size = 0  # its payload length, 0 when none is being gathered
        self._large_have = 0
        # Read-into mode (get_buffer): the large frame's payload, read in place.
        self._into: bytearray | None = None
        self._into_view: memoryview | None = None

    def get_buffer(self) -> memoryview:
        """Where the transport reads next: the rest of the large frame under way
        (never past its end) once it has its own buffer, else the scratch buffer."""
        if self._into_view is not None:
            return self._into_view[self._large_have :]
        return read_scratch()

    def buffer_updated(self, nbytes: int) -> None:
        """The transport read `nbytes` into the last `get_buffer()`."""
        if self._into_view is not None:
            self._large_have += nbytes
            invariant(self._large_have <= self._large_size, "read past the frame's end")
            return
        self.feed(read_scratch()[:nbytes])  # copied: the scratch buffer is reused
        size = self._large_size
        if (
            size
            and size <= READ_INTO_MAX_BYTES
            and size * READ_INTO_AFTER <= self._large_have < size
        ):
            self._read_rest_into_own_buffer()

    def _read_rest_into_own_buffer(self) -> None:
        """The large frame under way has earned its own buffer: what arrived is copied
        there once, the rest will be read into it."""
        into = bytearray(self._large_size)
        view = memoryview(into)
        at = 0
        for chunk in self._large:
            view[at : at + len(chunk)] = chunk
            at += len(chunk)
        invariant(at == self._large_have, "the gathered chunks are what arrived")
        self._large = []
        self._into, self._into_view = into, view

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._large_size:
            take = min(len(data), self._large_size - self._large_have)
            if take == len(data):
                # Kept by reference: a caller's reusable buffer must be copied first.
                self._large.append(data if isinstance(data, bytes) else bytes(data))
            else:
                with memoryview(data) as view:
                    self._large.append(bytes(view[:take]))
                    self._buf += view[take:]  # the next frames; _buf was emptied
            self._large_have += take
            return
        self._buf += data
        # Chunks fed one after another without a next_frame between them (TLS hands
        # over a 16 KiB record at a time) are gathered by reference from the first
        # one that shows a large frame's length, not appended to the buffer.
        self._gather_if_large()

    def feed_chunks(self, chunks: list[bytes]) -> None:
        """`feed` each of `chunks` (kept by reference), but the chunks that go to a
        large frame being gathered in one step, not a Python call each: TLS hands over
        a chunk per record, 64 to a 1 MiB frame."""
        for i, chunk in enumerate(chunks):
            if self._large_size:
                rest = chunks[i:]
                size = sum(map(len, rest))
                if self._large_have + size <= self._large_size:
                    self._large += rest
                    self._large_have += size
                    return
                for later in rest:  # this frame ends among them
                    self.feed(later)
                return
            self.feed(chunk)

    @property
    def buffered(self) -> int:
        """Bytes received and not yet handed out as frames (a large frame's length
        prefix included: it was consumed from the buffer, not handed out)."""
        large = self._large_have + 4 if self._large_size else 0
        return len(self._buf) - self._pos + large

    def next_frame(self) -> bytes | bytearray | None:
        if self._large_size:
            if self._large_have < self._large_size:
                return None
            into = self._into
            if into is not None:
                assert self._into_view is not None
                self._into_view.release()
                self._into = self._into_view = None
                self._large_size = self._large_have = 0
                return into
            payload = b"".join(self._large)
            self._large = []
            self._large_size = self._large_have = 0
            return payload
        buf = self._buf
        pos = self._pos
        if len(buf) - pos < 4:
            self._compact()
            return None
        (length,) = _LENGTH.unpack_from(buf, pos)
        if length < 0:
            raise DecodeError(f"negative frame length {length}")
        if length > self.max_frame_size:
            raise FrameTooLargeError(
                f"frame of {length} bytes exceeds the limit of {self.max_frame_size} bytes"
            )
        end = pos + 4 + length
        if len(buf) < end:
            if not self._gather_if_large():
                self._compact()
            return None
        with memoryview(buf) as view:
            payload = bytes(view[pos + 4 : end])  # one copy (slicing a bytearray is two)
        self._pos = end
        return payload

    def _gather_if_large(self) -> bool:
        """If the next frame is a valid large one not yet whole, gather it as chunks
        from now on, starting with what has arrived (next_frame reports a bad length)."""
        buf = self._buf
        pos = self._pos
        if self._large_size or len(buf) - pos < 4:
            return False
        (length,) = _LENGTH.unpack_from(buf, pos)
        if not LARGE_FRAME_BYTES <= length <= self.max_frame_size or len(buf) - pos - 4 >= length:
            return False
        with memoryview(buf) as view:
            self._large = [bytes(view[pos + 4 :])]
        self._large_size = length
        self._large_have = len(buf) - pos - 4
        buf.clear()
        self._pos = 0
        return True

    def _compact(self) -> None:
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0


def encode_request_header(header: RequestHeader) -> bytes:
    if header.client_id is None:
        return _REQUEST_HEADER.pack(header.api_key, header.api_version, header.correlation_id, -1)
    client_id = header.client_id.encode()
    if len(client_id) > 0x7FFF:
        raise ValueError(f"client_id is {len(client_id)} bytes; the header allows 32767")
    return (
        _REQUEST_HEADER.pack(
            header.api_key, header.api_version, header.correlation_id, len(client_id)
        )
        + client_id
    )


def decode_request_header(payload: bytes) -> tuple[RequestHeader, memoryview]:
    """Return the header and the body that follows it."""
    if len(payload) < _REQUEST_HEADER.size:
        raise DecodeError(f"request of {len(payload)} bytes is shorter than its header")
    api_key, api_version, correlation_id, client_len = _REQUEST_HEADER.unpack_from(payload)
    pos = _REQUEST_HEADER.size
    client_id: str | None = None
    if client_len >= 0:
        end = pos + client_len
        if end > len(payload):
            raise DecodeError("client_id runs past the end of the request")
        try:
            client_id = payload[pos:end].decode()
        except UnicodeDecodeError as exc:
            raise DecodeError("client_id is not UTF-8") from exc
        pos = end
    elif client_len != -1:
        raise DecodeError(f"bad client_id length {client_len}")
    return RequestHeader(api_key, api_version, correlation_id, client_id), memoryview(payload)[pos:]


def encode_response_header(header: ResponseHeader) -> bytes:
    return _RESPONSE_HEADER.pack(header.correlation_id, header.error_code)


def decode_response_header(payload: bytes) -> tuple[ResponseHeader, memoryview]:
    if len(payload) < _RESPONSE_HEADER.size:
        raise DecodeError(f"response of {len(payload)} bytes is shorter than its header")
    correlation_id, error_code = _RESPONSE_HEADER.unpack_from(payload)
    return ResponseHeader(correlation_id, error_code), memoryview(payload)[_RESPONSE_HEADER.size :]
