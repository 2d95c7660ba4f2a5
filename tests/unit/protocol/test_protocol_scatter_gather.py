"""Scatter-gather framing: a Fetch response's or Produce request's record sets go to
the transport as the objects the body holds, never copied, and the buffers joined
are byte for byte the frame the plain encoder makes."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from protocol_strategies import struct_strategy

from protocol.connection import SCATTER_MIN_BYTES
from protocol.connection import ClientConnection
from protocol.connection import Request
from protocol.connection import ServerConnection
from protocol.connection import encode_body
from protocol.connection import encode_frame_parts
from protocol.framing import frame
from protocol.messages import FetchPartitionResponse
from protocol.messages import FetchRequest
from protocol.messages import FetchResponse
from protocol.messages import FetchTopic
from protocol.messages import FetchTopicResponse
from protocol.messages import MetadataRequest
from protocol.messages import MetadataResponse
from protocol.messages import ProducePartition
from protocol.messages import ProduceRequest
from protocol.messages import ProduceTopic

# Record set sizes around the threshold and around MessagePack's bin8/16/32 edges.
_sizes = st.sampled_from(
    [0, 1, 255, 256, 65535, 65536, SCATTER_MIN_BYTES - 1, SCATTER_MIN_BYTES, 200_000]
)
_record_sets = st.one_of(
    st.binary(max_size=64), _sizes.map(lambda n: bytes(range(256)) * (n // 256) + b"r" * (n % 256))
)
_heads = st.binary(min_size=6, max_size=40)


@st.composite
def _fetch_responses(draw) -> FetchResponse:
    topics = []
    for _ in range(draw(st.integers(0, 3))):
        parts = []
        for _ in range(draw(st.integers(0, 3))):
            p = draw(struct_strategy(FetchPartitionResponse))
            p.records = draw(_record_sets)
            parts.append(p)
        topics.append(FetchTopicResponse(topic=draw(st.text(max_size=8)), partitions=parts))
    return FetchResponse(responses=topics, throttle_time_ms=draw(st.integers(0, 10)))


@st.composite
def _produce_requests(draw) -> ProduceRequest:
    topics = []
    for _ in range(draw(st.integers(0, 3))):
        parts = [
            ProducePartition(
                index=i,
                current_leader_epoch=draw(st.integers(-1, 2**31 - 1)),
                records=draw(_record_sets),
            )
            for i in range(draw(st.integers(0, 3)))
        ]
        topics.append(ProduceTopic(name=draw(st.text(max_size=8)), partitions=parts))
    return ProduceRequest(acks=draw(st.sampled_from([-1, 0, 1])), topics=topics)


def _record_sets_of(body: msgspec.Struct) -> list[bytes]:
    if isinstance(body, FetchResponse):
        return [p.records for t in body.responses for p in t.partitions]
    assert isinstance(body, ProduceRequest)
    return [p.records for t in body.topics for p in t.partitions]


@settings(max_examples=200, deadline=None)
@given(st.one_of(_fetch_responses(), _produce_requests()), _heads)
def test_parts_join_to_the_plain_frame_and_big_records_are_not_copied(body, head) -> None:
    before = msgspec.msgpack.encode(body)
    originals = _record_sets_of(body)
    parts = encode_frame_parts(head, body)
    assert b"".join(parts) == frame(head + encode_body(body))
    # The body is as it was (the markers are swapped back) ...
    assert msgspec.msgpack.encode(body) == before
    assert all(a is b for a, b in zip(_record_sets_of(body), originals, strict=True))
    # ... and every big record set is one of the buffers, the very same object.
    big = [r for r in originals if len(r) >= SCATTER_MIN_BYTES]
    assert [p for p in parts if any(p is r for r in big)] == big
    assert len(parts) == 1 + 2 * len(big)


@settings(max_examples=50, deadline=None)
@given(struct_strategy(MetadataResponse), _heads)
def test_a_body_without_records_is_one_buffer(body, head) -> None:
    parts = encode_frame_parts(head, body)
    assert parts == [frame(head + encode_body(body))]


def test_a_record_set_holding_marker_like_bytes_is_carried_untouched() -> None:
    """A peer cannot forge the marker (random per process); bytes that merely look
    like a MessagePack bin 8 of 16 bytes stay as they are."""
    lookalike = (b"\xc4\x10" + b"\x00" * 16) * (SCATTER_MIN_BYTES // 18 + 1)
    small = b"\xc4\x10" + b"\x01" * 16
    body = FetchResponse(
        responses=[
            FetchTopicResponse(
                topic="t",
                partitions=[
                    FetchPartitionResponse(partition_index=0, records=small),
                    FetchPartitionResponse(partition_index=1, records=lookalike),
                ],
            )
        ]
    )
    parts = encode_frame_parts(b"head", body)
    assert b"".join(parts) == frame(b"head" + encode_body(body))


def test_server_and_client_connections_round_trip_a_scattered_fetch() -> None:
    records = b"x" * (3 * SCATTER_MIN_BYTES)
    client = ClientConnection("t")
    server = ServerConnection()
    cid, request_parts = client.send_request_parts(
        FetchRequest(topics=[FetchTopic(topic="t", partitions=[])])
    )
    for part in request_parts:
        server.receive_data(bytes(part))
    event = server.next_event()
    assert isinstance(event, Request)
    body = FetchResponse(
        responses=[
            FetchTopicResponse(
                topic="t", partitions=[FetchPartitionResponse(partition_index=0, records=records)]
            )
        ]
    )
    parts = server.send_response_parts(event, body)
    assert any(p is records for p in parts)
    (response,) = client.receive_data(b"".join(parts))
    assert response.correlation_id == cid
    assert response.body == body


def test_responses_keep_request_order_with_parts() -> None:
    server = ServerConnection()
    client = ClientConnection("t")
    for _ in range(2):
        _cid, data = client.send_request(MetadataRequest(topics=[]))
        server.receive_data(data)
    first, second = server.next_event(), server.next_event()
    assert isinstance(first, Request) and isinstance(second, Request)
    assert server.send_response_parts(second, MetadataResponse()) == []
    out = server.send_response_parts(first, MetadataResponse(controller_id=1))
    responses = client.receive_data(b"".join(out))
    assert [r.body.controller_id for r in responses] == [1, -1]  # type: ignore[union-attr]
