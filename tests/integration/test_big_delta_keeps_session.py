"""A broker applying a metadata delta of many partitions keeps its session (issue 20
item 5). Creating a replica costs ~19 ms here (its directory and files, six fsyncs);
applied in one go on the event loop, 400 of them held the loop ~7 s, past the
session timeout: the controller fenced the broker, moved its leaderships away and
back, and with 10,000 partitions the leader epochs churned for minutes. The delta
now hands the loop back every 10 ms, so the heartbeats go out meanwhile.

Switched off (no yield in ReplicaTransitions.apply_delta), the controller logs
`fenced broker 1` below and the partitions' leader epochs are no longer 0."""

from __future__ import annotations

import asyncio
import time

import pytest
from cluster import Cluster

from client.admin import AsyncAdmin

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

PARTITIONS = 400
SESSION_TIMEOUT_MS = 2000


async def test_creating_hundreds_of_replicas_keeps_the_broker_unfenced(cluster: Cluster) -> None:
    cluster.start_controller(session_timeout_ms=SESSION_TIMEOUT_MS)
    broker = cluster.start_broker(1)
    async with AsyncAdmin(f"{broker.host}:{broker.port}") as admin:
        await admin.create_topic("many", PARTITIONS, 1, {})
        deadline = time.monotonic() + 60
        while "became leader" not in broker.log_text() or (
            broker.log_text().count("became leader") < PARTITIONS
        ):
            assert time.monotonic() < deadline, "the broker did not lead every partition"
            await asyncio.sleep(0.2)
        await asyncio.sleep(SESSION_TIMEOUT_MS / 1000)  # a fencing would show by now
        (desc,) = await admin.describe_topics(["many"], include_offsets=False)
    controller_log = cluster.controller.log_text() if cluster.controller else ""
    assert "fenced broker 1" not in controller_log, controller_log[-2000:]
    assert [p.leader for p in desc.partitions] == [1] * PARTITIONS
    assert {p.leader_epoch for p in desc.partitions} == {0}
