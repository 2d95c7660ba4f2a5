"""The client library against real processes (one controller, three brokers): a
normal leader failover under a running consumer raises nothing (no false truncation
alarm, auto_offset_reset='none') and loses nothing; the sync API from a plain thread."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from cluster import Cluster

from client.admin import AsyncAdmin
from client.consumer import AsyncConsumer
from client.producer import AsyncProducer
from client.sync import Consumer
from client.sync import Producer
from client.types import TopicPartition

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TOPIC = "lib"
TP = TopicPartition(TOPIC, 0)


@pytest.fixture
def cluster(cluster: Cluster) -> Cluster:
    """conftest's cluster with a controller (3 s sessions) and brokers 1, 2, 3."""
    cluster.start_controller(session_timeout_ms=3000)
    cluster.start_brokers((1, 2, 3))
    return cluster


def bootstrap(cluster: Cluster) -> str:
    return ",".join(f"{h}:{p}" for h, p in (b.address for b in cluster.brokers.values()))


async def leader_of(admin: AsyncAdmin) -> tuple[int, int]:
    await admin.cluster.refresh_metadata([TOPIC])
    return admin.cluster.leader_for(TP)


async def test_failover_under_a_running_consumer(cluster: Cluster) -> None:
    servers = bootstrap(cluster)
    async with AsyncAdmin(servers) as admin:
        await admin.create_topic(TOPIC, 1, 3, {"min.insync.replicas": "2"})
        deadline = time.monotonic() + 30
        while True:
            try:
                leader, epoch = await leader_of(admin)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
    got: list[bytes] = []
    async with (
        AsyncProducer(servers, linger_ms=0, retry_backoff_ms=50) as producer,
        AsyncConsumer(servers, auto_offset_reset="none", retry_backoff_ms=50) as consumer,
    ):
        consumer.assign([TP])
        consumer.seek(TP, 0)
        for i in range(20):
            await producer.send_and_wait(TOPIC, b"before-%d" % i, partition=0)
        while len(got) < 20:
            for records in (await consumer.poll(timeout_ms=1000)).values():
                got.extend(r.value for r in records)  # type: ignore[misc]
        cluster.brokers[leader].kill()
        futures = [await producer.send(TOPIC, b"after-%d" % i, partition=0) for i in range(20)]
        deadline = time.monotonic() + 60
        while len(got) < 40 and time.monotonic() < deadline:
            for records in (await consumer.poll(timeout_ms=1000)).values():
                got.extend(r.value for r in records)  # type: ignore[misc]
        results = await asyncio.gather(*futures)
        position = await consumer.position_with_epoch(TP)
    assert got == [b"before-%d" % i for i in range(20)] + [b"after-%d" % i for i in range(20)]
    assert [md.offset for md in results] == list(range(20, 40))
    assert position.offset == 40 and position.leader_epoch > epoch


def test_sync_api_from_a_plain_thread(cluster: Cluster) -> None:
    servers = bootstrap(cluster)
    errors: list[BaseException] = []
    values: list[bytes] = []

    def script() -> None:
        try:
            with Producer(servers, linger_ms=0) as producer:
                for i in range(10):
                    producer.send_and_wait("sync", b"v%d" % i, partition=0)
                batch = producer.create_batch()  # filled on this thread, sent whole
                for i in range(10, 15):
                    assert batch.append(value=b"v%d" % i) == i - 10
                first = producer.send_batch(batch, "sync", partition=0).result(30)
                assert (first.partition, first.offset) == (0, 10)
            with Consumer(servers, auto_offset_reset="earliest") as consumer:
                consumer.assign([TopicPartition("sync", 0)])
                deadline = time.monotonic() + 30
                while len(values) < 15 and time.monotonic() < deadline:
                    for records in consumer.poll(500).values():
                        values.extend(r.value for r in records)  # type: ignore[misc]
        except BaseException as exc:
            errors.append(exc)

    async def create() -> None:
        async with AsyncAdmin(servers) as admin:
            await admin.create_topic("sync", 1, 3)

    asyncio.run(create())
    thread = threading.Thread(target=script)
    thread.start()
    thread.join(90)
    assert not errors, errors
    assert values == [b"v%d" % i for i in range(15)]


async def create_and_fill(servers: str, topic: str, n: int) -> None:
    """A 1-partition topic holding values v000000.. in 4 KiB batches."""
    async with AsyncAdmin(servers) as admin:
        await admin.create_topic(topic, 1, 1)
    async with AsyncProducer(servers, linger_ms=0, batch_size=4096) as producer:
        for i in range(n):
            await producer.send(topic, b"v%06d" % i, partition=0)
        await producer.flush()


def test_sync_poll_batches_many_fetches_in_order(cluster: Cluster) -> None:
    """Consumer.poll_batches (sync) over many small fetches, each prefetched while the
    caller works: every record once, in order, position just past the last one."""
    servers = bootstrap(cluster)
    tp = TopicPartition("syncb", 0)
    n = 3000

    asyncio.run(create_and_fill(servers, "syncb", n))
    offsets: list[int] = []
    values: list[bytes | None] = []
    # 4 KiB per partition per fetch: dozens of fetches, each sent before the
    # previous answer's columns are handed out.
    with Consumer(
        servers, auto_offset_reset="earliest", max_partition_fetch_bytes=4096
    ) as consumer:
        consumer.assign([tp])
        deadline = time.monotonic() + 60
        while len(offsets) < n and time.monotonic() < deadline:
            for got_tp, columns in consumer.poll_batches(500).items():
                assert got_tp == tp
                offsets.extend(columns.offsets)
                values.extend(columns.values)
                time.sleep(0.002)  # the caller's work, overlapping the next fetch
        assert consumer.position(tp) == n
    assert offsets == list(range(n))
    assert values == [b"v%06d" % i for i in range(n)]


def test_seek_while_poll_batches_prefetches(cluster: Cluster) -> None:
    """A seek() while the next fetch is in flight: the prefetched answer (for the old
    position) is dropped, the next batches start at the seeked offset."""
    servers = bootstrap(cluster)
    tp = TopicPartition("seekb", 0)
    n = 2000

    asyncio.run(create_and_fill(servers, "seekb", n))
    with Consumer(
        servers, auto_offset_reset="earliest", max_partition_fetch_bytes=4096
    ) as consumer:
        consumer.assign([tp])
        first: list[int] = []
        deadline = time.monotonic() + 30
        while not first and time.monotonic() < deadline:
            first = [o for c in consumer.poll_batches(500).values() for o in c.offsets]
        assert first and first[0] == 0
        time.sleep(0.2)  # the prefetch (from first[-1] + 1) has its answer by now
        for target in (1500, 7):
            consumer.seek(tp, target)
            got: list[int] = []
            while not got and time.monotonic() < deadline:
                got = [o for c in consumer.poll_batches(500).values() for o in c.offsets]
            assert got and got[0] == target, (target, got[:3])
            assert got == list(range(target, target + len(got)))
            assert consumer.position(tp) == got[-1] + 1
