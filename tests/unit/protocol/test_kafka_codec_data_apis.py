"""Produce, Fetch, ListOffsets and OffsetForLeaderEpoch in the Kafka codec, against
kafka-python 3.0.12's protocol classes (the oracle): at every version served that
kafka-python speaks, a message kafka-python encodes decodes here to the native message
with the epoch fields the seeds are about (Fetch current_leader_epoch v9+,
last_fetched_epoch and the DivergingEpoch / CurrentLeader tagged fields v12,
ListOffsets leader epochs v4+, OffsetForLeaderEpoch current_leader_epoch), and encoding
it again here gives kafka-python's bytes exactly.
"""

from __future__ import annotations

from typing import Any

import pytest
from kafka.protocol.consumer import FetchRequest as KFetchRequest
from kafka.protocol.consumer import FetchResponse as KFetchResponse
from kafka.protocol.consumer import ListOffsetsRequest as KListOffsetsRequest
from kafka.protocol.consumer import ListOffsetsResponse as KListOffsetsResponse
from kafka.protocol.consumer import OffsetForLeaderEpochRequest as KEpochRequest
from kafka.protocol.consumer import OffsetForLeaderEpochResponse as KEpochResponse
from kafka.protocol.producer import ProduceRequest as KProduceRequest
from kafka.protocol.producer import ProduceResponse as KProduceResponse

from protocol.connection import DecodedRequest
from protocol.framing import RequestHeader
from protocol.kafka.apis import FETCH
from protocol.kafka.apis import LIST_OFFSETS
from protocol.kafka.apis import OFFSET_FOR_LEADER_EPOCH
from protocol.kafka.apis import PRODUCE
from protocol.kafka.apis import KafkaApi
from protocol.kafka.codec import decode_request
from protocol.kafka.codec import decode_response
from protocol.kafka.codec import encode_request
from protocol.kafka.codec import encode_response
from protocol.messages import EpochEndOffset
from protocol.messages import FetchRequest
from protocol.messages import FetchResponse
from protocol.messages import LeaderIdAndEpoch
from protocol.messages import ListOffsetsRequest
from protocol.messages import ListOffsetsResponse
from protocol.messages import OffsetForLeaderEpochRequest
from protocol.messages import OffsetForLeaderEpochResponse
from protocol.messages import ProduceRequest
from protocol.messages import ProduceResponse
from tests.unit.protocol.test_kafka_codec import CLIENT_ID
from tests.unit.protocol.test_kafka_codec import CORRELATION_ID
from tests.unit.protocol.test_kafka_codec import kafka_python_request
from tests.unit.protocol.test_kafka_codec import kafka_python_response

RECORDS = b"\x00" * 61 + b"record-batch-bytes"  # opaque to the codec
BIG_RECORDS = bytes(range(256)) * 80  # above the writer's scatter threshold


def request_both_ways(api: KafkaApi, message: Any, version: int) -> Any:
    """The native request kafka-python's bytes decode to; re-encoded, the same bytes."""
    theirs = kafka_python_request(message, version)
    got = decode_request(theirs)
    assert isinstance(got, DecodedRequest), got
    assert got.header == RequestHeader(int(api.key), version, CORRELATION_ID, CLIENT_ID)
    assert encode_request(api, version, CORRELATION_ID, CLIENT_ID, got.body)[4:] == theirs
    return got.body


def response_both_ways(api: KafkaApi, message: Any, version: int) -> Any:
    theirs = kafka_python_response(message, version)
    correlation_id, body = decode_response(api, version, theirs)
    assert correlation_id == CORRELATION_ID
    header = RequestHeader(int(api.key), version, CORRELATION_ID, CLIENT_ID)
    assert b"".join(encode_response(header, body))[4:] == theirs
    return body


# ------------------------------------------------------------------ Produce


@pytest.mark.parametrize("version", range(3, PRODUCE.max_version + 1))  # kafka-python: 3+
@pytest.mark.parametrize("records", [RECORDS, BIG_RECORDS], ids=["small", "big"])
def test_produce(version: int, records: bytes) -> None:
    topic = KProduceRequest.TopicProduceData
    message = KProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout_ms=30_000,
        topic_data=[
            topic(
                name="orders",
                partition_data=[topic.PartitionProduceData(index=2, records=records)],
            )
        ],
    )
    body = request_both_ways(PRODUCE, message, version)
    assert isinstance(body, ProduceRequest)
    assert (body.acks, body.timeout_ms, body.transactional_id) == (-1, 30_000, None)
    partition = body.topics[0].partitions[0]
    assert (body.topics[0].name, partition.index, bytes(partition.records)) == (
        "orders",
        2,
        records,
    )
    assert partition.current_leader_epoch == -1  # Kafka's Produce carries no epoch

    r = KProduceResponse.TopicProduceResponse
    answer = KProduceResponse(
        responses=[
            r(
                name="orders",
                partition_responses=[
                    r.PartitionProduceResponse(
                        index=2,
                        error_code=0,
                        base_offset=41,
                        log_append_time_ms=-1,
                        log_start_offset=3,
                        record_errors=[],
                        error_message=None,
                    )
                ],
            )
        ],
        throttle_time_ms=0,
    )
    back = response_both_ways(PRODUCE, answer, version)
    assert isinstance(back, ProduceResponse)
    part = back.topics[0].partitions[0]
    assert (part.index, part.base_offset) == (2, 41)
    assert part.log_start_offset == (3 if version >= 5 else -1)


# ------------------------------------------------------------------ Fetch


def k_fetch_request(version: int) -> Any:
    t = KFetchRequest.FetchTopic
    return KFetchRequest(
        replica_id=-1,
        max_wait_ms=500,
        min_bytes=1,
        max_bytes=52_428_800,
        isolation_level=1,
        session_id=0,
        session_epoch=-1,
        topics=[
            t(
                topic="orders",
                partitions=[
                    t.FetchPartition(
                        partition=0,
                        current_leader_epoch=5,
                        fetch_offset=100,
                        last_fetched_epoch=4,
                        log_start_offset=-1,
                        partition_max_bytes=1_048_576,
                    )
                ],
            )
        ],
        forgotten_topics_data=[],
        rack_id="",
    )


@pytest.mark.parametrize("version", range(FETCH.min_version, FETCH.max_version + 1))
def test_fetch_request(version: int) -> None:
    body = request_both_ways(FETCH, k_fetch_request(version), version)
    assert isinstance(body, FetchRequest)
    assert (body.replica_id, body.max_wait_ms, body.isolation_level) == (-1, 500, 1)
    p = body.topics[0].partitions[0]
    assert (p.partition, p.fetch_offset, p.partition_max_bytes) == (0, 100, 1_048_576)
    assert p.current_leader_epoch == (5 if version >= 9 else -1)
    assert p.last_fetched_epoch == (4 if version >= 12 else -1)


def k_fetch_response(diverging: bool, records: bytes) -> Any:
    t = KFetchResponse.FetchableTopicResponse
    d = t.PartitionData
    extra: dict[str, Any] = {}
    if diverging:
        extra["diverging_epoch"] = d.EpochEndOffset(epoch=3, end_offset=90)
        extra["current_leader"] = d.LeaderIdAndEpoch(leader_id=2, leader_epoch=5)
    return KFetchResponse(
        throttle_time_ms=0,
        error_code=0,
        session_id=0,
        responses=[
            t(
                topic="orders",
                partitions=[
                    d(
                        partition_index=0,
                        error_code=0,
                        high_watermark=120,
                        last_stable_offset=120,
                        log_start_offset=7,
                        aborted_transactions=None,
                        preferred_read_replica=-1,
                        records=records,
                        **extra,
                    )
                ],
            )
        ],
    )


@pytest.mark.parametrize("version", range(FETCH.min_version, FETCH.max_version + 1))
@pytest.mark.parametrize("records", [RECORDS, BIG_RECORDS], ids=["small", "big"])
def test_fetch_response(version: int, records: bytes) -> None:
    back = response_both_ways(FETCH, k_fetch_response(False, records), version)
    assert isinstance(back, FetchResponse)
    p = back.responses[0].partitions[0]
    assert (p.partition_index, p.high_watermark, bytes(p.records)) == (0, 120, records)
    assert p.log_start_offset == (7 if version >= 5 else -1)
    assert p.diverging_epoch == EpochEndOffset()


def test_fetch_v12_diverging_epoch_and_current_leader_tags() -> None:
    """KIP-320 through Fetch v12: the diverging epoch (tag 0), which kafka-python turns
    into a truncation, and the current leader (tag 1), which librdkafka reads."""
    back = response_both_ways(FETCH, k_fetch_response(True, b""), 12)
    p = back.responses[0].partitions[0]
    assert p.diverging_epoch == EpochEndOffset(epoch=3, end_offset=90)
    assert p.current_leader == LeaderIdAndEpoch(leader_id=2, leader_epoch=5)
    assert bytes(p.records) == b""


def test_fetch_response_never_sends_null_records() -> None:
    """kafka-python crashes on null records: an empty record set goes out as empty."""
    answer = FetchResponse(responses=[])
    header = RequestHeader(int(FETCH.key), 12, CORRELATION_ID, CLIENT_ID)
    raw = b"".join(encode_response(header, answer))[4:]
    assert KFetchResponse.decode(raw, version=12, header=True).responses == []
    native = decode_response(FETCH, 11, kafka_python_response(k_fetch_response(False, b""), 11))[1]
    p = native.responses[0].partitions[0]
    header = RequestHeader(int(FETCH.key), 11, CORRELATION_ID, CLIENT_ID)
    raw = b"".join(encode_response(header, native))[4:]
    assert (
        KFetchResponse.decode(raw, version=11, header=True).responses[0].partitions[0].records
        == b""
    )
    assert bytes(p.records) == b""


# ------------------------------------------------------------------ ListOffsets


@pytest.mark.parametrize("version", range(LIST_OFFSETS.min_version, LIST_OFFSETS.max_version + 1))
def test_list_offsets(version: int) -> None:
    t = KListOffsetsRequest.ListOffsetsTopic
    message = KListOffsetsRequest(
        replica_id=-1,
        isolation_level=0,
        topics=[
            t(
                name="orders",
                partitions=[
                    t.ListOffsetsPartition(partition_index=1, current_leader_epoch=6, timestamp=-2)
                ],
            )
        ],
    )
    body = request_both_ways(LIST_OFFSETS, message, version)
    assert isinstance(body, ListOffsetsRequest)
    p = body.topics[0].partitions[0]
    assert (p.partition_index, p.timestamp) == (1, -2)
    assert p.current_leader_epoch == (6 if version >= 4 else -1)

    r = KListOffsetsResponse.ListOffsetsTopicResponse
    answer = KListOffsetsResponse(
        throttle_time_ms=0,
        topics=[
            r(
                name="orders",
                partitions=[
                    r.ListOffsetsPartitionResponse(
                        partition_index=1, error_code=0, timestamp=-1, offset=7, leader_epoch=6
                    )
                ],
            )
        ],
    )
    back = response_both_ways(LIST_OFFSETS, answer, version)
    assert isinstance(back, ListOffsetsResponse)
    part = back.topics[0].partitions[0]
    assert part.offset == 7
    assert part.leader_epoch == (6 if version >= 4 else -1)


# ------------------------------------------------------------------ OffsetForLeaderEpoch


@pytest.mark.parametrize(
    "version",
    range(OFFSET_FOR_LEADER_EPOCH.min_version, OFFSET_FOR_LEADER_EPOCH.max_version + 1),
)
def test_offset_for_leader_epoch(version: int) -> None:
    t = KEpochRequest.OffsetForLeaderTopic
    message = KEpochRequest(
        replica_id=-1,
        topics=[
            t(
                topic="orders",
                partitions=[
                    t.OffsetForLeaderPartition(partition=0, current_leader_epoch=5, leader_epoch=3)
                ],
            )
        ],
    )
    body = request_both_ways(OFFSET_FOR_LEADER_EPOCH, message, version)
    assert isinstance(body, OffsetForLeaderEpochRequest)
    p = body.topics[0].partitions[0]
    assert (p.partition, p.current_leader_epoch, p.leader_epoch) == (0, 5, 3)

    r = KEpochResponse.OffsetForLeaderTopicResult
    answer = KEpochResponse(
        throttle_time_ms=0,
        topics=[
            r(
                topic="orders",
                partitions=[
                    r.EpochEndOffset(error_code=0, partition=0, leader_epoch=3, end_offset=90)
                ],
            )
        ],
    )
    back = response_both_ways(OFFSET_FOR_LEADER_EPOCH, answer, version)
    assert isinstance(back, OffsetForLeaderEpochResponse)
    part = back.topics[0].partitions[0]
    assert (part.leader_epoch, part.end_offset) == (3, 90)
