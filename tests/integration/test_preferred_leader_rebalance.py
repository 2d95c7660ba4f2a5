"""Preferred leaders with real processes (auto.leader.rebalance.enable): a broker
SIGKILLed loses its leaderships to the survivors; restarted and back in sync, it leads
its preferred partitions again without an operator, and not one acknowledged record is
lost on the way. Without the rebalance, the survivors keep leading everything (the
load piled up after failures that `bench scale` saw at 10,000 partitions)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from collections.abc import Callable
from typing import TypeVar

import pytest
from cluster import Cluster

from client import AsyncAdmin
from client import AsyncConsumer
from client import AsyncProducer
from client import NewTopic
from client import TopicPartition

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

T = TypeVar("T")
TOPIC = "balanced"
PARTITIONS = 6


def bootstrap(cluster: Cluster, *nodes: int) -> str:
    addresses = (cluster.brokers[n].address for n in nodes or cluster.brokers)
    return ",".join(f"{host}:{port}" for host, port in addresses)


async def leaders(cluster: Cluster, *nodes: int) -> dict[int, tuple[int, int]]:
    """partition -> (leader, preferred replica)."""
    async with AsyncAdmin(bootstrap(cluster, *nodes)) as admin:
        (topic,) = await admin.describe_topics([TOPIC], include_offsets=False)
    return {p.partition: (p.leader, p.replicas[0]) for p in topic.partitions}


async def wait_for(
    what: str, check: Callable[[], Awaitable[T | bool | None]], timeout_s: float = 40.0
) -> T | bool:
    deadline = time.monotonic() + timeout_s
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


async def produce(cluster: Cluster, prefix: str, count: int) -> set[str]:
    values = {f"{prefix}-{i}" for i in range(count)}
    async with AsyncProducer(bootstrap(cluster), acks="all") as producer:
        futures = [await producer.send(TOPIC, value=v.encode()) for v in sorted(values)]
        for f in futures:
            await f
    return values


async def test_a_restarted_broker_leads_its_preferred_partitions_again(cluster: Cluster) -> None:
    cluster.start_controller("--leader-imbalance-check-interval-ms", "500", session_timeout_ms=2000)
    cluster.start_brokers((1, 2, 3))
    async with AsyncAdmin(bootstrap(cluster)) as admin:
        await admin.create_topics(
            [NewTopic(TOPIC, PARTITIONS, 3, configs={"min.insync.replicas": "2"})]
        )
    await wait_for(
        "every partition led by its preferred replica",
        lambda: _all_preferred(cluster),
    )
    sent = await produce(cluster, "before", 300)
    victim = 1
    cluster.brokers[victim].kill()
    moved = await wait_for(
        "broker 1's leaderships to move",
        lambda: _none_led_by(cluster, victim, (2, 3)),
    )
    assert any(preferred == victim for _, preferred in moved.values())
    sent |= await produce(cluster, "while-down", 300)
    cluster.start_broker(victim)
    # No operator: the controller's check gives them back once broker 1 is in sync.
    await wait_for(
        "broker 1 to lead its preferred partitions again", lambda: _all_preferred(cluster)
    )
    sent |= await produce(cluster, "after", 300)
    assert "leader rebalance: broker 1 led 0 of the 2 partitions" in cluster.controller.log_text()
    async with AsyncConsumer(
        bootstrap(cluster), group_id=None, auto_offset_reset="earliest"
    ) as consumer:
        consumer.assign([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
        got: set[str] = set()
        deadline = time.monotonic() + 30
        while got < sent and time.monotonic() < deadline:
            for records in (await consumer.poll(timeout_ms=500)).values():
                got.update(r.value.decode() for r in records if r.value is not None)
    assert got == sent  # every acknowledged record, nothing else


async def _all_preferred(cluster: Cluster) -> bool:
    return all(leader == preferred for leader, preferred in (await leaders(cluster)).values())


async def _none_led_by(
    cluster: Cluster, broker: int, others: tuple[int, ...]
) -> dict[int, tuple[int, int]] | None:
    now = await leaders(cluster, *others)
    return now if all(leader not in (broker, -1) for leader, _ in now.values()) else None
