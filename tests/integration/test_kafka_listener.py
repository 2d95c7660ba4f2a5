"""Kafka's own clients, unmodified, against a three-broker cluster through the brokers'
Kafka listeners (issue 15).

- kafka-python 3.0.12 connects (ApiVersions, downgrading from v4), produces idempotently
  with acks=all and every compression codec, reads everything back exactly once with
  assigned partitions, reads the watermarks, creates and deletes topics with its admin,
  and commits and resumes with a group id; minibroker's consumer reads the batches
  kafka-python wrote (xerial-framed snappy included), and the reverse.
- confluent-kafka 2.16.1 (librdkafka) creates a topic, produces with every codec,
  consumes with leader epochs and commits with the leader epoch.
- The Kafka listener serves the broker's one implementation: a Kafka Fetch at a stale
  or future leader epoch is refused with FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH, as
  a native one is; hostile bytes close one connection only.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import struct
import sys
import time
import zlib
from collections.abc import Iterator

import pytest
from cluster import Cluster
from confluent_kafka import Consumer as ConfluentConsumer
from confluent_kafka import Producer as ConfluentProducer
from confluent_kafka import TopicPartition as ConfluentTopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin import NewTopic as ConfluentNewTopic
from kafka import KafkaAdminClient
from kafka import KafkaConsumer
from kafka import KafkaProducer
from kafka import TopicPartition as KTopicPartition
from kafka.admin import NewTopic
from kafka.errors import TopicAlreadyExistsError

from client import AsyncAdmin
from client import AsyncConsumer
from client import AsyncProducer
from client.types import TopicPartition
from protocol.errors import ErrorCode
from protocol.kafka.apis import FETCH
from protocol.kafka.apis import KAFKA_APIS
from protocol.kafka.apis import PRODUCE
from protocol.kafka.apis import KafkaApi
from protocol.kafka.codec import decode_response
from protocol.kafka.codec import encode_request
from protocol.messages import FetchPartition
from protocol.messages import FetchRequest
from protocol.messages import FetchResponse
from protocol.messages import FetchTopic
from protocol.messages import Message
from protocol.messages import ProducePartition
from protocol.messages import ProduceRequest
from protocol.messages import ProduceResponse
from protocol.messages import ProduceTopic
from tests.integration.cluster import REPO
from tests.integration.test_connection_bounds import rss_bytes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TOPIC = "kafka-clients"
PARTITIONS = 3
CODECS = [None, "gzip", "snappy", "lz4", "zstd"]
PER_CODEC = 40


@pytest.fixture
def cluster(cluster: Cluster) -> Iterator[Cluster]:
    """conftest's cluster: a controller and brokers 1, 2, 3, each with a Kafka listener;
    the topic on all three with min.insync.replicas 2. kafka-python's own threads log
    noise at shutdown: kept out of the test's output."""
    cluster.start_controller()
    cluster.start_brokers((1, 2, 3), kafka=True)
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    yield cluster


def native_bootstrap(cluster: Cluster) -> str:
    return ",".join(f"{h}:{p}" for h, p in (b.address for b in cluster.brokers.values()))


async def create_topic(cluster: Cluster) -> None:
    from client import NewTopic

    async with AsyncAdmin(native_bootstrap(cluster)) as admin:
        await admin.create_topics(
            [NewTopic(TOPIC, PARTITIONS, 3, {"min.insync.replicas": "2"})], timeout_ms=20_000
        )


def kafka_python_values(cluster: Cluster, expected: int) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of every record, read with kafka-python."""
    consumer = KafkaConsumer(
        bootstrap_servers=cluster.kafka_bootstrap(),
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        consumer_timeout_ms=5_000,
    )
    try:
        consumer.assign([KTopicPartition(TOPIC, p) for p in range(PARTITIONS)])
        got: list[tuple[int, int, bytes]] = []
        for message in consumer:
            got.append((message.partition, message.offset, message.value))
            if len(got) >= expected:
                break
        return got
    finally:
        consumer.close()


def assert_exactly_once(got: list[tuple[int, int, bytes]], sent: list[bytes]) -> None:
    """Every record sent read once, none twice, at contiguous offsets from 0."""
    assert sorted(v for _, _, v in got) == sorted(sent), "every record once, none twice"
    per_partition: dict[int, list[int]] = {}
    for partition, offset, _ in got:
        per_partition.setdefault(partition, []).append(offset)
    for offsets in per_partition.values():
        assert sorted(offsets) == list(range(len(offsets))), "contiguous offsets from 0"


async def test_kafka_python_produces_with_every_codec_and_reads_back_exactly_once(
    cluster: Cluster,
) -> None:
    await create_topic(cluster)
    sent: list[bytes] = []
    for codec in CODECS:
        producer = KafkaProducer(
            bootstrap_servers=cluster.kafka_bootstrap(),
            acks="all",
            enable_idempotence=True,
            compression_type=codec,
            linger_ms=5,
        )
        try:
            values = [f"{codec}-{i}".encode() for i in range(PER_CODEC)]
            futures = [producer.send(TOPIC, key=v, value=v) for v in values]
            producer.flush(timeout=30)
            for future in futures:
                metadata = future.get(timeout=30)
                assert metadata.offset >= 0
            sent += values
        finally:
            producer.close(timeout=10)

    assert_exactly_once(kafka_python_values(cluster, len(sent)), sent)

    # minibroker's consumer reads what kafka-python wrote, every codec's batches.
    async with AsyncConsumer(native_bootstrap(cluster), auto_offset_reset="earliest") as ours:
        ours.assign([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
        ours.seek_to_beginning()
        read: list[bytes] = []
        while len(read) < len(sent):
            batch = await ours.poll(timeout_ms=5_000)
            assert batch, f"minibroker's consumer stalled at {len(read)} of {len(sent)}"
            read += [r.value for records in batch.values() for r in records]
    assert sorted(read) == sorted(sent)

    # Watermarks through ListOffsets on the Kafka listener.
    consumer = KafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap())
    try:
        tps = [KTopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        ends = consumer.end_offsets(tps)
        starts = consumer.beginning_offsets(tps)
    finally:
        consumer.close()
    assert sum(ends.values()) == len(sent)
    assert set(starts.values()) == {0}


async def test_kafka_python_reads_what_minibroker_produced(cluster: Cluster) -> None:
    await create_topic(cluster)
    sent = [f"native-{i}".encode() for i in range(60)]
    for codec in ("none", "gzip", "snappy", "lz4", "zstd"):
        async with AsyncProducer(native_bootstrap(cluster), compression_type=codec) as producer:
            for value in sent[:12]:
                await producer.send_and_wait(TOPIC, value=value + codec.encode())
    got = kafka_python_values(cluster, 60)
    assert sorted(v for _, _, v in got) == sorted(
        v + c.encode() for c in ("none", "gzip", "snappy", "lz4", "zstd") for v in sent[:12]
    )


async def test_hostile_bytes_close_one_connection_and_the_listener_serves_on(
    cluster: Cluster,
) -> None:
    """A lying frame length, a header that is not Kafka's, an API the listener does not
    serve, a body that does not decode: each closes its own connection (no answer
    Kafka's protocol could carry), and a real client is served right after."""
    await create_topic(cluster)
    host, port = cluster.brokers[1].kafka_address.split(":")
    version4 = bytes.fromhex("0012000400000001ffff")  # ApiVersions v4 header, no body
    hostile = [
        b"\x7f\xff\xff\xff" + b"x" * 64,  # a 2 GiB frame
        b"\x00\x00\x00\x02\x00\x01",  # a frame too short for a header
        b"\x00\x00\x00\x0a" + bytes.fromhex("7f0000000000000affff"),  # api key 32512
        b"\x00\x00\x00\x0e" + bytes.fromhex("0003000900000003ffff") + b"\xff\xff\xff\xff",
    ]
    for payload in hostile:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(payload)
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 10) == b"", payload  # closed, unanswered
        writer.close()

    # ApiVersions at a version the broker does not know: answered at v0 with the ranges.
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(len(version4).to_bytes(4, "big") + version4)
    size = int.from_bytes(await asyncio.wait_for(reader.readexactly(4), 10), "big")
    answer = await reader.readexactly(size)
    writer.close()
    assert answer[:4] == (1).to_bytes(4, "big")  # the correlation id
    assert answer[4:6] == (35).to_bytes(2, "big")  # UNSUPPORTED_VERSION

    assert len(kafka_python_values(cluster, 0)) == 0  # served: an empty topic reads empty
    producer = KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap(), acks="all")
    try:
        assert producer.send(TOPIC, b"after").get(timeout=30).offset == 0
    finally:
        producer.close(timeout=10)


def test_the_container_healthcheck_probes_a_kafka_listener_in_kafkas_protocol(
    cluster: Cluster,
) -> None:
    """docker/healthcheck.py asks each listener ApiVersions in the protocol it speaks."""
    sys.path.insert(0, str(REPO / "docker"))
    try:
        import healthcheck
    finally:
        sys.path.pop(0)
    broker = cluster.brokers[1]
    host, port = broker.kafka_address.split(":")
    setting = f"PLAINTEXT://{broker.host}:{broker.port},KAFKA://{host}:{port}"
    targets = healthcheck.probe_addresses("broker", setting, {"KAFKA"})
    assert [t.kafka for t in targets] == [False, True]
    deadline = time.monotonic() + 10
    native, kafka = (healthcheck.probe(t, deadline) for t in targets)
    assert kafka == len(KAFKA_APIS)  # every Kafka API this broker serves
    assert native > kafka  # the native listener serves the inter-broker APIs too


def test_kafka_python_admin_creates_and_deletes_topics(cluster: Cluster) -> None:
    """KafkaAdminClient sends CreateTopics / DeleteTopics to the node Metadata names as
    controller: a broker, which forwards them to minibroker's controller."""
    admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap(), request_timeout_ms=20_000)
    try:
        admin.create_topics(
            [
                NewTopic("by-kafka-admin", 2, 3, topic_configs={"min.insync.replicas": "2"}),
                NewTopic("defaults", -1, -1),
            ]
        )
        assert {"by-kafka-admin", "defaults"} <= set(admin.list_topics())
        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topics([NewTopic("by-kafka-admin", 1, 1)])
        admin.delete_topics(["defaults"])
    finally:
        admin.close()
    consumer = KafkaConsumer(bootstrap_servers=cluster.kafka_bootstrap())
    try:
        assert consumer.partitions_for_topic("by-kafka-admin") == {0, 1}
    finally:
        consumer.close()


async def test_kafka_python_commits_and_resumes_at_the_commit(cluster: Cluster) -> None:
    """Offsets without group membership (assigned partitions, generation -1): committed
    through the Kafka listener on the same coordinator as the native listener's, with
    the leader epoch, and a new consumer of the group resumes there."""
    await create_topic(cluster)
    producer = KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap(), acks="all")
    try:
        for i in range(10):
            producer.send(TOPIC, value=f"r{i}".encode(), partition=0)
        producer.flush(timeout=30)
    finally:
        producer.close(timeout=10)
    tp = KTopicPartition(TOPIC, 0)

    def consumer() -> KafkaConsumer:
        c = KafkaConsumer(
            bootstrap_servers=cluster.kafka_bootstrap(),
            group_id="kafka-readers",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            consumer_timeout_ms=5_000,
        )
        c.assign([tp])
        return c

    first = consumer()
    try:
        read = [m.value for m in itertools.islice(first, 4)]
        assert read == [b"r0", b"r1", b"r2", b"r3"]
        first.commit()
        committed = first.committed(tp, metadata=True)
        assert committed.offset == 4 and committed.leader_epoch >= 0
    finally:
        first.close()

    second = consumer()
    try:
        assert [m.value for m in itertools.islice(second, 6)] == [
            f"r{i}".encode() for i in range(4, 10)
        ]
    finally:
        second.close()

    # minibroker's consumer of the same group sees the same commit.
    async with AsyncConsumer(native_bootstrap(cluster), group_id="kafka-readers") as ours:
        committed_natively = await ours.committed(TopicPartition(TOPIC, 0))
    assert committed_natively is not None and committed_natively.offset == 4


def test_confluent_kafka_creates_produces_with_every_codec_reads_and_commits(
    cluster: Cluster,
) -> None:
    """librdkafka 2.16 (confluent-kafka 2.16.1): its admin creates the topic, its
    idempotent acks=all producer writes with every codec, its consumer reads everything
    once with the leader epochs (Metadata v9: librdkafka's KIP-320 checks are on), and
    commits with the leader epoch."""
    bootstrap = cluster.kafka_bootstrap()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    created = admin.create_topics(
        [ConfluentNewTopic(TOPIC, PARTITIONS, 3, config={"min.insync.replicas": "2"})]
    )
    created[TOPIC].result(timeout=30)

    sent: list[bytes] = []
    failures: list[object] = []
    for codec in ("none", "gzip", "snappy", "lz4", "zstd"):
        producer = ConfluentProducer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "compression.type": codec,
                "linger.ms": 5,
            }
        )
        values = [f"{codec}-{i}".encode() for i in range(PER_CODEC)]
        for value in values:
            producer.produce(
                TOPIC, key=value, value=value, on_delivery=lambda e, m: e and failures.append(e)
            )
        assert producer.flush(30) == 0, "undelivered records"
        sent += values
    assert failures == []

    consumer = ConfluentConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "confluent-readers",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([ConfluentTopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
        got: list[tuple[int, int, bytes]] = []
        epochs: set[int | None] = set()
        deadline = time.monotonic() + 60
        while len(got) < len(sent) and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            assert message.error() is None, message.error()
            got.append((message.partition(), message.offset(), message.value()))
            epochs.add(message.leader_epoch())
        assert_exactly_once(got, sent)
        assert epochs == {0}, "every record carries its leader epoch"
        consumer.commit(asynchronous=False)
        (committed,) = consumer.committed([ConfluentTopicPartition(TOPIC, 0)], timeout=10)
        low, high = consumer.get_watermark_offsets(ConfluentTopicPartition(TOPIC, 0), timeout=10)
    finally:
        consumer.close()
    assert (committed.offset, committed.leader_epoch) == (high, 0)
    assert low == 0 and high == sum(1 for p, _, _ in got if p == 0)


async def kafka_request(address: str, api: KafkaApi, version: int, body: Message) -> Message:
    """One request in Kafka's protocol over a raw socket, as any Kafka client sends it."""
    host, port = address.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(encode_request(api, version, 1, "raw-kafka", body))
        size = int.from_bytes(await asyncio.wait_for(reader.readexactly(4), 10), "big")
        return decode_response(api, version, await reader.readexactly(size))[1]
    finally:
        writer.close()


async def test_a_kafka_fetch_at_a_stale_or_future_epoch_is_fenced(cluster: Cluster) -> None:
    """KIP-320 fencing on the Kafka listener, the same code path as the native one: the
    first leader stops (a controlled shutdown moves leadership, bumping the epoch), then
    a Kafka Fetch at the old epoch is FENCED_LEADER_EPOCH and one at the next epoch
    UNKNOWN_LEADER_EPOCH; -1 skips the check."""
    await create_topic(cluster)
    tp = TopicPartition(TOPIC, 0)
    async with AsyncAdmin(native_bootstrap(cluster)) as admin:
        await admin.cluster.refresh_metadata([TOPIC])
        first, old_epoch = admin.cluster.leader_for(tp)
        assert cluster.brokers[first].terminate() == 0
        deadline = time.monotonic() + 30
        while True:
            await admin.cluster.refresh_metadata([TOPIC])
            leader, epoch = admin.cluster.leader_for(tp)
            if leader not in (first, -1) and epoch > old_epoch:
                break
            assert time.monotonic() < deadline, "no new leader after a controlled shutdown"
            await asyncio.sleep(0.2)
    answers = {}
    for name, current in (
        ("stale", old_epoch),
        ("none", -1),
        ("current", epoch),
        ("next", epoch + 1),
    ):
        partition = FetchPartition(partition=0, current_leader_epoch=current, fetch_offset=0)
        request = FetchRequest(
            max_wait_ms=0, topics=[FetchTopic(topic=TOPIC, partitions=[partition])]
        )
        response = await kafka_request(cluster.brokers[leader].kafka_address, FETCH, 12, request)
        assert isinstance(response, FetchResponse)
        answers[name] = response.responses[0].partitions[0].error_code
    assert answers == {
        "stale": ErrorCode.FENCED_LEADER_EPOCH,
        "none": ErrorCode.NONE,
        "current": ErrorCode.NONE,
        "next": ErrorCode.UNKNOWN_LEADER_EPOCH,
    }


async def test_old_message_formats_are_refused_and_nothing_is_stored(cluster: Cluster) -> None:
    """Produce v0-2 are advertised (librdkafka 2.0 turns compression off otherwise) but
    carry the pre-0.11 message formats, which no reader here could read: refused per
    partition, never stored."""
    await create_topic(cluster)
    body = struct.pack(">bbqii", 1, 0, 0, -1, 5) + b"hello"  # magic 1, no key
    message = struct.pack(">I", zlib.crc32(body)) + body
    message_set = struct.pack(">qi", 0, len(message)) + message
    async with AsyncAdmin(native_bootstrap(cluster)) as admin:
        await admin.cluster.refresh_metadata([TOPIC])
        leader, _ = admin.cluster.leader_for(TopicPartition(TOPIC, 0))
    for version in (2, 3):
        partition = ProducePartition(index=0, records=memoryview(message_set))
        request = ProduceRequest(
            acks=1, timeout_ms=5_000, topics=[ProduceTopic(name=TOPIC, partitions=[partition])]
        )
        answer = await kafka_request(
            cluster.brokers[leader].kafka_address, PRODUCE, version, request
        )
        assert isinstance(answer, ProduceResponse)
        assert answer.topics[0].partitions[0].error_code == ErrorCode.CORRUPT_MESSAGE
    assert kafka_python_values(cluster, 1) == []


async def test_a_kafka_client_that_never_reads_does_not_pin_the_brokers_memory(
    cluster: Cluster,
) -> None:
    """The connection bounds hold on a Kafka listener too (the codec is a parameter of
    the same ServerConnection): 40 pipelined Fetch v12 requests for ~20 MB each whose
    answers are never read grow the broker by at most one answer's worth, and a real
    Kafka client is served meanwhile."""
    await create_topic(cluster)
    async with AsyncProducer(native_bootstrap(cluster), acks=1, batch_size=1_000_000) as producer:
        for _ in range(20_000):
            await producer.send(TOPIC, b"v" * 1000, partition=0)
        await producer.flush()
        await producer.cluster.refresh_metadata([TOPIC])
        leader, _ = producer.cluster.leader_for(TopicPartition(TOPIC, 0))
        leader_address = cluster.brokers[leader].kafka_address
    broker = cluster.brokers[leader]
    baseline = rss_bytes(broker.pid)
    host, port = leader_address.split(":")
    attacker = socket.socket()
    attacker.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    attacker.connect((host, int(port)))
    try:
        partition = FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=2**31 - 1)
        fetch = FetchRequest(
            max_wait_ms=0,
            max_bytes=2**31 - 1,
            topics=[FetchTopic(topic=TOPIC, partitions=[partition])],
        )
        attacker.sendall(
            b"".join(encode_request(FETCH, 12, i, "never-reads", fetch) for i in range(40))
        )
        peak = baseline
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            peak = max(peak, rss_bytes(broker.pid))
            await asyncio.sleep(0.2)
        # Another Kafka client is served meanwhile.
        assert len(kafka_python_values(cluster, 10)) == 10
    finally:
        attacker.close()
    assert peak - baseline < 300e6, f"the broker grew by {(peak - baseline) / 1e6:.0f} MB"
