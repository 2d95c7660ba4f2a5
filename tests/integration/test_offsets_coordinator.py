"""The offsets coordinator on a real cluster (one controller, three `python -m broker`),
through a raw protocol client: FindCoordinator creates __consumer_offsets (RF 3,
internal), a commit carries the leader epoch, OffsetFetch returns it; after the
coordinator is SIGKILLed, the new leader of the group's partition becomes the
coordinator and still returns the commit. Every wait is bounded."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from cluster import Cluster, TestClient

from broker.group_coordinator import OFFSETS_TOPIC, partition_for
from protocol.errors import ErrorCode
from protocol.messages import (
    CreatableTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetCommitTopic,
    OffsetFetchRequest,
    OffsetFetchResponse,
    OffsetFetchTopic,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

GROUP = "integration-group"
TOPIC = "events"
T = TypeVar("T")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.stop_all()


async def retry(attempt: Callable[[], Awaitable[T | None]], what: str, timeout: float = 30.0) -> T:
    """Call `attempt` until it returns something (None: retriable), within `timeout`."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            result = await attempt()
        except (ConnectionError, OSError, TimeoutError) as exc:
            result, last = None, exc
        if result is not None:
            return result
        await asyncio.sleep(0.2)
    raise AssertionError(f"{what}: not done within {timeout}s (last: {last})")


async def find_coordinator(address: tuple[str, int], not_node: int = -1) -> tuple[int, str, int]:
    async def attempt() -> tuple[int, str, int] | None:
        async with TestClient(*address) as client:
            resp = await client.call(FindCoordinatorRequest(key=GROUP))
        assert isinstance(resp, FindCoordinatorResponse)
        if resp.error_code != ErrorCode.NONE:
            assert ErrorCode(resp.error_code) == ErrorCode.COORDINATOR_NOT_AVAILABLE
            return None
        if resp.node_id == not_node:
            return None
        return resp.node_id, resp.host, resp.port

    return await retry(attempt, "FindCoordinator")


def commit_request(offset: int, leader_epoch: int, metadata: str) -> OffsetCommitRequest:
    return OffsetCommitRequest(
        group_id=GROUP,
        topics=[
            OffsetCommitTopic(
                name=TOPIC,
                partitions=[
                    OffsetCommitPartition(
                        partition_index=1,
                        committed_offset=offset,
                        committed_leader_epoch=leader_epoch,
                        committed_metadata=metadata,
                    )
                ],
            )
        ],
    )


async def commit(address: tuple[str, int], offset: int, epoch: int, metadata: str) -> None:
    async def attempt() -> bool | None:
        async with TestClient(*address) as client:
            resp = await client.call(commit_request(offset, epoch, metadata))
        assert isinstance(resp, OffsetCommitResponse)
        code = ErrorCode(resp.topics[0].partitions[0].error_code)
        if code == ErrorCode.NONE:
            return True
        assert code.retriable, code
        return None

    await retry(attempt, "OffsetCommit")


async def fetch_committed(address: tuple[str, int]) -> tuple[int, int, str | None]:
    async def attempt() -> tuple[int, int, str | None] | None:
        async with TestClient(*address) as client:
            resp = await client.call(
                OffsetFetchRequest(
                    group_id=GROUP, topics=[OffsetFetchTopic(name=TOPIC, partition_indexes=[1])]
                )
            )
        assert isinstance(resp, OffsetFetchResponse)
        if resp.error_code != ErrorCode.NONE:
            assert ErrorCode(resp.error_code).retriable, resp.error_code
            return None
        p = resp.topics[0].partitions[0]
        assert p.error_code == ErrorCode.NONE
        return p.committed_offset, p.committed_leader_epoch, p.metadata

    return await retry(attempt, "OffsetFetch")


async def offsets_partition_leader(address: tuple[str, int], index: int) -> tuple[int, int]:
    async with TestClient(*address) as client:
        resp = await client.call(MetadataRequest(topics=[OFFSETS_TOPIC]))
    assert isinstance(resp, MetadataResponse)
    topic = resp.topics[0]
    assert topic.is_internal
    assert len(topic.partitions) == 10
    p = topic.partitions[index]
    assert len(p.replica_nodes) == 3
    return p.leader_id, p.leader_epoch


async def scenario(cluster: Cluster) -> None:
    first = cluster.brokers[1].address
    async with TestClient(*first) as client:
        created = await client.call(
            CreateTopicsRequest(
                topics=[CreatableTopic(name=TOPIC, num_partitions=2, replication_factor=3)]
            )
        )
    assert isinstance(created, CreateTopicsResponse)
    assert created.topics[0].error_code == ErrorCode.NONE

    node, host, port = await find_coordinator(first)
    index = partition_for(GROUP, 10)
    leader, epoch = await offsets_partition_leader(first, index)
    assert leader == node
    coordinator = (host, port)
    await commit(coordinator, 1234, 5, "checkpoint-a")
    assert await fetch_committed(coordinator) == (1234, 5, "checkpoint-a")

    # A broker that is not the coordinator refuses commits.
    other = next(b.address for n, b in cluster.brokers.items() if n != node)
    async with TestClient(*other) as client:
        resp = await client.call(commit_request(1, 1, "x"))
    assert isinstance(resp, OffsetCommitResponse)
    assert resp.topics[0].partitions[0].error_code == ErrorCode.NOT_COORDINATOR

    cluster.brokers[node].kill()
    new_node, new_host, new_port = await find_coordinator(other, not_node=node)
    assert new_node != node
    new_leader, new_epoch = await offsets_partition_leader(other, index)
    assert new_leader == new_node and new_epoch > epoch
    new_coordinator = (new_host, new_port)
    assert await fetch_committed(new_coordinator) == (1234, 5, "checkpoint-a")
    # The new coordinator takes commits too (RF 3, min ISR 2, two brokers alive).
    await commit(new_coordinator, 2000, 6, "checkpoint-b")
    assert await fetch_committed(new_coordinator) == (2000, 6, "checkpoint-b")


def test_commits_survive_the_loss_of_the_coordinator(cluster: Cluster) -> None:
    cluster.start_controller(session_timeout_ms=3000)
    for node in (1, 2, 3):
        cluster.start_broker(node, "--replica-lag-time-max-ms", "1500")
    asyncio.run(scenario(cluster))
    for node, proc in cluster.brokers.items():
        if proc.alive:
            assert "Traceback" not in proc.log_text(), f"broker {node}:\n{proc.tail()}"
