"""KIP-101 Scenario 1: High Watermark Truncation followed by Immediate Leader Election.

Invariant protected: an acknowledged record (acks=all) is never lost while a replica
that holds it becomes leader. A follower must not truncate to its own high watermark
on restart, because the follower learns the high watermark one fetch round late: the
leader advances it (and acknowledges the producer) on the follower's *next* fetch, and
only that fetch's answer tells the follower. KIP-101 replaces HW truncation by asking
the leader where the follower's latest leader epoch ends (OffsetsForLeaderEpoch).

The proposal's story, with A = broker 1 (leader) and B = broker 2 (follower),
min.insync.replicas = 1, fixed assignment [1, 2]:

1. m1 is written and fully replicated; B's high watermark (checkpointed) covers m1.
2. B fetches m2. Its next fetch tells A that B has m2: A advances its HW past m2 and
   acknowledges the producer, but that fetch's answer, the one carrying the new HW, is
   lost (A: FaultRule drop_response on FETCH from peer 2). From now on A serves every
   fetch of B and drops the answer, so B never learns the HW has moved.
3. B restarts (SIGKILL and start again).
4. A dies (SIGKILL) before B got any fetch answer; B becomes the leader.

Protection ON (default flags; only --enable-test-faults to install the fault rule): B
reconciles by epoch: A answers that B's epoch ends at offset 2, so B keeps m2; m2
survives on the new leader B.

Protection OFF: brokers with --unsafe-truncate-to-high-watermark (the pre-KIP-101
follower truncates to its HW, offset 1, on restart) and the controller with
--unsafe-keep-restarted-replicas-in-isr. The latter is the ZooKeeper-era behaviour the
scenario was written against: under KRaft a broker that registers again also leaves
every ISR it was in, and can only rejoin after really catching up, which is a second,
independent protection (with it, B cannot be elected at all here, so nothing is lost
but the partition is offline). With both off, m2, an acknowledged record, is lost.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from protocol.api import ApiKey
from tests.scenarios.scenario_cluster import FaultRule
from tests.scenarios.scenario_cluster import ScenarioCluster
from tests.scenarios.scenario_cluster import scenario_cluster
from tests.scenarios.scenario_cluster import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.scenario, pytest.mark.timeout(120)]

TOPIC = "kip101-s1"
A, B = 1, 2
BROKER_FLAGS = (
    "--enable-test-faults",
    "--replica-lag-time-max-ms",
    "30000",  # the ISR must not shrink on its own while B's answers are lost
    "--hw-checkpoint-interval-ms",
    "100",
)


def start(c: ScenarioCluster, protection: bool) -> None:
    if protection:
        c.start_controller(session_timeout_ms=2000)
    else:
        c.start_controller(
            "--enable-test-faults",
            "--unsafe-keep-restarted-replicas-in-isr",
            session_timeout_ms=2000,
        )
    for node in (A, B):
        start_broker(c, node, protection)


def start_broker(c: ScenarioCluster, node: int, protection: bool) -> None:
    extra = () if protection else ("--unsafe-truncate-to-high-watermark",)
    c.start_broker(node, *BROKER_FLAGS, *extra)


@pytest.mark.parametrize("protection", [True, False], ids=["protection-on", "protection-off"])
async def test_hw_truncation_then_immediate_leader_election(
    tmp_path: Path, protection: bool
) -> None:
    with scenario_cluster(tmp_path) as c:
        start(c, protection)
        await c.create_topic(TOPIC, replicas=[A, B], configs={"min.insync.replicas": "1"})
        first = await c.wait_partition(
            TOPIC,
            lambda p: p.leader_id == A and set(p.isr_nodes) == {A, B},
            what="leader A with ISR {A, B}",
        )

        # 1. m1 is acknowledged, replicated, and B's (checkpointed) HW covers it.
        r1 = await c.produce(A, TOPIC, [b"m1"], acks=-1)
        assert r1.error_code == 0 and r1.base_offset == 0, r1

        async def b_hw_is_1() -> bool:
            return (await c.replica_log(B, TOPIC)).high_watermark == 1

        await wait_until("B's high watermark to cover m1", b_hw_is_1)
        await asyncio.sleep(0.5)  # several --hw-checkpoint-interval-ms rounds

        # 2. Park B's next fetch (offset 1) at A, so m2 is appended before B sees it.
        await c.faults(A, FaultRule(api_key=ApiKey.FETCH, action="hold", peer_id=B))

        async def b_fetch_held() -> bool:
            return (await c.faults(A)).held >= 1

        await wait_until("B's fetch to be held at A", b_fetch_held)
        produce_m2 = asyncio.create_task(c.produce(A, TOPIC, [b"m2"], acks=-1, timeout_ms=15000))

        async def a_has_m2() -> bool:
            return (await c.replica_log(A, TOPIC)).log_end_offset == 2

        await wait_until("A to append m2", a_has_m2)
        # Release the held fetch (it brings m2 and HW 1 to B); every later fetch of B
        # is served (A learns B has m2, advances its HW, acknowledges m2) but its answer,
        # the one that would carry the new HW to B, is dropped.
        await c.faults(
            A,
            FaultRule(api_key=ApiKey.FETCH, action="drop_response", peer_id=B),
            clear=True,
        )
        r2 = await asyncio.wait_for(produce_m2, 30)
        assert r2.error_code == 0 and r2.base_offset == 1, f"m2 was not acknowledged: {r2}"

        a_log = await c.replica_log(A, TOPIC)
        b_log = await c.replica_log(B, TOPIC)
        assert (a_log.log_end_offset, a_log.high_watermark) == (2, 2), a_log
        # The staged state of the proposal: B holds m2 but its HW has not passed it.
        assert (b_log.log_end_offset, b_log.high_watermark) == (2, 1), b_log
        assert await c.read_values(B, TOPIC) == [b"m1", b"m2"]

        # 3. B restarts. A keeps serving B's fetches and dropping the answers.
        c.brokers[B].kill()
        start_broker(c, B, protection)

        if protection:
            # B reconciles by epoch (OffsetsForLeaderEpoch gets through: A says B's epoch
            # ends at 2), keeps m2, and fetches at offset 2. The restart took B out of
            # the ISR (KRaft); A takes it back because B's fetch offset reached the HW.
            async def b_back_in_isr() -> bool:
                log_a = await c.replica_log(A, TOPIC)
                return (
                    set(log_a.isr) == {A, B}
                    and log_a.partition_epoch > a_log.partition_epoch
                    and (await c.replica_log(B, TOPIC)).log_end_offset == 2
                )

            await wait_until("B (with m2) back in the ISR", b_back_in_isr)
            assert "truncating to the high watermark" not in c.brokers[B].log_text()
        else:
            # Pre-KIP-101: B truncates to its HW (1) and so drops m2; the controller keeps
            # the restarted B in the ISR (ZooKeeper-era behaviour).
            async def b_truncated() -> bool:
                return (await c.replica_log(B, TOPIC)).log_end_offset == 1

            await wait_until("B to truncate to its high watermark", b_truncated)
            assert "UNSAFE: truncating to the high watermark 1" in c.brokers[B].log_text()
            part = await c.partition(TOPIC, via=A)
            assert set(part.isr_nodes) == {A, B}, part

        # 4. A dies before B got any fetch answer; B becomes the leader.
        c.brokers[A].kill()
        part = await c.wait_leader(TOPIC, B, min_epoch=first.leader_epoch + 1)
        assert part.leader_id == B

        values = await c.read_values(B, TOPIC)
        if protection:
            assert values == [b"m1", b"m2"], f"acknowledged m2 lost: {values}"

            # ... and a consumer of the new leader sees it too.
            async def consumer_sees_m2() -> bool:
                return await c.read_values(B, TOPIC, replica=False) == [b"m1", b"m2"]

            await wait_until("a consumer of B to read m1, m2", consumer_sees_m2)
        else:
            # The anomaly: m2 was acknowledged with acks=all at offset 1 and is gone from
            # the only leader left, permanently (whether A comes back or not).
            assert values == [b"m1"], values
            new = await c.produce(B, TOPIC, [b"m3"], acks=-1)
            assert new.error_code == 0 and new.base_offset == 1, new
            assert await c.read_values(B, TOPIC) == [b"m1", b"m3"]
