"""Bad bytes never raise anything but DecodeError (or a subclass).

Every decoder gets arbitrary bytes and damaged versions of valid input (bit flips,
truncations, int32 fields set to huge or negative values, inserted and deleted
bytes), with the framing and the CRC patched back afterwards in some examples so
the damage reaches the deeper layers. A server must survive a malicious client and
a client a malicious server: anything else escaping a decoder would take down the
connection task instead of closing the connection with a log line."""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable

import crc32c
import msgspec
import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from protocol_strategies import batches
from protocol_strategies import msgpack_values
from protocol_strategies import mutated
from protocol_strategies import reframe
from protocol_strategies import struct_strategy
from protocol_strategies import struct_types_reachable

from protocol import connection
from protocol import framing
from protocol import record_batch as rb
from protocol.api import ApiKey
from protocol.errors import DecodeError
from protocol.errors import ErrorCode
from protocol.messages import API_SPECS
from protocol.messages import ErrorBody
from protocol.messages import MetadataEntry
from protocol.messages import MetadataRequest
from protocol.messages import ProduceRequest
from protocol.metadata_records import TopicRecord

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
FUZZ_SMALL = settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))

SPECS = sorted(API_SPECS.values(), key=lambda s: int(s.key))
ALL_BODY_TYPES = sorted(
    {t for s in SPECS for kind in (s.request, s.response) for t in struct_types_reachable(kind)}
    | {ErrorBody, MetadataEntry},
    key=lambda t: t.__name__,
)
api_keys = st.one_of(st.sampled_from([int(k) for k in ApiKey]), st.integers(-(2**15), 2**15 - 1))


def decodes_or_decode_error(fn, *args, **kwargs):
    """Call fn; a DecodeError is a fine answer, any other exception fails the test."""
    try:
        return fn(*args, **kwargs)
    except DecodeError:
        return None


def fix_crc(buf: bytearray, pos: int = 0) -> None:
    if len(buf) - pos >= rb.HEADER_SIZE:
        (length,) = struct.unpack_from(">i", buf, pos + 8)
        end = min(len(buf), pos + 12 + max(length, 0))
        struct.pack_into(">I", buf, pos + 17, crc32c.crc32c(bytes(buf[pos + 21 : end])))


def fix_batch_length(buf: bytearray) -> None:
    if len(buf) >= 12:
        struct.pack_into(">i", buf, 8, len(buf) - 12)


# ---------------------------------------------------------------- framing and headers


@FUZZ
@given(data=st.binary(max_size=300), max_frame_size=st.sampled_from([0, 1, 16, 2**20]))
def test_frame_decoder_arbitrary_bytes(data: bytes, max_frame_size: int) -> None:
    decoder = framing.FrameDecoder(max_frame_size)
    decoder.feed(data)
    total = 0
    try:
        while (payload := decoder.next_frame()) is not None:
            assert len(payload) <= max_frame_size
            total += 4 + len(payload)
    except DecodeError:
        return
    assert total + decoder.buffered == len(data)


@pytest.mark.parametrize(
    ("decode", "encode", "max_size"),
    [
        (framing.decode_request_header, framing.encode_request_header, 64),
        (framing.decode_response_header, framing.encode_response_header, 32),
    ],
    ids=["request", "response"],
)
@FUZZ
@given(data=st.data())
def test_decode_header_arbitrary_bytes(
    decode: Callable, encode: Callable, max_size: int, data: st.DataObject
) -> None:
    raw = data.draw(st.binary(max_size=max_size))
    result = decodes_or_decode_error(decode, raw)
    if result is not None:
        header, body = result
        # What decodes re-encodes to the same prefix.
        assert encode(header) + bytes(body) == raw


# ---------------------------------------------------------------- message bodies


@pytest.mark.parametrize("kind", ALL_BODY_TYPES, ids=lambda t: t.__name__)
@FUZZ_SMALL
@given(data=st.data())
def test_decode_body_arbitrary_input(kind: type, data: st.DataObject) -> None:
    raw = data.draw(
        st.one_of(
            st.binary(max_size=100),
            msgpack_values.map(msgspec.msgpack.encode),
            struct_strategy(kind).map(connection.encode_body).flatmap(mutated),
        )
    )
    result = decodes_or_decode_error(connection.decode_body, kind, raw)
    assert result is None or type(result) is kind
    # memoryview input (what the connections pass) behaves the same
    assert type(decodes_or_decode_error(connection.decode_body, kind, memoryview(raw))) is type(
        result
    )


@pytest.mark.parametrize(
    ("kind", "raw"),
    [
        pytest.param(
            MetadataRequest, b"\x81\xa3zzz" + b"\x91" * 100_000 + b"\xc0", id="deep-unknown"
        ),
        pytest.param(MetadataRequest, b"\x81\xa6topics" + b"\x91" * 100_000 + b"\xc0", id="deep"),
        pytest.param(MetadataRequest, b"\x81\xa6topics\x91\xa2\xff\xfe", id="non-utf8-str"),
        pytest.param(
            TopicRecord,
            b"\x83\xa4name\xa0\xa8topic_id\xa0\xa7configs\x81\xa1\xff\xa0",
            id="non-utf8-key",
        ),
        pytest.param(MetadataRequest, b"\x81\xa6topics\xdd\xff\xff\xff\xff", id="huge-array"),
        pytest.param(MetadataRequest, b"\x81\xa6topics\x91\xdb\xff\xff\xff\xff", id="huge-str"),
        pytest.param(ProduceRequest, b"\x81\xa4acks\x01", id="missing-required-field"),
        pytest.param(MetadataRequest, b"\x81\xb9allow_auto_topic_creation\x01", id="int-for-bool"),
        pytest.param(MetadataRequest, b"\xc1", id="never-used-byte"),
        pytest.param(MetadataRequest, b"", id="empty"),
        pytest.param(MetadataRequest, b"\x80\x00", id="trailing-bytes"),
        pytest.param(MetadataRequest, b"\x90", id="array-not-map"),
    ],
)
def test_decode_body_known_nasties(kind: type, raw: bytes) -> None:
    with pytest.raises(DecodeError):
        connection.decode_body(kind, raw)


# ---------------------------------------------------------------- server connection


@st.composite
def request_payloads(draw) -> bytes:
    """A request payload: a sound header in front of a body of any quality."""
    spec = draw(st.sampled_from(SPECS))
    header = framing.RequestHeader(
        draw(st.one_of(st.just(int(spec.key)), api_keys)),
        draw(st.one_of(st.just(spec.max_version), st.integers(-(2**15), 2**15 - 1))),
        draw(st.integers(-(2**31), 2**31 - 1)),
        draw(st.none() | st.text(max_size=8)),
    )
    body = draw(
        st.one_of(
            struct_strategy(spec.request).map(connection.encode_body),
            struct_strategy(spec.request).map(connection.encode_body).flatmap(mutated),
            msgpack_values.map(msgspec.msgpack.encode),
            st.binary(max_size=40),
        )
    )
    return framing.encode_request_header(header) + body


@st.composite
def server_streams(draw) -> bytes:
    parts = draw(
        st.lists(
            st.one_of(
                request_payloads().map(framing.frame),
                request_payloads().flatmap(mutated).map(reframe),
                request_payloads().map(framing.frame).flatmap(mutated),
                st.binary(max_size=40).map(framing.frame),
                st.binary(max_size=40),
            ),
            min_size=1,
            max_size=5,
        )
    )
    return b"".join(parts)


def drain_server(server: connection.ServerConnection) -> bool:
    """Take every event, answering each; return False once the stream is malformed."""
    while True:
        try:
            event = server.next_event()
        except DecodeError:
            return False
        if event is None:
            return True
        if isinstance(event, connection.RejectedRequest):
            assert event.error in (ErrorCode.INVALID_REQUEST, ErrorCode.UNSUPPORTED_VERSION)
            out = server.send_rejection(event)
        else:
            assert isinstance(event, connection.Request)
            assert type(event.body) is API_SPECS[event.header.api_key].request
            out = server.send_error(event, ErrorCode.UNKNOWN_SERVER_ERROR, "fuzz")
        assert out  # answered in order, so every answer is released at once


@FUZZ
@given(stream=server_streams(), cuts=st.lists(st.integers(0, 2000), max_size=4))
def test_server_connection_survives_anything(stream: bytes, cuts: list[int]) -> None:
    server = connection.ServerConnection(max_frame_size=1 << 16, max_in_flight=3)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    for start, end in itertools.pairwise(points):
        server.receive_data(stream[start:end])
        if not drain_server(server):
            return
    assert server.in_flight == 0


@FUZZ_SMALL
@given(raw=st.binary(max_size=300))
def test_server_connection_arbitrary_bytes(raw: bytes) -> None:
    server = connection.ServerConnection(max_frame_size=1 << 16)
    server.receive_data(raw)
    drain_server(server)


# ---------------------------------------------------------------- client connection


@st.composite
def response_payloads(draw, spec) -> bytes:
    correlation_id = draw(st.integers(-1, 5))
    error_code = draw(
        st.one_of(
            st.just(0),
            st.sampled_from([int(c) for c in ErrorCode]),
            st.integers(-(2**15), 2**15 - 1),
        )
    )
    body = draw(
        st.one_of(
            struct_strategy(spec.response).map(connection.encode_body),
            struct_strategy(spec.response).map(connection.encode_body).flatmap(mutated),
            st.text(max_size=10).map(lambda m: connection.encode_body(ErrorBody(error_message=m))),
            msgpack_values.map(msgspec.msgpack.encode),
            st.binary(max_size=40),
        )
    )
    return framing.encode_response_header(framing.ResponseHeader(correlation_id, error_code)) + body


@FUZZ
@given(data=st.data())
def test_client_connection_survives_anything(data: st.DataObject) -> None:
    spec = data.draw(st.sampled_from(SPECS))
    client = connection.ClientConnection("fuzz")
    for _ in range(4):
        client.send_request(data.draw(struct_strategy(spec.request)))
    parts = data.draw(
        st.lists(
            st.one_of(
                response_payloads(spec).map(framing.frame),
                response_payloads(spec).flatmap(mutated).map(reframe),
                response_payloads(spec).map(framing.frame).flatmap(mutated),
                st.binary(max_size=40),
            ),
            min_size=1,
            max_size=4,
        )
    )
    try:
        responses = client.receive_data(b"".join(parts))
    except DecodeError:
        return
    for response in responses:
        assert isinstance(response, connection.Response)
        assert isinstance(response.error_code, ErrorCode)
        if response.error_code == ErrorCode.NONE:
            assert type(response.body) is spec.response
        else:
            assert response.body is None


# ---------------------------------------------------------------- record batches


def exercise_batch_decoders(buf: bytes) -> None:
    """Every record_batch decoder on `buf`, at a few positions; only DecodeError allowed."""
    for pos in {0, 1, rb.HEADER_SIZE, len(buf) // 2, len(buf)}:
        if pos > len(buf):
            continue
        decodes_or_decode_error(rb.parse_header, buf, pos)
        decodes_or_decode_error(rb.validate_batch, buf, pos)
        decodes_or_decode_error(rb.decode_batch, buf, pos)
        decodes_or_decode_error(rb.decode_batch, buf, pos, verify_crc=False)
        decodes_or_decode_error(rb.decode_varint, buf, pos)
    decodes_or_decode_error(rb.validate_batches, buf)
    decodes_or_decode_error(lambda: list(rb.iter_headers(buf)))
    decodes_or_decode_error(lambda: list(rb.iter_records(buf)))
    decodes_or_decode_error(lambda: list(rb.iter_records(buf, verify_crc=False)))
    # Recovery never raises at all: it reports how much of the buffer is sound.
    for expect in (None, 0, 2**40):
        valid, found = rb.scan_valid_prefix(buf, expect_offset=expect)
        assert 0 <= valid <= len(buf)
        assert sum(h.size for _, h in found) == valid
        if valid:
            assert rb.validate_batches(buf[:valid]) == found
    for header in (h for _, h in found):
        assert isinstance(header.compression, rb.Compression)


@FUZZ
@given(buf=st.binary(max_size=200))
def test_batch_decoders_arbitrary_bytes(buf: bytes) -> None:
    exercise_batch_decoders(buf)


@FUZZ
@given(buf=st.binary(max_size=120).map(lambda b: bytes(8) + struct.pack(">i", len(b) + 49) + b))
def test_batch_decoders_arbitrary_bytes_behind_a_plausible_length(buf: bytes) -> None:
    exercise_batch_decoders(buf)


@st.composite
def damaged_batches(draw) -> bytes:
    parts = draw(st.lists(batches(), min_size=1, max_size=3))
    buf = bytearray(draw(mutated(b"".join(parts))))
    # Patch the outer checks back in some examples so records get decoded.
    if draw(st.booleans()):
        fix_batch_length(buf)
    if draw(st.booleans()):
        fix_crc(buf)
    return bytes(buf)


@st.composite
def damaged_record_sections(draw) -> bytes:
    """A sound header (valid length and CRC) over damaged uncompressed records, with
    any attributes: the record parser and every codec see garbage."""
    batch = bytearray(draw(batches(compression=rb.Compression.NONE)))
    header, records = bytes(batch[: rb.HEADER_SIZE]), bytes(batch[rb.HEADER_SIZE :])
    body = draw(st.one_of(mutated(records), st.binary(max_size=60)))
    buf = bytearray(header + body)
    struct.pack_into(">h", buf, 21, draw(st.integers(0, 0x3F)))
    struct.pack_into(">i", buf, 57, draw(st.one_of(st.integers(-2, 6), st.just(2**31 - 1))))
    struct.pack_into(">i", buf, 23, draw(st.one_of(st.integers(-2, 6), st.just(2**31 - 1))))
    fix_batch_length(buf)
    fix_crc(buf)
    return bytes(buf)


@pytest.mark.parametrize(
    "damaged",
    [damaged_batches, damaged_record_sections],
    ids=["damaged_batches", "damaged_records_with_valid_crc"],
)
@FUZZ
@given(data=st.data())
def test_batch_decoders_survive_damage(
    damaged: Callable[[], st.SearchStrategy[bytes]], data: st.DataObject
) -> None:
    exercise_batch_decoders(data.draw(damaged()))


@FUZZ
@given(
    buf=st.one_of(
        st.binary(max_size=16), st.binary(min_size=1, max_size=3).map(lambda b: b"\xff" * 9 + b)
    ),
    pos=st.integers(0, 16),
)
def test_decode_varint_arbitrary_bytes(buf: bytes, pos: int) -> None:
    pos = min(pos, len(buf))
    result = decodes_or_decode_error(rb.decode_varint, buf, pos)
    if result is not None:
        value, end = result
        assert pos < end <= min(len(buf), pos + 10)
        assert -(2**63) <= value < 2**63  # Kafka's varlong is an int64
