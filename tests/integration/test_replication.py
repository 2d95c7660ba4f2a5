"""Replication across real processes: one controller and three `python -m broker` on
127.0.0.1. RF=3 topics with acks=all; replicas compared on disk (segment bytes and
leader-epoch checkpoints read with the storage classes from copies of the data
dirs); the leader killed with SIGKILL; min.insync.replicas; ISR shrink and expand
around a SIGSTOPped follower. Every wait is bounded."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from cluster import Cluster
from cluster import TestClient

from broker.storage.log import Log
from broker.storage.log import LogConfig
from protocol.errors import ErrorCode
from protocol.messages import CreatableTopic
from protocol.messages import CreateTopicsRequest
from protocol.messages import CreateTopicsResponse
from protocol.messages import ListOffsetsPartition
from protocol.messages import ListOffsetsRequest
from protocol.messages import ListOffsetsResponse
from protocol.messages import ListOffsetsTopic
from protocol.messages import MetadataPartition
from protocol.messages import MetadataRequest
from protocol.messages import MetadataResponse
from protocol.messages import OffsetForLeaderEpochRequest
from protocol.messages import OffsetForLeaderEpochResponse
from protocol.messages import OffsetForLeaderPartition
from protocol.messages import OffsetForLeaderTopic
from protocol.messages import ProducePartition
from protocol.messages import ProduceRequest
from protocol.messages import ProduceResponse
from protocol.messages import ProduceTopic
from protocol.record_batch import encode_batch
from protocol.record_batch import iter_headers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TOPIC = "replicated"
LAG_MS = 1500


def start(cluster: Cluster, *, session_timeout_ms: int = 3000, brokers: int = 3) -> None:
    cluster.start_controller(session_timeout_ms=session_timeout_ms)
    cluster.start_brokers(range(1, brokers + 1), "--replica-lag-time-max-ms", str(LAG_MS))


def any_live(cluster: Cluster, but: int | None = None) -> tuple[str, int]:
    for node, proc in sorted(cluster.brokers.items()):
        if proc.alive and node != but:
            return proc.address
    raise AssertionError("no live broker")


async def create_topic(client: TestClient, *, min_isr: int = 2) -> None:
    resp = await client.call(
        CreateTopicsRequest(
            topics=[
                CreatableTopic(
                    name=TOPIC,
                    num_partitions=1,
                    replication_factor=3,
                    configs={"min.insync.replicas": str(min_isr)},
                )
            ]
        )
    )
    assert isinstance(resp, CreateTopicsResponse)
    assert resp.topics[0].error_code == 0, resp.topics[0].error_message


async def partition_state(client: TestClient) -> MetadataPartition:
    md = await client.call(MetadataRequest(topics=[TOPIC]))
    assert isinstance(md, MetadataResponse)
    assert md.topics[0].error_code == 0, md.topics[0]
    return md.topics[0].partitions[0]


async def wait_for(
    cluster: Cluster,
    predicate,
    *,
    timeout: float = 30.0,
    what: str,
    avoid: int | None = None,
) -> MetadataPartition:
    """Poll Metadata (through a live broker) until `predicate(partition)` holds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            async with TestClient(*any_live(cluster, but=avoid)) as client:
                last = await partition_state(client)
                if predicate(last):
                    return last
        except (ConnectionError, OSError, TimeoutError, AssertionError):
            pass
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; last state {last}")


async def produce(
    cluster: Cluster, leader: int, values: list[bytes], *, acks: int = -1, timeout_ms: int = 5000
) -> ProduceResponse:
    async with TestClient(*cluster.brokers[leader].address) as client:
        resp = await client.call(
            ProduceRequest(
                acks=acks,
                timeout_ms=timeout_ms,
                topics=[
                    ProduceTopic(
                        name=TOPIC,
                        partitions=[
                            ProducePartition(
                                index=0, records=encode_batch([(None, v, (), None) for v in values])
                            )
                        ],
                    )
                ],
            ),
            timeout=timeout_ms / 1000 + 10,
        )
    assert isinstance(resp, ProduceResponse)
    return resp


def error_of(resp: ProduceResponse) -> ErrorCode:
    return ErrorCode(resp.topics[0].partitions[0].error_code)


async def offsets(cluster: Cluster, leader: int) -> tuple[int, int]:
    """(high watermark, log end offset) of the leader (ListOffsets latest as a consumer
    and as a replica)."""
    out = []
    async with TestClient(*cluster.brokers[leader].address) as client:
        for replica_id in (-1, 99):
            resp = await client.call(
                ListOffsetsRequest(
                    replica_id=replica_id,
                    topics=[
                        ListOffsetsTopic(
                            name=TOPIC,
                            partitions=[ListOffsetsPartition(partition_index=0, timestamp=-1)],
                        )
                    ],
                )
            )
            assert isinstance(resp, ListOffsetsResponse)
            r = resp.topics[0].partitions[0]
            assert r.error_code == 0, ErrorCode(r.error_code).name
            out.append(r.offset)
    return out[0], out[1]


async def fully_replicated(cluster: Cluster, leader: int, *, timeout: float = 30.0) -> int:
    """Wait until the ISR has all three replicas and the HW reached the LEO (so every
    follower fetched everything). Returns the LEO. The ISR is the leader's own view: a
    follower just resumed from SIGSTOP still answers Metadata from its image of before
    the shrink (ISR of 3), which made this return before the leader had expanded."""
    deadline = time.monotonic() + timeout
    while True:
        async with TestClient(*cluster.brokers[leader].address) as client:
            if len((await partition_state(client)).isr_nodes) == 3:
                break
        assert time.monotonic() < deadline, "the leader's ISR never had 3 replicas"
        await asyncio.sleep(0.1)
    while True:
        hw, leo = await offsets(cluster, leader)
        if hw == leo:
            return leo
        assert time.monotonic() < deadline, f"HW {hw} never reached LEO {leo}"
        await asyncio.sleep(0.05)


async def consume_all(cluster: Cluster, leader: int) -> list[bytes]:
    """Every value below the leader's high watermark, from offset 0."""
    hw, _ = await offsets(cluster, leader)
    async with TestClient(*cluster.brokers[leader].address) as client:
        values = [value for _, value in await client.read_partition(TOPIC, replica=False)]
    assert len(values) >= hw, f"read {len(values)} records below a high watermark of {hw}"
    return values


def replica_on_disk(cluster: Cluster, node: int, scratch: Path) -> tuple[bytes, list, list]:
    """(log bytes, batch headers, epoch entries) of a stopped broker's replica, read
    with the storage classes from a copy (recovery must not touch the original)."""
    src = cluster.brokers[node].data_dir / f"{TOPIC}-0"
    dst = scratch / f"node-{node}" / f"{TOPIC}-0"
    shutil.copytree(src, dst)
    lg = Log.open(dst, LogConfig(), had_clean_shutdown=False)
    try:
        data = lg.read(lg.log_start_offset, 1 << 30) if lg.log_end_offset else b""
        headers = [
            (h.base_offset, h.last_offset, h.partition_leader_epoch, h.crc)
            for _, h in iter_headers(data)
        ]
        return data, headers, lg.epoch_cache.entries
    finally:
        lg.close()


def kill_all(cluster: Cluster) -> None:
    """SIGKILL every broker at once (so no leadership moves while they stop)."""
    for proc in cluster.brokers.values():
        if proc.alive:
            os.kill(proc.pid, signal.SIGKILL)
    for proc in cluster.brokers.values():
        if proc.popen is not None:
            proc.popen.wait(15)


def assert_identical_replicas(cluster: Cluster, scratch: Path) -> list:
    replicas = {n: replica_on_disk(cluster, n, scratch) for n in sorted(cluster.brokers)}
    (data1, headers1, entries1) = replicas[1]
    for node, (data, headers, entries) in replicas.items():
        assert headers == headers1, f"broker {node}'s batches differ from broker 1's"
        assert data == data1, f"broker {node}'s log bytes differ from broker 1's"
        assert entries == entries1, f"broker {node}'s epoch cache {entries} != {entries1}"
    return entries1


# ---------------------------------------------------------------------- tests


async def test_rf3_acks_all_replicas_hold_identical_logs(cluster: Cluster, tmp_path: Path) -> None:
    start(cluster)
    async with TestClient(*any_live(cluster)) as client:
        await create_topic(client)
    p = await wait_for(cluster, lambda p: p.leader_id >= 0, what="a leader")
    assert sorted(p.replica_nodes) == [1, 2, 3] and sorted(p.isr_nodes) == [1, 2, 3]
    leader = p.leader_id
    acked = []
    for i in range(20):
        values = [f"v{i}-{j}".encode() for j in range(3)]
        resp = await produce(cluster, leader, values)
        assert error_of(resp) == ErrorCode.NONE
        assert resp.topics[0].partitions[0].base_offset == 3 * i
        acked += values
    leo = await fully_replicated(cluster, leader)
    assert leo == 60
    assert await consume_all(cluster, leader) == acked
    kill_all(cluster)
    entries = assert_identical_replicas(cluster, tmp_path / "copies")
    assert [tuple(e) for e in entries] == [(p.leader_epoch, 0)]


async def test_killed_leader_loses_no_acknowledged_record(cluster: Cluster, tmp_path: Path) -> None:
    start(cluster)
    async with TestClient(*any_live(cluster)) as client:
        await create_topic(client)
    p = await wait_for(cluster, lambda p: p.leader_id >= 0, what="a leader")
    old_leader, old_epoch = p.leader_id, p.leader_epoch
    acked: list[bytes] = []
    for i in range(10):
        value = f"before-{i}".encode()
        assert error_of(await produce(cluster, old_leader, [value])) == ErrorCode.NONE
        acked.append(value)

    cluster.brokers[old_leader].kill()  # SIGKILL
    p = await wait_for(
        cluster,
        lambda p: p.leader_id not in (-1, old_leader) and p.leader_epoch > old_epoch,
        what="a new leader from the ISR",
        avoid=old_leader,
    )
    new_leader, new_epoch = p.leader_id, p.leader_epoch
    assert old_leader not in p.isr_nodes and new_leader in p.isr_nodes
    for i in range(10):
        value = f"after-{i}".encode()
        resp = await produce(cluster, new_leader, [value])
        assert error_of(resp) == ErrorCode.NONE, error_of(resp).name
        acked.append(value)
    assert await consume_all(cluster, new_leader) == acked

    # The killed broker comes back: it reconciles by epoch, catches up and rejoins.
    restarted = cluster.start_broker(old_leader, "--replica-lag-time-max-ms", str(LAG_MS))
    await fully_replicated(cluster, new_leader, timeout=45)
    assert "fetching from broker" in restarted.log_text()
    # Produce continues with all three in the ISR.
    assert error_of(await produce(cluster, new_leader, [b"last"])) == ErrorCode.NONE
    acked.append(b"last")
    await fully_replicated(cluster, new_leader)
    assert await consume_all(cluster, new_leader) == acked
    kill_all(cluster)
    entries = assert_identical_replicas(cluster, tmp_path / "copies")
    assert [tuple(e) for e in entries] == [(old_epoch, 0), (new_epoch, 10)]


async def test_returning_leader_truncates_its_unreplicated_tail_by_epoch(
    cluster: Cluster, tmp_path: Path
) -> None:
    """KIP-101 scenario 2 with processes: the leader takes acks=1 writes its followers
    never fetched, and dies. A follower leads at a new epoch; the old leader returns,
    asks for the end of its epoch and cuts exactly its divergent tail."""
    start(cluster)
    async with TestClient(*any_live(cluster)) as client:
        await create_topic(client)
    p = await wait_for(cluster, lambda p: p.leader_id >= 0, what="a leader")
    old_leader, old_epoch = p.leader_id, p.leader_epoch
    followers = [n for n in p.replica_nodes if n != old_leader]
    acked = [f"committed-{i}".encode() for i in range(5)]
    for value in acked:
        assert error_of(await produce(cluster, old_leader, [value])) == ErrorCode.NONE
    await fully_replicated(cluster, old_leader)
    # The followers stop (well within the lag and session timeouts); the leader takes
    # three acks=1 batches nobody else has, then dies.
    for n in followers:
        os.kill(cluster.brokers[n].pid, signal.SIGSTOP)
    try:
        for i in range(3):
            resp = await produce(cluster, old_leader, [f"lost-{i}".encode()], acks=1)
            assert error_of(resp) == ErrorCode.NONE
        cluster.brokers[old_leader].kill()
    finally:
        for n in followers:
            os.kill(cluster.brokers[n].pid, signal.SIGCONT)
    p = await wait_for(
        cluster,
        lambda p: p.leader_id in followers and p.leader_epoch > old_epoch,
        what="a follower leading at a new epoch",
        avoid=old_leader,
    )
    new_leader, new_epoch = p.leader_id, p.leader_epoch
    # A long-poll the leader answered just before the followers stopped may have
    # carried the first of those batches: the new leader's epoch ends at 5 or 6.
    async with TestClient(*cluster.brokers[new_leader].address) as client:
        resp = await client.call(
            OffsetForLeaderEpochRequest(
                topics=[
                    OffsetForLeaderTopic(
                        topic=TOPIC,
                        partitions=[OffsetForLeaderPartition(partition=0, leader_epoch=old_epoch)],
                    )
                ]
            )
        )
    assert isinstance(resp, OffsetForLeaderEpochResponse)
    end = resp.topics[0].partitions[0].end_offset
    assert 5 <= end <= 6, end
    acked += [f"lost-{i}".encode() for i in range(end - 5)]
    for i in range(5):
        value = f"new-{i}".encode()
        assert error_of(await produce(cluster, new_leader, [value])) == ErrorCode.NONE
        acked.append(value)

    restarted = cluster.start_broker(old_leader, "--replica-lag-time-max-ms", str(LAG_MS))
    await fully_replicated(cluster, new_leader, timeout=45)
    text = restarted.log_text()
    assert f"has epoch {old_epoch} ending at {end} for our epoch {old_epoch}" in text
    assert f"truncated log 8 -> {end}" in text
    assert await consume_all(cluster, new_leader) == acked
    kill_all(cluster)
    entries = assert_identical_replicas(cluster, tmp_path / "copies")
    assert [tuple(e) for e in entries] == [(old_epoch, 0), (new_epoch, end)]


async def test_min_insync_replicas_with_two_brokers_down(cluster: Cluster) -> None:
    start(cluster)
    async with TestClient(*any_live(cluster)) as client:
        await create_topic(client, min_isr=2)
    p = await wait_for(cluster, lambda p: p.leader_id >= 0, what="a leader")
    leader = p.leader_id
    assert error_of(await produce(cluster, leader, [b"a"])) == ErrorCode.NONE
    for node in cluster.brokers:
        if node != leader:
            cluster.brokers[node].kill()
    await wait_for(cluster, lambda p: p.isr_nodes == [leader], what="ISR of the leader alone")
    resp = await produce(cluster, leader, [b"b"])
    assert error_of(resp) == ErrorCode.NOT_ENOUGH_REPLICAS
    assert error_of(await produce(cluster, leader, [b"c"], acks=1)) == ErrorCode.NONE


async def test_stopped_follower_leaves_and_rejoins_the_isr(cluster: Cluster) -> None:
    # A long session timeout: the controller must not fence the stopped broker; the
    # leader's lag check is what takes it out of the ISR.
    start(cluster, session_timeout_ms=20_000)
    async with TestClient(*any_live(cluster)) as client:
        await create_topic(client, min_isr=2)
    p = await wait_for(cluster, lambda p: p.leader_id >= 0, what="a leader")
    leader = p.leader_id
    follower = next(n for n in p.replica_nodes if n != leader)
    assert error_of(await produce(cluster, leader, [b"a"])) == ErrorCode.NONE
    stopped = cluster.brokers[follower]
    os.kill(stopped.pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 15
        shrunk = None
        i = 0
        while shrunk is None:
            assert time.monotonic() < deadline, "the ISR did not shrink"
            # acks=1 keeps the leader's LEO moving while the follower is stopped.
            assert error_of(await produce(cluster, leader, [f"x{i}".encode()], acks=1)) == 0
            i += 1
            async with TestClient(*cluster.brokers[leader].address) as client:
                state = await partition_state(client)
            if follower not in state.isr_nodes:
                shrunk = state
            await asyncio.sleep(0.2)
        assert sorted(shrunk.isr_nodes) == sorted(set(p.replica_nodes) - {follower})
        # acks=all still works with 2 in the ISR (min.insync.replicas=2).
        assert error_of(await produce(cluster, leader, [b"while-out"])) == ErrorCode.NONE
    finally:
        os.kill(stopped.pid, signal.SIGCONT)
    await fully_replicated(cluster, leader, timeout=30)
    assert "shrinking ISR" in cluster.brokers[leader].log_text()
    assert "expanding ISR" in cluster.brokers[leader].log_text()
