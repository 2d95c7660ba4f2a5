"""Batches that no reader can read are refused on produce (issue 13, item 2), and so
is a client's Produce to the group coordinator's __consumer_offsets.

A real broker process, sent the issue's batches over a raw socket: each one has a
sound header and a valid CRC-32C but records that no reader can read (or that a client
may not write). Each is answered INVALID_RECORD or CORRUPT_MESSAGE with a message that
names the fault, the log end offset does not move, a real consumer then reads the
partition's good records without an error, and the broker keeps serving."""

from __future__ import annotations

import pytest
from cluster import Cluster
from cluster import TestClient

from broker.group_coordinator import OFFSETS_TOPIC
from client.admin import AsyncAdmin
from client.consumer import AsyncConsumer
from client.producer import AsyncProducer
from client.types import OffsetAndMetadata
from client.types import TopicPartition
from protocol.errors import ErrorCode
from protocol.messages import ProducePartition
from protocol.messages import ProduceRequest
from protocol.messages import ProduceResponse
from protocol.messages import ProduceTopic
from protocol.record_batch import Compression
from tests.unit.protocol.record_faults import raw_batch
from tests.unit.protocol.record_faults import record
from tests.unit.protocol.record_faults import three_records
from tests.unit.protocol.record_faults import zeros_compressed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOPIC = "validated"
TP = TopicPartition(TOPIC, 0)


@pytest.fixture
def cluster(cluster: Cluster) -> Cluster:
    """conftest's cluster with a controller and broker 1."""
    cluster.start_controller()
    cluster.start_broker(1)
    return cluster


def the_issues_batches() -> list[tuple[str, bytes, ErrorCode, str]]:
    """(what, record set, answer, words the message must hold)."""
    good = raw_batch(three_records(), 3)
    invalid, corrupt = ErrorCode.INVALID_RECORD, ErrorCode.CORRUPT_MESSAGE
    garbage = bytes(range(7, 250, 3)) * 3
    return [
        ("a record count of 0", raw_batch(record(0), 0, last_offset_delta=0), invalid, "count 0"),
        ("a count that disagrees", raw_batch(three_records(), 2), invalid, "left over"),
        ("garbage under a valid CRC", raw_batch(garbage, 3), invalid, "record 0"),
        (
            "a record claiming a 1 GB value",
            raw_batch(record(0, b"tiny", value_len=1 << 30), 1),
            invalid,
            "claims a value of 1073741824 bytes",
        ),
        (
            "last_offset_delta 10^9",
            raw_batch(record(0), 1, last_offset_delta=10**9),
            invalid,
            "last_offset_delta 1000000000",
        ),
        ("the control bit", raw_batch(three_records(), 3, attributes=0x20), invalid, "control"),
        (
            "the transactional bit",
            raw_batch(three_records(), 3, attributes=0x10),
            invalid,
            "transact",
        ),
        (
            "a zstd bomb (6.4 KB -> 200 MiB)",
            raw_batch(zeros_compressed(Compression.ZSTD, 200 << 20), 1, attributes=4),
            corrupt,
            "decompresses into more than",
        ),
        (
            "a gzip bomb (204 KB -> 200 MiB)",
            raw_batch(zeros_compressed(Compression.GZIP, 200 << 20), 1, attributes=1),
            corrupt,
            "decompresses into more than",
        ),
        (
            "a good batch, then offset deltas 0, 2",
            good + raw_batch(record(0) + record(2), 2),
            invalid,
            f"batch at byte {len(good)}: record 1 has offset delta 2",
        ),
    ]


def produce_request(topic: str, records: dict[int, bytes]) -> ProduceRequest:
    """acks=all, `records` by partition."""
    partitions = [ProducePartition(index=i, records=batch) for i, batch in records.items()]
    return ProduceRequest(
        acks=-1, timeout_ms=5000, topics=[ProduceTopic(name=topic, partitions=partitions)]
    )


async def produce_raw(
    client: TestClient, records: bytes, *, topic: str = TOPIC
) -> tuple[int, str | None, int]:
    """(error code, error message, base offset) of a Produce of `records` to partition
    0 of `topic`, acks=all."""
    resp = await client.call(produce_request(topic, {0: records}))
    assert isinstance(resp, ProduceResponse)
    answer = resp.topics[0].partitions[0]
    return answer.error_code, answer.error_message, answer.base_offset


async def test_batches_no_reader_can_read_are_refused_and_consumers_keep_reading(
    cluster: Cluster,
) -> None:
    broker = cluster.brokers[1]
    host, port = broker.address
    servers = f"{host}:{port}"
    async with AsyncAdmin(servers) as admin:
        await admin.create_topic(TOPIC, 1, 1)
    async with AsyncProducer(servers, linger_ms=0) as producer:
        assert (await producer.send_and_wait(TOPIC, b"before", partition=0)).offset == 0

    async with TestClient(*broker.address) as client:
        for what, records, code, words in the_issues_batches():
            error_code, message, base_offset = await produce_raw(client, records)
            assert (error_code, base_offset) == (code, -1), (what, message)
            assert message and words in message, (what, message)

    async with AsyncProducer(servers, linger_ms=0) as producer:
        # Nothing of the refused batches moved the log end: the next record is offset 1.
        assert (await producer.send_and_wait(TOPIC, b"after", partition=0)).offset == 1
    async with AsyncConsumer(servers, auto_offset_reset="none") as consumer:
        consumer.assign([TP])
        consumer.seek(TP, 0)
        assert (await consumer.end_offsets([TP]))[TP] == 2
        got = []
        for _ in range(20):
            for records in (await consumer.poll(timeout_ms=500)).values():
                got += [(r.offset, r.value) for r in records]
            if len(got) >= 2:
                break
        assert got == [(0, b"before"), (1, b"after")]
    assert broker.alive
    assert "refused an invalid produce" in broker.log_text()


async def test_a_client_cannot_write_the_groups_topic(cluster: Cluster) -> None:
    """__consumer_offsets is the group coordinator's: a client's Produce to it is
    INVALID_TOPIC_EXCEPTION on every partition, as Kafka's (internalTopicsAllowed), and
    the groups load as before once the broker restarts. It was appended: a record the
    coordinator cannot read then stopped it loading that partition, and every group of
    the partition answered COORDINATOR_NOT_AVAILABLE for good."""
    broker = cluster.brokers[1]
    servers = "{}:{}".format(*broker.address)
    async with AsyncAdmin(servers) as admin:
        await admin.create_topic(TOPIC, 1, 1)
    async with AsyncProducer(servers, linger_ms=0) as producer:
        await producer.send_and_wait(TOPIC, b"v", partition=0)
    async with AsyncConsumer(servers, group_id="g", auto_offset_reset="earliest") as consumer:
        consumer.subscribe([TOPIC])
        assert await consumer.poll(timeout_ms=10_000)
        await consumer.commit()
    async with AsyncAdmin(servers) as admin:
        (offsets_topic,) = await admin.describe_topics([OFFSETS_TOPIC])
    junk = raw_batch(three_records(), 3)
    async with TestClient(*broker.address) as client:
        everywhere = {p.partition: junk for p in offsets_topic.partitions}
        resp = await client.call(produce_request(OFFSETS_TOPIC, everywhere))
    assert isinstance(resp, ProduceResponse)
    answers = resp.topics[0].partitions
    assert len(answers) == len(offsets_topic.partitions)
    assert {a.error_code for a in answers} == {ErrorCode.INVALID_TOPIC_EXCEPTION}, answers
    assert "only the group coordinator writes it" in (answers[0].error_message or "")
    broker.terminate()
    broker.start()
    cluster.wait_ready(broker)
    async with AsyncAdmin("{}:{}".format(*broker.address)) as admin:
        assert await admin.list_group_offsets("g") == {TP: OffsetAndMetadata(1, "", 0)}
