"""Idempotent produce (KIP-98) across real processes: InitProducerId, a batch whose
response is lost (drop_response) and resent is written once and answered with its
original offset; after the leader of an RF=3 acks=all topic is SIGKILLed, the new
leader still deduplicates the retry; a restarted broker keeps its producer state
(snapshot after a clean stop, rebuild from batch headers after SIGKILL)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster import Cluster, TestClient

from protocol.api import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import (
    CreatableTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DescribeReplicaLogRequest,
    DescribeReplicaLogResponse,
    FaultControlRequest,
    FaultControlResponse,
    FaultRule,
    InitProducerIdRequest,
    InitProducerIdResponse,
    MetadataPartition,
    MetadataRequest,
    MetadataResponse,
    ProducePartition,
    ProducePartitionResponse,
    ProduceRequest,
    ProduceResponse,
    ProduceTopic,
)
from protocol.record_batch import BatchBuilder

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TOPIC = "idempotent"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        for proc in c.brokers.values():
            if proc.alive:
                os.kill(proc.pid, signal.SIGCONT)
        c.stop_all()


def batch(pid: int, seq: int, records: int = 3) -> bytes:
    builder = BatchBuilder(producer_id=pid, producer_epoch=0, base_sequence=seq)
    for i in range(records):
        builder.append(f"value-{seq + i}".encode())
    return builder.build()


def produce_request(records: bytes, *, acks: int = -1) -> ProduceRequest:
    return ProduceRequest(
        acks=acks,
        timeout_ms=5000,
        topics=[ProduceTopic(name=TOPIC, partitions=[ProducePartition(index=0, records=records)])],
    )


async def produce(address: tuple[str, int], records: bytes, **kw: int) -> ProducePartitionResponse:
    async with TestClient(*address) as client:
        resp = await client.call(produce_request(records, **kw), timeout=20)
    assert isinstance(resp, ProduceResponse)
    return resp.topics[0].partitions[0]


async def create_topic(address: tuple[str, int], rf: int) -> None:
    async with TestClient(*address) as client:
        resp = await client.call(
            CreateTopicsRequest(
                topics=[
                    CreatableTopic(
                        name=TOPIC,
                        num_partitions=1,
                        replication_factor=rf,
                        configs={"min.insync.replicas": str(min(rf, 2))},
                    )
                ]
            )
        )
    assert isinstance(resp, CreateTopicsResponse)
    assert resp.topics[0].error_code == 0, resp.topics[0].error_message


async def init_producer_id(address: tuple[str, int]) -> int:
    async with TestClient(*address) as client:
        resp = await client.call(InitProducerIdRequest())
    assert isinstance(resp, InitProducerIdResponse)
    assert resp.error_code == 0 and resp.producer_epoch == 0 and resp.producer_id >= 0
    return resp.producer_id


async def wait_partition(cluster: Cluster, predicate, *, what: str) -> MetadataPartition:
    deadline = time.monotonic() + 30
    last = None
    while time.monotonic() < deadline:
        for proc in cluster.brokers.values():
            if not proc.alive:
                continue
            try:
                async with TestClient(*proc.address) as client:
                    md = await client.call(MetadataRequest(topics=[TOPIC]))
                assert isinstance(md, MetadataResponse)
                if md.topics and md.topics[0].error_code == 0:
                    last = md.topics[0].partitions[0]
                    if predicate(last):
                        return last
            except (ConnectionError, OSError, TimeoutError):
                pass
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; last {last}")


async def batches_on(address: tuple[str, int]) -> list[int]:
    async with TestClient(*address) as client:
        resp = await client.call(DescribeReplicaLogRequest(topic=TOPIC, partition=0))
    assert isinstance(resp, DescribeReplicaLogResponse)
    return [b.base_offset for b in resp.batches]


async def produce_until_accepted(
    address: tuple[str, int], records: bytes, **kw: int
) -> ProducePartitionResponse:
    """Retry retriable errors (a leader still taking over) for a bounded time."""
    deadline = time.monotonic() + 30
    while True:
        r = await produce(address, records, **kw)
        if not ErrorCode(r.error_code).retriable or time.monotonic() > deadline:
            return r
        await asyncio.sleep(0.2)


async def test_lost_response_and_leader_change_do_not_duplicate(cluster: Cluster) -> None:
    cluster.start_controller(session_timeout_ms=2000)
    for node in (1, 2, 3):
        cluster.start_broker(node, "--enable-test-faults", "--replica-lag-time-max-ms", "1500")
    await create_topic(cluster.brokers[1].address, rf=3)
    state = await wait_partition(
        cluster, lambda p: p.leader_id >= 0 and len(p.isr_nodes) == 3, what="leader, ISR 3"
    )
    leader = cluster.brokers[state.leader_id]
    pid = await init_producer_id(cluster.brokers[1].address)

    first = await produce(leader.address, batch(pid, 0))
    assert (first.error_code, first.base_offset) == (0, 0)

    # The second batch is appended but its response is lost.
    async with TestClient(*leader.address) as admin:
        resp = await admin.call(
            FaultControlRequest(
                add_rules=[
                    FaultRule(api_key=int(ApiKey.PRODUCE), action="drop_response", remaining=1)
                ]
            )
        )
        assert isinstance(resp, FaultControlResponse) and resp.error_code == 0
    async with TestClient(*leader.address) as client:
        with pytest.raises(ConnectionError):
            await client.request(produce_request(batch(pid, 3)))
    retry = await produce(leader.address, batch(pid, 3))
    assert (retry.error_code, retry.base_offset) == (0, 3)
    assert await batches_on(leader.address) == [0, 3]  # written once

    # Out of order and unknown producers are refused.
    gap = await produce(leader.address, batch(pid, 9))
    assert gap.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    stranger = await produce(leader.address, batch(pid + 999_999, 5))
    assert stranger.error_code == ErrorCode.UNKNOWN_PRODUCER_ID

    # Every replica has both batches; then the leader dies.
    await wait_partition(cluster, lambda p: len(p.isr_nodes) == 3, what="ISR of 3")
    for node, proc in cluster.brokers.items():
        deadline = time.monotonic() + 30
        while await batches_on(proc.address) != [0, 3]:
            assert time.monotonic() < deadline, f"broker {node} did not replicate"
            await asyncio.sleep(0.1)
    old = state.leader_id
    leader.kill()
    state = await wait_partition(
        cluster, lambda p: p.leader_id not in (-1, old), what="a new leader"
    )
    new_leader = cluster.brokers[state.leader_id]
    again = await produce_until_accepted(new_leader.address, batch(pid, 3))
    assert (again.error_code, again.base_offset) == (0, 3)
    oldest = await produce_until_accepted(new_leader.address, batch(pid, 0))
    assert (oldest.error_code, oldest.base_offset) == (0, 0)
    nxt = await produce_until_accepted(new_leader.address, batch(pid, 6))
    assert (nxt.error_code, nxt.base_offset) == (0, 6)
    assert await batches_on(new_leader.address) == [0, 3, 6]


async def test_restarted_broker_keeps_producer_state(cluster: Cluster) -> None:
    cluster.start_controller()
    broker = cluster.start_broker(1)
    await create_topic(broker.address, rf=1)
    await wait_partition(cluster, lambda p: p.leader_id == 1, what="leader")
    pid = await init_producer_id(broker.address)
    for seq in (0, 3):
        r = await produce_until_accepted(broker.address, batch(pid, seq))
        assert (r.error_code, r.base_offset) == (0, seq)

    # Clean stop: the state is in a snapshot at the log end.
    assert broker.terminate() == 0
    snapshots = sorted(p.name for p in (broker.data_dir / f"{TOPIC}-0").glob("*.snapshot"))
    assert snapshots == ["00000000000000000006.snapshot"]
    broker = cluster.start_broker(1)
    await wait_partition(cluster, lambda p: p.leader_id == 1, what="leader after restart")
    r = await produce_until_accepted(broker.address, batch(pid, 3))
    assert (r.error_code, r.base_offset) == (0, 3)
    r = await produce_until_accepted(broker.address, batch(pid, 6))
    assert (r.error_code, r.base_offset) == (0, 6)

    # SIGKILL: no snapshot past offset 6; the batch at 6 is replayed from its header.
    broker.kill()
    broker = cluster.start_broker(1)
    await wait_partition(cluster, lambda p: p.leader_id == 1, what="leader after crash")
    r = await produce_until_accepted(broker.address, batch(pid, 6))
    assert (r.error_code, r.base_offset) == (0, 6)
    r = await produce_until_accepted(broker.address, batch(pid, 12))
    assert r.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert await batches_on(broker.address) == [0, 3, 6]
