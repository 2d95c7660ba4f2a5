"""Client quotas on real processes (issue 18): set with `minibroker quota`, stored by the
controller in the metadata log, enforced by the broker on its Kafka listener against
real Kafka clients (confluent-kafka: its throttle callback reports the broker's
throttle_time_ms), with short quota windows (2 x 1 s) so each scenario takes seconds.

- a greedy producer with a producer_byte_rate quota is held to about its rate while a
  second one (another client id) keeps going at its own pace;
- a consumer with a consumer_byte_rate quota reads at about its rate;
- a raw client that ignores throttle_time_ms (Produce back to back) is held to its
  quota by the broker's mute alone (without the mute: 13.5 MB/s against 100 kB/s);
- a client hammering Metadata under request_percentage=0.1 is throttled and held back
  (~280 requests in 4 s) while a client id without a quota gets ~15,000 (without the
  mute: as many as the other);
- quotas survive a restart of the controller (from a snapshot) and of the broker;
- bad input is refused with a message saying what is wrong.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer as ConfluentConsumer
from confluent_kafka import Producer as ConfluentProducer
from confluent_kafka import TopicPartition as ConfluentTopicPartition

from client import AsyncAdmin
from client import NewTopic
from controller.metadata_log import MetadataLog
from protocol.messages import MetadataRequest
from protocol.messages import MetadataResponse
from protocol.messages import ProducePartition
from protocol.messages import ProduceRequest
from protocol.messages import ProduceResponse
from protocol.messages import ProduceTopic
from protocol.metadata_records import ClientQuotaRecord
from protocol.record_batch import encode_batch
from tests.integration.cluster import Cluster
from tests.integration.cluster import TestClient
from tests.integration.cluster import mb

pytestmark = pytest.mark.integration

QUOTA_WINDOWS = ("--quota-window-num", "2", "--quota-window-size-seconds", "1")
TOPIC = "quota-topic"
VALUE = b"x" * 8192
RUN_S = 4.0


def quota_rows(bootstrap: str, *filters: str) -> list[list[str]]:
    listed = mb("-b", bootstrap, "quota", "list", *filters)
    assert listed.returncode == 0, listed.stderr
    return [line.split() for line in listed.stdout.splitlines()[1:]]


def native_bootstrap(cluster: Cluster) -> str:
    return "{}:{}".format(*cluster.brokers[1].address)


async def create_topic(cluster: Cluster) -> None:
    async with AsyncAdmin(native_bootstrap(cluster)) as admin:
        await admin.create_topics([NewTopic(TOPIC, 1, 1)], timeout_ms=20_000)


class Throttles:
    """What librdkafka's throttle callback reported (the broker's throttle_time_ms)."""

    def __init__(self) -> None:
        self.times_ms: list[int] = []

    def __call__(self, event: object) -> None:
        self.times_ms.append(int(event.throttle_time * 1000))  # type: ignore[attr-defined]


def produce_flat_out(
    bootstrap: str, client_id: str, seconds: float, out: dict[str, object]
) -> None:
    """Produce as fast as the client lets us for `seconds`; the bytes acknowledged per
    second and the throttles seen go to `out`."""
    throttles = Throttles()
    acked = [0]

    def delivered(err: object, msg: object) -> None:
        if err is None:
            acked[0] += len(VALUE)

    producer = ConfluentProducer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "linger.ms": 5,
            "batch.size": 32768,  # requests small beside the quota: a smooth rate
            # Kafka's broker serves one request of a connection at a time; this one
            # serves several at once, so a pipelining client gets its whole pipeline
            # in before the first throttle (README, "Quotas").
            "max.in.flight.requests.per.connection": 1,
            "acks": 1,
            "throttle_cb": throttles,
            "queue.buffering.max.kbytes": 1024,
        }
    )
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        try:
            producer.produce(TOPIC, VALUE, on_delivery=delivered)
        except BufferError:
            producer.poll(0.01)
        producer.poll(0)
    elapsed = time.monotonic() - start
    rate = acked[0] / elapsed
    producer.flush(15)
    out[client_id] = (rate, throttles.times_ms)


async def test_a_greedy_producer_is_held_to_its_quota_while_another_keeps_its_rate(
    cluster: Cluster,
) -> None:
    """Invariant: a client id's produce rate stays about its producer_byte_rate, and
    the quota costs the other clients nothing."""
    cluster.start_controller()
    cluster.start_broker(1, *QUOTA_WINDOWS, kafka=True)
    await create_topic(cluster)
    quota = 200_000
    bootstrap = native_bootstrap(cluster)
    done = mb(
        "-b",
        bootstrap,
        "quota",
        "set",
        "--client-id",
        "greedy",
        f"producer_byte_rate={quota}",
    )
    assert done.returncode == 0, done.stderr
    assert quota_rows(bootstrap) == [["-", "greedy", "producer_byte_rate", str(quota)]]

    out: dict[str, object] = {}
    threads = [
        threading.Thread(
            target=produce_flat_out, args=(cluster.kafka_bootstrap(), name, RUN_S, out)
        )
        for name in ("greedy", "free")
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    greedy_rate, greedy_throttles = out["greedy"]  # type: ignore[misc]
    free_rate, free_throttles = out["free"]  # type: ignore[misc]
    # A burst of one window goes before the first throttle: at most ~(4 + 1) / 4.
    assert 0.4 * quota < greedy_rate < 1.6 * quota, (greedy_rate, free_rate)
    assert greedy_throttles and max(greedy_throttles) > 0, "throttle_time_ms reached the client"
    assert free_throttles == [], "no quota, no throttle"
    assert free_rate > 3 * quota, (greedy_rate, free_rate)


async def test_a_consumer_is_held_to_its_consumer_byte_rate(cluster: Cluster) -> None:
    """Invariant: a user's consumer fetches at about its consumer_byte_rate (the
    default user's quota applies to the anonymous user of a plaintext listener)."""
    cluster.start_controller()
    cluster.start_broker(1, *QUOTA_WINDOWS, kafka=True)
    await create_topic(cluster)
    out: dict[str, object] = {}
    produce_flat_out(cluster.kafka_bootstrap(), "filler", 2.0, out)
    filled, _ = out["filler"]  # type: ignore[misc]
    assert filled * 2.0 > 2_000_000, "enough to read for longer than the run"
    quota = 300_000
    bootstrap = native_bootstrap(cluster)
    done = mb("-b", bootstrap, "quota", "set", "--user-default", f"consumer_byte_rate={quota}")
    assert done.returncode == 0, done.stderr
    throttles = Throttles()
    consumer = ConfluentConsumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap(),
            "group.id": "quota-readers",
            "client.id": "reader",
            "enable.auto.commit": False,
            "throttle_cb": throttles,
            "fetch.max.bytes": 1_048_576,
        }
    )
    try:
        consumer.assign([ConfluentTopicPartition(TOPIC, 0, 0)])
        read = 0
        start = time.monotonic()
        while time.monotonic() - start < RUN_S:
            for message in consumer.consume(num_messages=1000, timeout=0.2):
                if message.error() is None:
                    read += len(message.value())
        rate = read / (time.monotonic() - start)
    finally:
        consumer.close()
    assert 0.4 * quota < rate < 1.6 * quota, rate
    assert throttles.times_ms and max(throttles.times_ms) > 0


def stored_quotas(data_dir: Path) -> list[ClientQuotaRecord]:
    _, recovered = MetadataLog.open(data_dir)
    records = [*recovered.snapshot_records, *(e.record for e in recovered.entries)]
    return [r for r in records if isinstance(r, ClientQuotaRecord)]


def test_quotas_survive_restarts_and_bad_input_is_refused(cluster: Cluster) -> None:
    """Invariant: quotas are metadata records, replayed by a restarted controller (from
    its snapshot) and broker; a bad entity, key or value changes nothing and says why."""
    cluster.start_controller("--snapshot-every", "2")
    cluster.start_broker(1)
    bootstrap = native_bootstrap(cluster)
    for args in (
        ("--user", "alice", "producer_byte_rate=1048576", "consumer_byte_rate=2097152"),
        ("--user", "alice", "--client-id", "app", "request_percentage=50"),
        ("--client-id-default", "producer_byte_rate=500000"),
    ):
        done = mb("-b", bootstrap, "quota", "set", *args)
        assert done.returncode == 0, done.stderr
    expected = [
        ["alice", "app", "request_percentage", "50"],
        ["-", "<default>", "producer_byte_rate", "500000"],
        ["alice", "-", "consumer_byte_rate", "2097152"],
        ["alice", "-", "producer_byte_rate", "1048576"],
    ]
    assert sorted(quota_rows(bootstrap)) == sorted(expected)
    assert quota_rows(bootstrap, "--client-id", "app") == [
        ["alice", "app", "request_percentage", "50"]
    ]

    cluster.controller.terminate()  # type: ignore[union-attr]
    assert len(stored_quotas(cluster.root / "controller")) >= 4
    cluster.start_controller("--snapshot-every", "2")
    cluster.brokers[1].terminate()
    cluster.start_broker(1)
    assert sorted(quota_rows(bootstrap)) == sorted(expected), "kept across restarts"

    removed = mb("-b", bootstrap, "quota", "remove", "--user", "alice", "producer_byte_rate")
    assert removed.returncode == 0, removed.stderr
    assert ["alice", "-", "producer_byte_rate", "1048576"] not in quota_rows(bootstrap)

    refusals = {
        ("--user", "bob", "producer_byte_rate=-5"): "must be positive",
        ("--user", "bob", "produce_byte_rate=5"): "unknown quota key 'produce_byte_rate'",
        ("--user", "bob", "producer_byte_rate=1.5"): "whole number",
        ("--user", "bob", "producer_byte_rate=fast"): "is not a number",
        ("--user", "bob", "controller_mutation_rate=5"): "not supported",
        ("producer_byte_rate=5",): "give --user and/or --client-id",
        ("--user", "bob", "--user-default", "producer_byte_rate=5"): "give one",
    }
    for args, message in refusals.items():
        refused = mb("-b", bootstrap, "quota", "set", *args)
        assert refused.returncode != 0 and message in refused.stderr, (args, refused.stderr)
    assert not any("bob" in row for row in quota_rows(bootstrap)), "nothing written"


# ---------------------------------------------------------------- clients that ignore throttles


async def produce_back_to_back(
    client: TestClient, client_id: str, seconds: float
) -> tuple[float, list[int]]:
    """A client that ignores throttle_time_ms: one Produce after another, each sent as
    soon as the previous one is answered, for `seconds`. The record bytes acknowledged
    per second, and the throttle times the answers carried."""
    client.conn.client_id = client_id
    records = encode_batch([(None, VALUE, (), None)])
    request = ProduceRequest(
        acks=1,
        timeout_ms=5000,
        topics=[ProduceTopic(name=TOPIC, partitions=[ProducePartition(index=0, records=records)])],
    )
    acked = 0
    throttles: list[int] = []
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        answer = await client.call(request, timeout=30)
        assert isinstance(answer, ProduceResponse)
        assert answer.topics[0].partitions[0].error_code == 0, answer
        acked += len(records)
        throttles.append(answer.throttle_time_ms)
    return acked / (time.monotonic() - start), throttles


async def test_a_client_that_ignores_throttles_is_held_by_the_broker_mute(
    cluster: Cluster,
) -> None:
    """Invariant: a client id's produce rate stays about its producer_byte_rate even
    when the client ignores throttle_time_ms, because the broker reads nothing more
    from its connection for the throttle time (KIP-219's mute, runtime/server.py);
    another client id on the same broker keeps its own rate. Without the mute the
    ignoring client produced at many times its quota."""
    cluster.start_controller()
    broker = cluster.start_broker(1, *QUOTA_WINDOWS)
    await create_topic(cluster)
    quota = 100_000
    bootstrap = native_bootstrap(cluster)
    done = mb("-b", bootstrap, "quota", "set", "--client-id", "rude", f"producer_byte_rate={quota}")
    assert done.returncode == 0, done.stderr
    async with TestClient(*broker.address) as rude, TestClient(*broker.address) as polite:
        (rude_rate, rude_throttles), (free_rate, free_throttles) = await asyncio.gather(
            produce_back_to_back(rude, "rude", RUN_S),
            produce_back_to_back(polite, "free", RUN_S),
        )
    # One window's burst goes before the first throttle: about (4 + 1) / 4 of the quota.
    assert rude_rate < 1.6 * quota, (
        f"a client ignoring throttles produced {rude_rate:.0f} B/s against a quota of {quota}"
    )
    assert max(rude_throttles) > 0, "its answers carried throttle_time_ms"
    assert free_rate > 5 * quota and max(free_throttles) == 0, (free_rate, rude_rate)


async def metadata_back_to_back(client: TestClient, client_id: str, seconds: float) -> list[int]:
    """Metadata requests one after another for `seconds`; the throttle time of each answer."""
    client.conn.client_id = client_id
    throttles: list[int] = []
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        answer = await client.call(MetadataRequest(topics=[TOPIC]), timeout=30)
        assert isinstance(answer, MetadataResponse)
        throttles.append(answer.throttle_time_ms)
    return throttles


async def test_request_percentage_holds_back_a_client_hammering_cheap_requests(
    cluster: Cluster,
) -> None:
    """Invariant: a client id with a request_percentage quota gets throttle_time_ms > 0
    once its requests' handling time passes its share of the broker's loop, and is
    held back (muted) while a client id without a quota is served at full speed."""
    cluster.start_controller()
    broker = cluster.start_broker(1, *QUOTA_WINDOWS)
    await create_topic(cluster)
    bootstrap = native_bootstrap(cluster)
    # 0.1% of a second: about 1 ms of handler time a second.
    done = mb("-b", bootstrap, "quota", "set", "--client-id", "hammer", "request_percentage=0.1")
    assert done.returncode == 0, done.stderr
    async with TestClient(*broker.address) as hammer, TestClient(*broker.address) as calm:
        hammer_throttles, calm_throttles = await asyncio.gather(
            metadata_back_to_back(hammer, "hammer", RUN_S),
            metadata_back_to_back(calm, "calm", RUN_S),
        )
    throttled = [t for t in hammer_throttles if t > 0]
    assert throttled, f"{len(hammer_throttles)} Metadata requests, none throttled"
    # A request_percentage throttle is at most one quota window (1 s here).
    assert max(throttled) <= 1000, max(throttled)
    assert calm_throttles and max(calm_throttles) == 0, "no quota, no throttle"
    assert len(hammer_throttles) * 5 < len(calm_throttles), (
        f"the hammer got {len(hammer_throttles)} requests served in {RUN_S:g} s, "
        f"the client without a quota {len(calm_throttles)}"
    )
