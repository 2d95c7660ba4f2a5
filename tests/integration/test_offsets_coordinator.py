"""The offsets coordinator on a real cluster (one controller, three `python -m broker`),
through a raw protocol client: FindCoordinator creates __consumer_offsets (RF 3,
internal), a commit carries the leader epoch, OffsetFetch returns it; after the
coordinator is SIGKILLed, the new leader of the group's partition becomes the
coordinator and still returns the commit. Every wait is bounded."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from collections.abc import Callable
from typing import TypeVar

import pytest
from cluster import Cluster
from cluster import TestClient

from broker.group_coordinator import OFFSETS_TOPIC
from broker.group_coordinator import partition_for
from client import AsyncConsumer
from client import OffsetAndMetadata
from client import TopicPartition
from client.errors import KafkaTimeoutError
from client.errors import OffsetMetadataTooLargeError
from protocol.api import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import CreatableTopic
from protocol.messages import CreateTopicsRequest
from protocol.messages import CreateTopicsResponse
from protocol.messages import FaultControlRequest
from protocol.messages import FaultControlResponse
from protocol.messages import FaultRule
from protocol.messages import FindCoordinatorRequest
from protocol.messages import FindCoordinatorResponse
from protocol.messages import MetadataRequest
from protocol.messages import MetadataResponse
from protocol.messages import OffsetCommitPartition
from protocol.messages import OffsetCommitRequest
from protocol.messages import OffsetCommitResponse
from protocol.messages import OffsetCommitTopic
from protocol.messages import OffsetFetchRequest
from protocol.messages import OffsetFetchResponse
from protocol.messages import OffsetFetchTopic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

GROUP = "integration-group"
TOPIC = "events"
T = TypeVar("T")


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


async def create_topic(address: tuple[str, int]) -> None:
    async with TestClient(*address) as client:
        created = await client.call(
            CreateTopicsRequest(
                topics=[CreatableTopic(name=TOPIC, num_partitions=2, replication_factor=3)]
            )
        )
    assert isinstance(created, CreateTopicsResponse)
    assert created.topics[0].error_code == ErrorCode.NONE


async def scenario(cluster: Cluster) -> None:
    first = cluster.brokers[1].address
    await create_topic(first)

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
    cluster.start_brokers((1, 2, 3), "--replica-lag-time-max-ms", "1500")
    asyncio.run(scenario(cluster))
    for node, proc in cluster.brokers.items():
        if proc.alive:
            assert "Traceback" not in proc.log_text(), f"broker {node}:\n{proc.tail()}"


# ---------------------------------------------------------------------------------------
# The client library's commit() / committed(): retriable errors are retried with backoff
# and a new FindCoordinator, bounded by timeout_ms; other errors raise at once.


async def coordinator_faults(
    cluster: Cluster, node: int, *rules: FaultRule, clear: bool = False
) -> FaultControlResponse:
    async with TestClient(*cluster.brokers[node].address) as client:
        resp = await client.call(FaultControlRequest(clear=clear, add_rules=list(rules)))
    assert isinstance(resp, FaultControlResponse) and resp.error_code == 0, resp
    return resp


async def library_commit_scenario(cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    await create_topic(cluster.brokers[1].address)
    bootstrap = ",".join(f"{h}:{p}" for h, p in (b.address for b in cluster.brokers.values()))
    tp = TopicPartition(TOPIC, 1)
    async with AsyncConsumer(
        bootstrap, group_id=GROUP, retry_backoff_ms=50, default_api_timeout_ms=40_000
    ) as consumer:
        consumer.assign([tp])
        # The first commit meets __consumer_offsets being created and loaded
        # (COORDINATOR_NOT_AVAILABLE / LOAD_IN_PROGRESS): retried, not raised.
        await consumer.commit({tp: OffsetAndMetadata(10, "a", 0)})
        assert await consumer.committed(tp) == OffsetAndMetadata(10, "a", 0)
        node, _, _ = await find_coordinator(cluster.brokers[1].address)

        # Lost requests at the coordinator: two OffsetCommit and two OffsetFetch dropped.
        await coordinator_faults(
            cluster,
            node,
            FaultRule(api_key=int(ApiKey.OFFSET_COMMIT), action="drop", remaining=2),
            FaultRule(api_key=int(ApiKey.OFFSET_FETCH), action="drop", remaining=2),
        )
        await consumer.commit({tp: OffsetAndMetadata(20, "b", 0)})
        assert await consumer.committed(tp) == OffsetAndMetadata(20, "b", 0)
        assert (await coordinator_faults(cluster, node)).rules == [], "the drops did not fire"
        assert "OffsetCommit failed" in caplog.text and "OffsetFetch failed" in caplog.text

        # The coordinator dies: NOT_COORDINATOR / unreachable until the new leader of the
        # group's __consumer_offsets partition takes over; commit() rides it out.
        await asyncio.to_thread(cluster.brokers[node].kill)
        await consumer.commit({tp: OffsetAndMetadata(30, "c", 1)})
        assert await consumer.committed(tp) == OffsetAndMetadata(30, "c", 1)
        other = next(b.address for n, b in cluster.brokers.items() if n != node)
        new_node, _, _ = await find_coordinator(other, not_node=node)

        # A non-retriable error raises at once, naming the partition.
        started = time.monotonic()
        with pytest.raises(OffsetMetadataTooLargeError, match=f"{TOPIC}-1"):
            await consumer.commit({tp: OffsetAndMetadata(40, "x" * 5000, 1)})
        assert time.monotonic() - started < 5

        # Every retry is bounded: a coordinator that never answers -> KafkaTimeoutError.
        await coordinator_faults(
            cluster, new_node, FaultRule(api_key=int(ApiKey.OFFSET_COMMIT), action="drop")
        )
        started = time.monotonic()
        with pytest.raises(KafkaTimeoutError, match="within 1500 ms"):
            await consumer.commit({tp: OffsetAndMetadata(50, "d", 1)}, timeout_ms=1500)
        assert time.monotonic() - started < 10
        await coordinator_faults(cluster, new_node, clear=True)
        assert await consumer.committed(tp) == OffsetAndMetadata(30, "c", 1)


def test_library_commit_retries_through_lost_requests_and_coordinator_loss(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="client.consumer")
    cluster.start_controller(session_timeout_ms=2000)
    cluster.start_brokers((1, 2, 3), "--enable-test-faults", "--replica-lag-time-max-ms", "1500")
    asyncio.run(library_commit_scenario(cluster, caplog))
