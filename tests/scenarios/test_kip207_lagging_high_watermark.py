"""KIP-207: a new leader whose high watermark lags the start of its epoch does not
answer ListOffsets(latest) with it (issue 13, item 6).

    "A new leader whose HW lags (logged as 'LEO 10, HW 1' while 10 records were
    acknowledged) answers latest with its lagging HW, so end_offsets() /
    seek_to_end() move back."

A follower learns the high watermark one fetch round late, so a follower elected
leader may hold acknowledged records above its own HW; it learns they are committed
only when every ISR member has fetched in its epoch. Kafka's leader answers a
consumer's "latest" (and a timestamp lookup at or past its HW) with the retriable
OFFSET_NOT_AVAILABLE until its HW reaches the start of its epoch; clients retry.

Invariant protected: the end offset a consumer is told never goes back below what was
acknowledged, across a failover; end_offsets() and seek_to_end() wait it out.

Staging, on real processes (controller + brokers 1, 2, 3; one partition, replicas
[1, 2, 3], leader 1 = A at E, followers 2 = B and 3 = C): m0 (offset 0) is replicated
everywhere (every HW 1). A parks B's next fetch, takes nine more records (offsets 1-9,
acks=all), then serves B's fetches and drops their answers: the records reach B, A's
HW reaches 10 and the producer is acknowledged, but B never hears of that HW: B has
LEO 10, HW 1. B parks the fetches C will send it. A is killed; B is elected at E+1
(its epoch starts at 10) and its HW stays 1 while C's fetches are parked.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from client import AsyncConsumer
from client.types import TopicPartition
from protocol.api import LATEST_TIMESTAMP
from protocol.api import ApiKey
from protocol.errors import ErrorCode
from tests.scenarios.scenario_cluster import FaultRule
from tests.scenarios.scenario_cluster import ScenarioCluster
from tests.scenarios.scenario_cluster import scenario_cluster
from tests.scenarios.scenario_cluster import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.scenario, pytest.mark.timeout(180)]

TOPIC = "lagging-hw"
TP = TopicPartition(TOPIC, 0)
A, B, C = 1, 2, 3
FLAGS = ("--enable-test-faults", "--replica-lag-time-max-ms", "30000")
ACKED = 10
LAG_S = 3.0  # how long B's HW is kept behind after it leads


async def latest_at(c: ScenarioCluster, node: int, epoch: int) -> tuple[int, int]:
    """A consumer's raw ListOffsets(latest) at `node`: (error code, offset)."""
    p = await c.list_offsets(node, TOPIC, LATEST_TIMESTAMP, current_leader_epoch=epoch)
    return p.error_code, p.offset


async def stage_lagging_new_leader(c: ScenarioCluster) -> tuple[int, int]:
    """The staging above; returns (E, E+1)."""
    c.start_controller(session_timeout_ms=1500)
    c.start_brokers((A, B, C), *FLAGS)
    await c.create_topic(TOPIC, replicas=[A, B, C], configs={"min.insync.replicas": "1"})
    await c.wait_isr(TOPIC, {A, B, C})
    epoch = (await c.wait_leader(TOPIC, A)).leader_epoch
    assert await c.produce_ok(A, TOPIC, epoch, [b"m0"]) == 0
    for node in (A, B, C):
        await c.wait_replica_end(node, TOPIC, 1)

    await c.faults(A, FaultRule(api_key=ApiKey.FETCH, action="hold", peer_id=B))
    await wait_until("B's fetch held at A", lambda: _held(c, A))
    rest = [f"m{i}".encode() for i in range(1, ACKED)]
    produced = asyncio.create_task(c.produce(A, TOPIC, rest, acks=-1, timeout_ms=20_000))

    async def a_appended() -> bool:
        return (await c.replica_log(A, TOPIC)).log_end_offset == ACKED

    await wait_until("A to append offsets 1-9", a_appended)
    # Release the parked fetch (records 1-9 and HW 1 reach B); later answers to B,
    # the ones carrying the new HW, are lost.
    lose_answers = FaultRule(api_key=ApiKey.FETCH, action="drop_response", peer_id=B)
    await c.faults(A, lose_answers, clear=True)
    acked = await asyncio.wait_for(produced, 30)
    assert (acked.error_code, acked.base_offset) == (0, 1), acked
    b_log = await c.replica_log(B, TOPIC)
    assert (b_log.log_end_offset, b_log.high_watermark) == (ACKED, 1), b_log

    await c.faults(B, FaultRule(api_key=ApiKey.FETCH, action="hold", peer_id=C))
    c.brokers[A].kill()
    new = await c.wait_leader(TOPIC, B, min_epoch=epoch + 1, timeout=60)
    await wait_until("B to lead", lambda: _leads(c, B, new.leader_epoch))
    b_log = await c.replica_log(B, TOPIC)
    assert (b_log.log_end_offset, b_log.high_watermark) == (ACKED, 1), (
        "the new leader's high watermark must lag its epoch start (10)"
    )
    return epoch, new.leader_epoch


async def _held(c: ScenarioCluster, node: int) -> bool:
    return (await c.faults(node)).held >= 1


async def _leads(c: ScenarioCluster, node: int, epoch: int) -> bool:
    log = await c.replica_log(node, TOPIC)
    return log.leader_id == node and log.leader_epoch == epoch


async def release_after(c: ScenarioCluster, seconds: float) -> None:
    await asyncio.sleep(seconds)
    await c.faults(B, clear=True)  # C's parked fetches go through: B's HW reaches 10


async def test_latest_offset_never_goes_back_across_a_failover(tmp_path: Path) -> None:
    with scenario_cluster(tmp_path) as c:
        _, e1 = await stage_lagging_new_leader(c)
        servers = ",".join(f"{h}:{p}" for h, p in (c.brokers[n].address for n in (B, C)))

        # The broker: no "latest" while its HW (1) lags its epoch start (10).
        code, offset = await latest_at(c, B, e1)
        assert (ErrorCode(code), offset) == (ErrorCode.OFFSET_NOT_AVAILABLE, -1), (
            f"the new leader answered latest = {offset}, below the {ACKED} acknowledged"
        )

        # The client: end_offsets() and seek_to_end() wait until it knows.
        async with (
            AsyncConsumer(servers, auto_offset_reset="none") as ends,
            AsyncConsumer(servers, auto_offset_reset="none") as seeks,
        ):
            ends.assign([TP])
            seeks.assign([TP])

            async def seek_to_end() -> int:
                seeks.seek_to_end(TP)
                return await seeks.position(TP)

            started = time.monotonic()
            end, position, _ = await asyncio.gather(
                ends.end_offsets([TP]), seek_to_end(), release_after(c, LAG_S)
            )
            waited = time.monotonic() - started
            assert (end, position) == ({TP: ACKED}, ACKED), "an end offset went back"
            assert waited >= LAG_S - 0.5, f"answered after {waited:.1f}s, before the HW caught up"
            assert await latest_at(c, B, e1) == (0, ACKED)
