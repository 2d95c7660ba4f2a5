"""Framing, headers and the connection state machines, in the manner of h11's
tests: bytes in, events out, bytes back, with no sockets."""

from __future__ import annotations

import itertools
import struct
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from protocol.api import ApiKey
from protocol.connection import ClientConnection
from protocol.connection import RejectedRequest
from protocol.connection import Request
from protocol.connection import Response
from protocol.connection import ServerConnection
from protocol.connection import decode_body
from protocol.connection import encode_body
from protocol.errors import DecodeError
from protocol.errors import ErrorCode
from protocol.errors import FrameTooLargeError
from protocol.framing import DEFAULT_MAX_FRAME_SIZE
from protocol.framing import LARGE_FRAME_BYTES
from protocol.framing import READ_INTO_MAX_BYTES
from protocol.framing import SCRATCH_BYTES
from protocol.framing import FrameDecoder
from protocol.framing import RequestHeader
from protocol.framing import ResponseHeader
from protocol.framing import decode_request_header
from protocol.framing import decode_response_header
from protocol.framing import encode_request_header
from protocol.framing import encode_response_header
from protocol.framing import frame
from protocol.messages import API_SPECS
from protocol.messages import ApiVersionsRequest
from protocol.messages import ApiVersionsResponse
from protocol.messages import ErrorBody
from protocol.messages import MetadataRequest
from protocol.messages import MetadataResponse
from protocol.messages import ProducePartition
from protocol.messages import ProduceRequest
from protocol.messages import ProduceResponse
from protocol.messages import ProduceTopic

PINGS = [MetadataRequest(topics=[f"t{i}"]) for i in range(5)]


def raw_request(api_key: int, api_version: int, correlation_id: int, body: bytes) -> bytes:
    return frame(
        encode_request_header(RequestHeader(api_key, api_version, correlation_id, "raw")) + body
    )


def pipe(client: ClientConnection, server: ServerConnection, bodies) -> list[Request]:
    """Send every body from client to server in one chunk; return the server's events."""
    server.receive_data(b"".join(client.send_request(b)[1] for b in bodies))
    events = []
    while (event := server.next_event()) is not None:
        events.append(event)
    return events


# ---------------------------------------------------------------- headers, byte for byte


def test_frame_is_a_big_endian_length_prefix() -> None:
    assert frame(b"") == b"\x00\x00\x00\x00"
    assert frame(b"abc") == b"\x00\x00\x00\x03abc"
    assert frame(b"x" * 258)[:4] == b"\x00\x00\x01\x02"


def test_request_header_bytes() -> None:
    header = RequestHeader(3, 1, 7, "ab")
    wire = encode_request_header(header)
    assert wire == bytes.fromhex("00030001000000070002") + b"ab"
    assert decode_request_header(wire + b"BODY") == (header, memoryview(b"BODY"))


def test_request_header_null_and_empty_and_unicode_client_id() -> None:
    null = encode_request_header(RequestHeader(0, 0, 1, None))
    assert null == bytes.fromhex("0000000000000001ffff")
    assert decode_request_header(null)[0].client_id is None
    empty = encode_request_header(RequestHeader(0, 0, 1, ""))
    assert empty[-2:] == b"\x00\x00"
    assert decode_request_header(empty)[0].client_id == ""
    header = RequestHeader(1000, 0, 2**31 - 1, "brøker-ñ")
    assert decode_request_header(encode_request_header(header))[0] == header


def test_client_id_longest_allowed() -> None:
    header = RequestHeader(0, 0, 1, "é" * (0x7FFF // 2))
    assert decode_request_header(encode_request_header(header))[0] == header
    with pytest.raises(ValueError, match="32767"):
        encode_request_header(RequestHeader(0, 0, 1, "x" * 0x8000))
    with pytest.raises(ValueError, match="32767"):
        ClientConnection("x" * 0x8000).send_request(ApiVersionsRequest())


def test_request_header_rejects_bad_client_ids() -> None:
    fixed = struct.pack(">hhi", 0, 0, 1)
    with pytest.raises(DecodeError):
        decode_request_header(fixed + struct.pack(">h", 5) + b"abc")  # runs past the end
    with pytest.raises(DecodeError):
        decode_request_header(fixed + struct.pack(">h", -2))  # only -1 means null
    with pytest.raises(DecodeError):
        decode_request_header(fixed + struct.pack(">h", 2) + b"\xff\xfe")  # not UTF-8
    with pytest.raises(DecodeError):
        decode_request_header(fixed)  # no client_id length at all


def test_response_header_bytes() -> None:
    wire = encode_response_header(ResponseHeader(9, 42))
    assert wire == bytes.fromhex("00000009002a")
    assert decode_response_header(wire + b"B") == (ResponseHeader(9, 42), memoryview(b"B"))
    assert decode_response_header(encode_response_header(ResponseHeader(-1, -1)))[0] == (-1, -1)
    with pytest.raises(DecodeError):
        decode_response_header(wire[:5])


# ---------------------------------------------------------------- frame decoder


def test_partial_frames_byte_by_byte() -> None:
    client = ClientConnection()
    server = ServerConnection()
    wire = b"".join(client.send_request(b)[1] for b in PINGS)
    boundaries = set()
    pos = 0
    while pos < len(wire):
        pos += 4 + struct.unpack_from(">i", wire, pos)[0]
        boundaries.add(pos)
    events = []
    for i in range(len(wire)):
        server.receive_data(wire[i : i + 1])
        event = server.next_event()
        # An event appears exactly when the last byte of its frame arrives.
        assert (event is not None) == (i + 1 in boundaries), i
        if event is not None:
            events.append(event)
            assert server.next_event() is None
    assert [e.body for e in events] == PINGS
    assert [e.header.correlation_id for e in events] == list(range(len(PINGS)))


def test_many_frames_in_one_chunk() -> None:
    decoder = FrameDecoder()
    payloads = [bytes([i]) * i for i in range(50)]
    decoder.feed(b"".join(frame(p) for p in payloads))
    got = []
    while (p := decoder.next_frame()) is not None:
        got.append(p)
    assert got == payloads
    assert decoder.buffered == 0


@settings(max_examples=60, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=30), max_size=8),
    cuts=st.lists(st.integers(0, 400), max_size=10),
)
def test_frames_survive_any_chunking(payloads: list[bytes], cuts: list[int]) -> None:
    assert_decoded_whatever_the_chunking(payloads, cuts)


def assert_decoded_whatever_the_chunking(
    payloads: list[bytes], cuts: list[int], group: int = 0
) -> None:
    """Frame `payloads` and feed the wire to one FrameDecoder in chunks cut at `cuts`
    (modulo its length), one at a time or (`group` > 0) `group` chunks to a
    feed_chunks call: it gives back the same payloads, never buffers more than the
    wire, and ends with nothing buffered."""
    wire = b"".join(frame(p) for p in payloads)
    points = sorted({c % (len(wire) + 1) for c in cuts} | {0, len(wire)})
    chunks = [wire[start:end] for start, end in itertools.pairwise(points)]
    decoder = FrameDecoder()
    got = []
    for i in range(0, len(chunks), group or 1):
        if group:
            decoder.feed_chunks(chunks[i : i + group])
        else:
            decoder.feed(chunks[i])
        assert decoder.buffered <= len(wire)
        while (p := decoder.next_frame()) is not None:
            got.append(p)
    assert got == payloads
    assert decoder.buffered == 0


def test_empty_frame_is_a_frame() -> None:
    decoder = FrameDecoder()
    decoder.feed(frame(b""))
    assert decoder.next_frame() == b""
    assert decoder.next_frame() is None


@pytest.mark.parametrize("length", [-1, -(2**31), -12345])
def test_negative_length_is_a_decode_error(length: int) -> None:
    decoder = FrameDecoder()
    decoder.feed(struct.pack(">i", length))
    with pytest.raises(DecodeError) as info:
        decoder.next_frame()
    assert not isinstance(info.value, FrameTooLargeError)
    server = ServerConnection()
    server.receive_data(struct.pack(">i", length) + b"junk")
    with pytest.raises(DecodeError):
        server.next_event()


def test_a_frame_claiming_2_gib_fails_at_once_without_buffering() -> None:
    """The four length bytes are enough: nothing is allocated or awaited."""
    decoder = FrameDecoder()
    decoder.feed(b"\x7f\xff\xff\xff")  # 2 GiB - 1, the largest an int32 can claim
    with pytest.raises(FrameTooLargeError):
        decoder.next_frame()
    assert decoder.buffered == 4
    server = ServerConnection()
    server.receive_data(b"\x7f\xff\xff\xff")
    with pytest.raises(FrameTooLargeError):
        server.next_event()
    client = ClientConnection()
    client.send_request(MetadataRequest())
    with pytest.raises(FrameTooLargeError):
        client.receive_data(b"\x7f\xff\xff\xff")


def test_frame_size_limit_is_inclusive() -> None:
    decoder = FrameDecoder(max_frame_size=10)
    decoder.feed(frame(b"0123456789"))
    assert decoder.next_frame() == b"0123456789"
    decoder.feed(frame(b"0123456789A"))
    with pytest.raises(FrameTooLargeError):
        decoder.next_frame()
    assert DEFAULT_MAX_FRAME_SIZE == 100 * 1024 * 1024


def test_oversized_frame_after_good_ones() -> None:
    server = ServerConnection(max_frame_size=1000)
    client = ClientConnection()
    good = client.send_request(PINGS[0])[1]
    server.receive_data(good + struct.pack(">i", 1001))
    assert isinstance(server.next_event(), Request)
    with pytest.raises(FrameTooLargeError):
        server.next_event()


# ---------------------------------------------------------------- in-flight limit and ordering


def test_max_in_flight_pauses_event_production() -> None:
    client = ClientConnection()
    server = ServerConnection(max_in_flight=2)
    events = pipe(client, server, PINGS)
    assert len(events) == 2
    assert server.in_flight == 2
    assert server.next_event() is None  # paused although whole frames are buffered
    out = server.send_response(events[0], MetadataResponse())
    assert out
    assert server.in_flight == 1
    third = server.next_event()
    assert isinstance(third, Request) and third.body == PINGS[2]
    assert server.next_event() is None
    for event in (events[1], third):
        server.send_response(event, MetadataResponse())
    rest = []
    while (event := server.next_event()) is not None:
        rest.append(event)
    assert [e.body for e in rest] == PINGS[3:]


def test_rejections_count_against_max_in_flight() -> None:
    server = ServerConnection(max_in_flight=1)
    server.receive_data(raw_request(999, 0, 1, b"\x80") + raw_request(999, 0, 2, b"\x80"))
    first = server.next_event()
    assert isinstance(first, RejectedRequest)
    assert server.next_event() is None
    server.send_rejection(first)
    assert isinstance(server.next_event(), RejectedRequest)


def test_responses_released_in_request_order_when_completed_out_of_order() -> None:
    client = ClientConnection()
    server = ServerConnection()
    events = pipe(client, server, PINGS)
    # Complete the last first: nothing may be written until request 0 is done.
    for event in reversed(events[1:]):
        assert server.send_response(event, MetadataResponse(controller_id=event.seq)) == b""
    out = server.send_response(events[0], MetadataResponse(controller_id=0))
    responses = client.receive_data(out)
    assert [r.correlation_id for r in responses] == [e.header.correlation_id for e in events]
    assert [r.body.controller_id for r in responses] == [0, 1, 2, 3, 4]
    assert server.in_flight == 0


@settings(max_examples=60, deadline=None)
@given(order=st.permutations(range(6)), kinds=st.lists(st.integers(0, 2), min_size=6, max_size=6))
def test_any_completion_order_gives_request_order(order: list[int], kinds: list[int]) -> None:
    """Responses, errors and rejections mixed, completed in any order."""
    client = ClientConnection()
    server = ServerConnection()
    wire = b""
    sent = []
    for i, kind in enumerate(kinds):
        version = 99 if kind == 2 else None  # kind 2: the server rejects it
        correlation_id, data = client.send_request(
            MetadataRequest(topics=[str(i)]), api_version=version
        )
        sent.append(correlation_id)
        wire += data
    server.receive_data(wire)
    events = []
    while (event := server.next_event()) is not None:
        events.append(event)
    assert len(events) == 6
    out = b""
    for step, i in enumerate(order):
        event = events[i]
        if isinstance(event, RejectedRequest):
            chunk = server.send_rejection(event)
        elif kinds[i] == 1:
            chunk = server.send_error(event, ErrorCode.REQUEST_TIMED_OUT, f"slow {i}")
        else:
            chunk = server.send_response(event, MetadataResponse(controller_id=i))
        # Bytes come out exactly when every earlier request was already answered.
        assert bool(chunk) == (set(range(i)) <= set(order[:step]))
        out += chunk
    responses = client.receive_data(out)
    assert [r.correlation_id for r in responses] == sent
    for i, response in enumerate(responses):
        if kinds[i] == 0:
            assert response == Response(
                sent[i], MetadataResponse(controller_id=i), ErrorCode.NONE, ""
            )
        elif kinds[i] == 1:
            assert response == Response(sent[i], None, ErrorCode.REQUEST_TIMED_OUT, f"slow {i}")
        else:
            assert response.error_code == ErrorCode.UNSUPPORTED_VERSION
            assert response.body is None
    assert server.in_flight == 0
    assert client.in_flight == 0


def test_double_response_and_unknown_request_are_programming_errors() -> None:
    client = ClientConnection()
    server = ServerConnection()
    [event] = pipe(client, server, PINGS[:1])
    server.send_response(event, MetadataResponse())
    with pytest.raises(ValueError, match="already answered"):
        server.send_response(event, MetadataResponse())
    with pytest.raises(ValueError, match="unknown"):
        server.send_response(event._replace(seq=5), MetadataResponse())


# ---------------------------------------------------------------- rejections and errors


def _decode_error_response(out: bytes) -> tuple[ResponseHeader, ErrorBody]:
    decoder = FrameDecoder()
    decoder.feed(out)
    payload = decoder.next_frame()
    assert payload is not None and decoder.next_frame() is None
    header, body = decode_response_header(payload)
    error_body = decode_body(ErrorBody, body)
    assert isinstance(error_body, ErrorBody)
    return header, error_body


def test_unknown_api_key_is_rejected_with_invalid_request() -> None:
    server = ServerConnection()
    server.receive_data(raw_request(999, 0, 77, b"\x80"))
    event = server.next_event()
    assert isinstance(event, RejectedRequest)
    assert event.error == ErrorCode.INVALID_REQUEST
    assert event.header == RequestHeader(999, 0, 77, "raw")
    assert "999" in event.message
    header, body = _decode_error_response(server.send_rejection(event))
    assert header == ResponseHeader(77, int(ErrorCode.INVALID_REQUEST))
    assert body.error_message == event.message


def test_unsupported_version_is_rejected_and_the_client_decodes_it() -> None:
    client = ClientConnection()
    server = ServerConnection()
    correlation_id, wire = client.send_request(ApiVersionsRequest(), api_version=5)
    server.receive_data(wire)
    event = server.next_event()
    assert isinstance(event, RejectedRequest)
    assert event.error == ErrorCode.UNSUPPORTED_VERSION
    assert "ApiVersions" in event.message
    [response] = client.receive_data(server.send_rejection(event))
    assert response == Response(correlation_id, None, ErrorCode.UNSUPPORTED_VERSION, event.message)
    spec = API_SPECS[ApiKey.API_VERSIONS]
    for version in (spec.min_version - 1, spec.max_version + 1, -1, 2**15 - 1):
        server.receive_data(raw_request(ApiKey.API_VERSIONS, version, 1, b"\x80"))
        event = server.next_event()
        assert isinstance(event, RejectedRequest) and event.error == ErrorCode.UNSUPPORTED_VERSION
        server.send_rejection(event)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"\xc1", id="not-msgpack"),
        pytest.param(b"\x80", id="missing-required-field"),
        pytest.param(b"\x81\xa6topics\x91\x01", id="wrong-type"),
        pytest.param(b"\x81\xa6topics\x91\xa1\xff", id="non-utf8"),
        pytest.param(b"\x81\xa6topics" + b"\x91" * 50_000 + b"\xc0", id="too-deep"),
    ],
)
def test_undecodable_body_is_rejected_with_invalid_request(body: bytes) -> None:
    server = ServerConnection()
    server.receive_data(raw_request(ApiKey.PRODUCE, 0, 3, body))
    event = server.next_event()
    assert isinstance(event, RejectedRequest)
    assert event.error == ErrorCode.INVALID_REQUEST
    assert "ProduceRequest" in event.message
    header, _ = _decode_error_response(server.send_rejection(event))
    assert header == ResponseHeader(3, int(ErrorCode.INVALID_REQUEST))


def test_connection_keeps_serving_after_a_rejection() -> None:
    client = ClientConnection()
    server = ServerConnection()
    bad_id, bad = client.send_request(MetadataRequest(), api_version=9)
    good_id, good = client.send_request(MetadataRequest(topics=["a"]))
    server.receive_data(bad + good)
    rejected, request = server.next_event(), server.next_event()
    assert isinstance(rejected, RejectedRequest) and isinstance(request, Request)
    out = server.send_response(request, MetadataResponse(cluster_id="c"))
    assert out == b""  # the rejection is still owed first
    out = server.send_rejection(rejected)
    responses = client.receive_data(out)
    assert [r.correlation_id for r in responses] == [bad_id, good_id]
    assert responses[0].error_code == ErrorCode.UNSUPPORTED_VERSION
    assert responses[1].body == MetadataResponse(cluster_id="c")


def test_api_filter_rejects_unserved_apis() -> None:
    client = ClientConnection()
    server = ServerConnection(api_filter=lambda key: key != ApiKey.PRODUCE)
    topics = [ProduceTopic(name="t", partitions=[ProducePartition(index=0, records=b"")])]
    _correlation_id, wire = client.send_request(ProduceRequest(topics=topics))
    server.receive_data(wire)
    event = server.next_event()
    assert isinstance(event, RejectedRequest) and event.error == ErrorCode.INVALID_REQUEST
    [response] = client.receive_data(server.send_rejection(event))
    assert response.error_code == ErrorCode.INVALID_REQUEST
    assert response.body is None
    _, wire = client.send_request(ApiVersionsRequest())
    server.receive_data(wire)
    assert isinstance(server.next_event(), Request)


def test_send_error_reaches_the_client() -> None:
    client = ClientConnection()
    server = ServerConnection()
    [event] = pipe(client, server, [ApiVersionsRequest()])
    out = server.send_error(event, ErrorCode.UNKNOWN_SERVER_ERROR, "handler crashed: KeyError")
    [response] = client.receive_data(out)
    assert response == Response(
        0, None, ErrorCode.UNKNOWN_SERVER_ERROR, "handler crashed: KeyError"
    )


def test_client_maps_unknown_error_codes_to_unknown_server_error() -> None:
    client = ClientConnection()
    correlation_id, _ = client.send_request(ApiVersionsRequest())
    payload = encode_response_header(ResponseHeader(correlation_id, 31999))
    [response] = client.receive_data(frame(payload + encode_body(ErrorBody(error_message="?"))))
    assert response == Response(correlation_id, None, ErrorCode.UNKNOWN_SERVER_ERROR, "?")


def test_client_rejects_responses_it_did_not_ask_for() -> None:
    client = ClientConnection()
    client.send_request(ApiVersionsRequest())
    payload = encode_response_header(ResponseHeader(5, 0)) + encode_body(ApiVersionsResponse())
    with pytest.raises(DecodeError):
        client.receive_data(frame(payload))
    client2 = ClientConnection()
    correlation_id, _ = client2.send_request(ApiVersionsRequest())
    payload = encode_response_header(ResponseHeader(correlation_id, 0))
    with pytest.raises(DecodeError):
        client2.receive_data(frame(payload + b"\xc1"))  # body does not decode
    client3 = ClientConnection()
    correlation_id, _ = client3.send_request(ApiVersionsRequest())
    [response] = client3.receive_data(
        frame(
            encode_response_header(ResponseHeader(correlation_id, 0))
            + encode_body(ApiVersionsResponse())
        )
    )
    assert response.body == ApiVersionsResponse()
    with pytest.raises(DecodeError):  # the same answer twice
        client3.receive_data(
            frame(
                encode_response_header(ResponseHeader(correlation_id, 0))
                + encode_body(ApiVersionsResponse())
            )
        )


def test_client_response_split_across_reads() -> None:
    client = ClientConnection()
    server = ServerConnection()
    [event] = pipe(client, server, [MetadataRequest()])
    out = server.send_response(event, MetadataResponse(cluster_id="x" * 100))
    for i in range(len(out) - 1):
        assert client.receive_data(out[i : i + 1]) == []
    [response] = client.receive_data(out[-1:])
    assert response.body == MetadataResponse(cluster_id="x" * 100)


def test_correlation_ids_count_up_and_wrap_at_int32() -> None:
    client = ClientConnection()
    assert [client.send_request(ApiVersionsRequest())[0] for _ in range(3)] == [0, 1, 2]
    client._next_correlation_id = 2**31 - 1
    assert client.send_request(ApiVersionsRequest())[0] == 2**31 - 1
    assert client.send_request(ApiVersionsRequest())[0] == 0


def test_produce_records_travel_as_raw_bytes() -> None:
    """The records field is opaque bytes: what goes in comes out, byte for byte."""
    client = ClientConnection()
    server = ServerConnection()
    records = bytes(range(256)) * 4
    topics = [ProduceTopic(name="t", partitions=[ProducePartition(index=0, records=records)])]
    [event] = pipe(client, server, [ProduceRequest(topics=topics)])
    assert event.body.topics[0].partitions[0].records == records
    [response] = client.receive_data(server.send_response(event, ProduceResponse()))
    assert response.body == ProduceResponse()


_big_or_small = st.one_of(
    st.binary(max_size=30),
    st.sampled_from([LARGE_FRAME_BYTES - 1, LARGE_FRAME_BYTES, 3 * LARGE_FRAME_BYTES + 5]).map(
        lambda n: bytes(range(251)) * (n // 251) + b"z" * (n % 251)
    ),
)


@settings(max_examples=60, deadline=None)
@given(
    payloads=st.lists(_big_or_small, max_size=5),
    cuts=st.lists(st.integers(0, 2**20), max_size=12),
)
def test_large_frames_survive_any_chunking(payloads: list[bytes], cuts: list[int]) -> None:
    """A large frame is gathered in a buffer of its own: same payloads, whatever the
    chunking, and a chunk may end one large frame and start the next."""
    assert_decoded_whatever_the_chunking(payloads, cuts)


@settings(max_examples=60, deadline=None)
@given(
    payloads=st.lists(_big_or_small, max_size=5),
    cuts=st.lists(st.integers(0, 2**20), max_size=12),
    group=st.integers(1, 6),
)
def test_frames_survive_any_grouping_of_chunks(
    payloads: list[bytes], cuts: list[int], group: int
) -> None:
    """feed_chunks (TLS's records of one read, not joined) gives the same payloads as
    feeding the chunks one by one, whether a group ends a large frame or not."""
    assert_decoded_whatever_the_chunking(payloads, cuts, group)


def test_a_chunk_ending_a_large_frame_may_start_the_next() -> None:
    payload = b"p" * (2 * LARGE_FRAME_BYTES)
    wire = frame(payload) + frame(b"next")
    decoder = FrameDecoder()
    decoder.feed(wire[:1000])
    assert decoder.next_frame() is None
    decoder.feed(wire[1000:])
    first = decoder.next_frame()
    assert isinstance(first, bytes) and first == payload
    assert decoder.next_frame() == b"next"
    assert decoder.next_frame() is None
    assert first == payload  # the decoder kept no hold on it


@pytest.mark.parametrize("per_call", [1, 16], ids=["feed", "feed_chunks"])
def test_a_large_frame_fed_as_tls_records_is_not_copied_until_whole(per_call: int) -> None:
    """A TLS listener feeds a request frame a record (16 KiB of plaintext) at a time,
    with no next_frame between the records: the decoder keeps them as they are from the
    first one and copies the frame's bytes once, when it is whole, not into its stream
    buffer as they come (which would also copy them again to hand the frame out)."""
    payload = bytes(range(256)) * (4 * 1024 * 1024 // 256)
    wire = frame(payload) + frame(b"next")
    records = [wire[i : i + 16 * 1024] for i in range(0, len(wire), 16 * 1024)]
    decoder = FrameDecoder()
    tracemalloc.start()
    try:
        for i in range(0, len(records), per_call):
            if per_call == 1:
                decoder.feed(records[i])
            else:  # a socket read's worth of records, as the TLS listener hands them
                decoder.feed_chunks(records[i : i + per_call])
        _, peak_while_fed = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak_while_fed < 256 * 1024, f"the decoder copied {peak_while_fed} bytes while fed"
    assert decoder.next_frame() == payload
    assert decoder.next_frame() == b"next"
    assert decoder.next_frame() is None


def read_into(decoder: FrameDecoder, wire: bytes, cuts: list[int]) -> list[bytes | bytearray]:
    """A transport reading `wire` into the decoder (asyncio.BufferedProtocol), each
    read ending at the next cut or where get_buffer's memory ends, whichever is first."""
    points = sorted({c % (len(wire) + 1) for c in cuts} | {len(wire)})
    got: list[bytes | bytearray] = []
    at = 0
    for end in points:
        while at < end:
            buffer = decoder.get_buffer()
            assert len(buffer) > 0
            n = min(len(buffer), end - at)
            buffer[:n] = wire[at : at + n]
            decoder.buffer_updated(n)
            at += n
            assert decoder.buffered <= len(wire)
            while (p := decoder.next_frame()) is not None:
                got.append(p)
    return got


@settings(max_examples=80, deadline=None)
@given(
    sizes=st.lists(
        st.sampled_from(
            [0, 1, 30, LARGE_FRAME_BYTES - 5, LARGE_FRAME_BYTES, 3 * LARGE_FRAME_BYTES]
        ),
        max_size=6,
    ),
    cuts=st.lists(st.integers(0, 1 << 20), max_size=12),
)
def test_frames_read_into_the_decoder_survive_any_chunking(
    sizes: list[int], cuts: list[int]
) -> None:
    """Read into (the servers' and peer clients' transports): the same payloads as
    feeding, whatever the reads, small frames and large ones alike."""
    payloads = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
    decoder = FrameDecoder()
    assert read_into(decoder, b"".join(frame(p) for p in payloads), cuts) == payloads
    assert decoder.buffered == 0


def test_a_large_frame_is_read_straight_into_its_own_buffer() -> None:
    """Issue 20 (produce cost per MB): once an eighth of a 1 MiB request has arrived
    (its first read), the rest is read by the kernel into the payload handed out,
    never past its end (the next frame stays in the socket), with no join: the
    broker's one Python copy of produced bytes gone."""
    payload = bytes(range(256)) * (1024 * 1024 // 256)
    wire = frame(payload) + frame(b"next")
    decoder = FrameDecoder()
    first = decoder.get_buffer()
    assert len(first) == SCRATCH_BYTES
    first_read = 200 * 1024
    first[:first_read] = wire[:first_read]
    decoder.buffer_updated(first_read)
    assert decoder.next_frame() is None
    rest = decoder.get_buffer()
    assert len(rest) == len(payload) - (first_read - 4)  # exactly the frame's remainder
    rest[:] = wire[first_read : 4 + len(payload)]
    decoder.buffer_updated(len(rest))
    got = decoder.next_frame()
    assert isinstance(got, bytearray) and got == payload
    assert rest.obj is got  # read in place: the buffer handed out is the one read into
    del rest
    got.extend(b"x")  # the decoder holds no export of it any more
    assert read_into(decoder, frame(b"next"), []) == [b"next"]


def peak_bytes_while_read_into(decoder: FrameDecoder, sent: bytes) -> int:
    """The most memory allocated while `sent` is read into `decoder` in scratch-sized
    reads (the thread's scratch buffer made before measuring)."""
    decoder.get_buffer()
    tracemalloc.start()
    try:
        for at in range(0, len(sent), SCRATCH_BYTES):
            chunk = sent[at : at + SCRATCH_BYTES]
            decoder.get_buffer()[: len(chunk)] = chunk
            decoder.buffer_updated(len(chunk))
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_length_prefix_alone_allocates_nothing() -> None:
    """A peer claiming a 100 MiB frame in four bytes (then stalling) makes the decoder
    allocate nothing for it, and a frame earns its own buffer only after an eighth of
    it arrived: what a peer makes it allocate is bounded by what it sent. Off (the
    buffer allocated at the prefix): 100 MiB per such connection."""
    claimed = DEFAULT_MAX_FRAME_SIZE
    decoder = FrameDecoder()
    sent = struct.pack(">i", claimed) + b"x" * (claimed // 8 - 1024)
    peak = peak_bytes_while_read_into(decoder, sent)
    assert decoder.next_frame() is None
    assert peak < len(sent) + 2 * SCRATCH_BYTES, f"{peak} bytes held for {len(sent)} sent"


def test_a_frame_larger_than_the_read_into_bound_is_always_gathered() -> None:
    """Attack on the read-into buffer: 12.5 MiB of a frame claiming 100 MiB (an eighth
    of it, then stalling) must not make the decoder zero-fill the 100 MiB it claims;
    frames above READ_INTO_MAX_BYTES are gathered as they arrive, so what it holds is
    what was sent. Off (no bound): 100 MiB allocated for 12.5 MiB sent."""
    claimed = DEFAULT_MAX_FRAME_SIZE
    assert claimed > READ_INTO_MAX_BYTES
    decoder = FrameDecoder()
    sent = struct.pack(">i", claimed) + b"x" * (claimed // 8 + 1024)
    peak = peak_bytes_while_read_into(decoder, sent)
    assert decoder.next_frame() is None
    assert len(decoder.get_buffer()) == SCRATCH_BYTES  # no buffer of its own
    assert peak < len(sent) + 2 * SCRATCH_BYTES, f"{peak} bytes held for {len(sent)} sent"


def test_a_frame_above_the_read_into_bound_still_decodes_whole() -> None:
    """Gathered instead of read in place, a frame past READ_INTO_MAX_BYTES is the same
    payload, and the frame after it decodes too."""
    payload = bytes(range(256)) * ((READ_INTO_MAX_BYTES + 4096) // 256)
    decoder = FrameDecoder()
    got = read_into(decoder, frame(payload) + frame(b"next"), [5, 70_000, 3 << 20])
    assert got == [payload, b"next"]
