"""A broker whose disk fills up or fails (issue 13, item 7), on a real small file
system (tests/small_filesystem.py: a tmpfs, so ENOSPC and EROFS come from the kernel).

Invariants:
- a broker never keeps leading partitions whose log it cannot write: the first failed
  file operation takes its log directory offline, and the controller moves its
  leaderships to the other ISR members within a heartbeat (not after a session
  timeout), so acks=all producers go on and nothing acknowledged is lost;
- the broker stays up, fenced, and says why (its log, the controller's log);
- a broker started on a full disk exits with one line that says what failed, where,
  and what to do: no traceback; once space is freed it starts and catches up.

Protection off (before the fix): the broker stays leader of its partitions and every
produce to them fails with KAFKA_STORAGE_ERROR until an operator steps in, and a
restart on the full disk dies with a raw OSError traceback.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster import Cluster

from client.admin import AsyncAdmin
from client.admin import NewTopic
from client.consumer import AsyncConsumer
from client.health import ClusterHealth
from client.producer import AsyncProducer
from client.types import TopicPartition
from tests.small_filesystem import SmallFilesystem
from tests.small_filesystem import failing_filesystem
from tests.small_filesystem import small_filesystem

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TOPIC = "disk"
PARTITIONS = 3
SMALL_DISK = 3 * 1024 * 1024
SEGMENT_BYTES = 1024 * 1024
VALUE = b"v" * 1000


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallFilesystem]:
    """Broker 1's data directory, on a file system of SMALL_DISK bytes."""
    with small_filesystem(tmp_path / "broker-1", SMALL_DISK) as fs:
        yield fs


def bootstrap(cluster: Cluster, *, but: int | None = None) -> str:
    return ",".join(
        f"{b.host}:{b.port}" for n, b in sorted(cluster.brokers.items()) if n != but and b.alive
    )


def start(cluster: Cluster) -> None:
    cluster.start_controller(session_timeout_ms=6000)
    cluster.start_brokers((1, 2, 3), "--segment-bytes", str(SEGMENT_BYTES))


async def create_topic(servers: str) -> None:
    async with AsyncAdmin(servers) as admin:
        await admin.create_topics([NewTopic(TOPIC, PARTITIONS, 3, {"min.insync.replicas": "2"})])


async def leaders_and_isrs(servers: str) -> dict[int, tuple[int, tuple[int, ...]]]:
    async with AsyncAdmin(servers) as admin:
        (topic,) = await admin.describe_topics([TOPIC])
    return {p.partition: (p.leader, p.isr) for p in topic.partitions}


async def cluster_health(servers: str) -> ClusterHealth:
    async with AsyncAdmin(servers) as admin:
        return await admin.cluster_health(probe_brokers=True)


async def offline_replicas(servers: str) -> dict[int, tuple[int, ...]]:
    async with AsyncAdmin(servers) as admin:
        (topic,) = await admin.describe_topics([TOPIC])
    return {p.partition: p.offline_replicas for p in topic.partitions}


async def produce_until_disk_fails(
    cluster: Cluster, servers: str, acked: dict[int, list[int]]
) -> None:
    """acks=all sends round-robin over the partitions until broker 1 reports its log
    directory offline, then as many again: every one of those must be acknowledged
    (by the new leaders). Records each acknowledged (partition, offset)."""
    broker = cluster.brokers[1]
    offline_at: int | None = None
    async with AsyncProducer(
        servers, acks="all", linger_ms=0, request_timeout_ms=5000, delivery_timeout_ms=20_000
    ) as producer:
        for i in range(20_000):
            meta = await producer.send_and_wait(TOPIC, VALUE, partition=i % PARTITIONS)
            acked[meta.partition].append(meta.offset)
            if offline_at is None and "is offline" in broker.log_text():
                offline_at = i
            if offline_at is not None and i >= offline_at + 300:
                return
    raise AssertionError(f"broker 1's disk never filled:\n{broker.tail()}")


async def read_all(servers: str) -> dict[int, list[int]]:
    seen: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    async with AsyncConsumer(servers, auto_offset_reset="earliest") as consumer:
        tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        end = await consumer.end_offsets(tps)
        deadline = time.monotonic() + 60
        while any(
            (seen[tp.partition][-1] + 1 if seen[tp.partition] else 0) < end[tp] for tp in tps
        ):
            assert time.monotonic() < deadline, f"could not read back to {end}: {seen.keys()}"
            for tp, records in (await consumer.poll(timeout_ms=1000)).items():
                seen[tp.partition].extend(r.offset for r in records)
    return seen


def test_a_full_disk_moves_the_brokers_leaderships_and_loses_nothing(
    cluster: Cluster, small_disk: SmallFilesystem
) -> None:
    start(cluster)
    servers = bootstrap(cluster)
    asyncio.run(create_topic(servers))
    before = asyncio.run(leaders_and_isrs(servers))
    assert any(leader == 1 for leader, _ in before.values()), before

    acked: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    asyncio.run(produce_until_disk_fails(cluster, servers, acked))

    broker = cluster.brokers[1]
    assert broker.alive, "the broker must stay up and report its failed disk"
    log_text = broker.log_text()
    assert "No space left on device (ENOSPC)" in log_text, log_text[-3000:]
    assert "free space on the file system of" in log_text
    assert "Traceback" not in log_text, log_text[-3000:]
    controller_log = cluster.controller.log_text() if cluster.controller else ""
    assert "log directory offline" in controller_log, controller_log[-2000:]

    after = asyncio.run(leaders_and_isrs(bootstrap(cluster, but=1)))
    for partition, (leader, isr) in after.items():
        assert leader in (2, 3), f"partition {partition} still led by {leader}: {after}"
        assert 1 not in isr, f"broker 1 is still in the ISR of partition {partition}: {after}"

    # Reported: `cluster health` names the broker's offline log directory and why, and
    # `topic describe` shows its replicas offline.
    health = asyncio.run(cluster_health(bootstrap(cluster, but=1)))
    assert "offline_log_dirs" in health.unhealthy_reasons, health
    (offline,) = health.offline_log_dirs
    assert offline.broker == 1 and "No space left on device (ENOSPC)" in offline.error, offline
    assert 1 in health.fenced_brokers, health
    described = asyncio.run(offline_replicas(bootstrap(cluster, but=1)))
    assert all(replicas == (1,) for replicas in described.values()), described

    # Every acknowledged record is there, at its offset, on the new leaders.
    seen = asyncio.run(read_all(bootstrap(cluster, but=1)))
    for partition, offsets in acked.items():
        missing = sorted(set(offsets) - set(seen[partition]))
        assert not missing, f"partition {partition}: acknowledged offsets lost: {missing[:10]}"

    # A restart on the still-full disk: one clear line, no traceback, exit code 1.
    broker.kill()
    cluster.start_broker(1, "--segment-bytes", str(SEGMENT_BYTES), wait=False)
    code = cluster.brokers[1].wait_exit(60)
    output = cluster.brokers[1].log_text()
    assert code == 1, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    (line,) = [ln for ln in output.splitlines() if ln.startswith("error: broker 1:")]
    assert "No space left on device (ENOSPC)" in line and str(small_disk.path) in line, line
    assert "free space on the file system of" in line, line

    # Space freed: the broker starts, recovers its logs and rejoins every ISR.
    small_disk.resize(64 * 1024 * 1024)
    cluster.start_broker(1, "--segment-bytes", str(SEGMENT_BYTES))
    deadline = time.monotonic() + 60
    while True:
        isrs = asyncio.run(leaders_and_isrs(bootstrap(cluster)))
        if all(1 in isr for _, isr in isrs.values()):
            break
        assert time.monotonic() < deadline, f"broker 1 did not rejoin the ISRs: {isrs}"
        time.sleep(0.5)


def test_a_disk_failing_with_io_errors_takes_the_log_directory_offline(
    cluster: Cluster, tmp_path: Path
) -> None:
    """EIO, a disk that fails rather than fills: the same handling."""
    with failing_filesystem(tmp_path / "broker-1", tmp_path / "broker-1.img", 64 << 20) as disk:
        check_io_errors_take_the_directory_offline(cluster, disk)


def check_io_errors_take_the_directory_offline(cluster: Cluster, disk: SmallFilesystem) -> None:
    start(cluster)
    servers = bootstrap(cluster)
    asyncio.run(create_topic(servers))

    async def produce(count: int) -> list[tuple[int, int]]:
        out = []
        async with AsyncProducer(
            servers, acks="all", linger_ms=0, request_timeout_ms=5000, delivery_timeout_ms=20_000
        ) as producer:
            for i in range(count):
                meta = await producer.send_and_wait(TOPIC, VALUE, partition=i % PARTITIONS)
                out.append((meta.partition, meta.offset))
        return out

    acked = asyncio.run(produce(30))
    disk.fail_with_io_errors()
    acked += asyncio.run(produce(300))  # all acknowledged: the leaderships moved

    broker = cluster.brokers[1]
    assert broker.alive
    assert "Input/output error (EIO)" in broker.log_text(), broker.tail()
    assert "the disk under" in broker.log_text(), broker.tail()
    after = asyncio.run(leaders_and_isrs(bootstrap(cluster, but=1)))
    assert all(leader != 1 and 1 not in isr for leader, isr in after.values()), after
    seen = asyncio.run(read_all(bootstrap(cluster, but=1)))
    lost = [(p, o) for p, o in acked if o not in set(seen[p])]
    assert not lost, f"acknowledged records lost: {lost[:10]}"


def test_a_volume_deleted_under_a_running_broker_takes_it_offline(cluster: Cluster) -> None:
    """A lost volume while the broker runs (its data directory removed: open files still
    work, every new file fails with ENOENT): the next checkpoint takes the directory
    offline and the leaderships move; acks=all producers see no error. Needs no root."""
    start(cluster)
    servers = bootstrap(cluster)
    asyncio.run(create_topic(servers))

    async def produce(first: int, count: int) -> list[tuple[int, int]]:
        async with AsyncProducer(servers, acks="all", linger_ms=0) as producer:
            out = []
            for i in range(first, first + count):
                meta = await producer.send_and_wait(TOPIC, VALUE, partition=i % PARTITIONS)
                out.append((meta.partition, meta.offset))
            return out

    acked = asyncio.run(produce(0, 60))
    shutil.rmtree(cluster.brokers[1].data_dir)
    deadline = time.monotonic() + 30
    while "is offline" not in cluster.brokers[1].log_text():
        assert time.monotonic() < deadline, cluster.brokers[1].tail()
        acked += asyncio.run(produce(len(acked), 10))
    acked += asyncio.run(produce(len(acked), 60))

    broker_log = cluster.brokers[1].log_text()
    assert "No such file or directory (ENOENT)" in broker_log, broker_log[-3000:]
    assert "Traceback" not in broker_log, broker_log[-3000:]
    after = asyncio.run(leaders_and_isrs(bootstrap(cluster, but=1)))
    assert all(leader != 1 and 1 not in isr for leader, isr in after.values()), after
    health = asyncio.run(cluster_health(bootstrap(cluster, but=1)))
    assert [d.broker for d in health.offline_log_dirs] == [1], health
    seen = asyncio.run(read_all(bootstrap(cluster, but=1)))
    lost = [(p, o) for p, o in acked if o not in set(seen[p])]
    assert not lost, f"acknowledged records lost: {lost[:10]}"
