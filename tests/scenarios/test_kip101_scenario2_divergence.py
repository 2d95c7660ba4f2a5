"""KIP-101 Scenario 2: Replica Divergence on Restart after Multiple Hard Failures.

Invariant protected: replicas never hold different lineages. After any failures, once
a follower has caught up, its log is byte-identical to the leader's (same batches, same
offsets, epochs and CRCs) and so is its leader-epoch cache. Losing unflushed data when
every replica crashes is within the durability contract (n-1 failures); divergence is
not.

The proposal's story, with two replicas, A = broker 1 and B = broker 2 (fixed
assignment [2, 1]: B leads first), min.insync.replicas = 1, fsync off on both
(--unsafe-skip-fsync: the recovery point stays at 0, so everything is "unflushed"):

1. m1 and m2 are written with acks=all in epoch E0 and replicated; A's checkpointed
   high watermark covers both (--hw-checkpoint-interval-ms 100).
2. A power outage hits both: A crashes (SIGKILL) and, once the controller has taken it
   out of the ISR, B crashes too. B's OS loses its unflushed pages: its segment is cut
   back to the batch boundary after m1 (its .index/.timeindex are removed; recovery
   rebuilds them and drops leader-epoch entries past the new log end).
3. B, the replica with fewer messages, comes back first and, as the last ISR member,
   becomes leader in a new epoch E1 and accepts m3 at offset 1, where A holds m2.
4. A comes back as a follower.

Protection ON: A asks B where its latest epoch E0 ends (OffsetsForLeaderEpoch): offset
1, the start of E1. A truncates the orphaned m2, fetches m3, and both replicas hold
byte-identical batches and equal epoch caches.

Protection OFF (--unsafe-truncate-to-high-watermark): A truncates to its high watermark,
2, keeps m2 and fetches on from offset 2: offset 1 holds m2 (epoch E0) on A and m3
(epoch E1) on B, forever, while A is back in the ISR.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.storage.checkpoints import REPLICATION_OFFSET_CHECKPOINT
from broker.storage.checkpoints import OffsetCheckpointFile
from tests.scenarios.scenario_cluster import ScenarioCluster
from tests.scenarios.scenario_cluster import scenario_cluster
from tests.scenarios.scenario_cluster import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.scenario, pytest.mark.timeout(120)]

TOPIC = "kip101-s2"
A, B = 1, 2
BROKER_FLAGS = (
    "--enable-test-faults",
    "--unsafe-skip-fsync",  # the power loss may take anything after the recovery point
    "--hw-checkpoint-interval-ms",
    "100",
)


def start_broker(c: ScenarioCluster, node: int, protection: bool) -> None:
    extra = () if protection else ("--unsafe-truncate-to-high-watermark",)
    c.start_broker(node, *BROKER_FLAGS, *extra)


def checkpointed_hw(c: ScenarioCluster, node: int) -> int | None:
    path = c.brokers[node].data_dir / REPLICATION_OFFSET_CHECKPOINT
    if not path.exists():
        return None
    return OffsetCheckpointFile(path).read().get((TOPIC, 0))


def batches(log) -> list[tuple[int, int, int, int]]:
    return [(b.base_offset, b.last_offset, b.leader_epoch, b.crc) for b in log.batches]


@pytest.mark.parametrize("protection", [True, False], ids=["protection-on", "protection-off"])
async def test_replica_divergence_after_multiple_hard_failures(
    tmp_path: Path, protection: bool
) -> None:
    with scenario_cluster(tmp_path) as c:
        c.start_controller(session_timeout_ms=2000)
        for node in (A, B):
            start_broker(c, node, protection)
        await c.create_topic(TOPIC, replicas=[B, A], configs={"min.insync.replicas": "1"})
        await c.wait_partition(
            TOPIC,
            lambda p: p.leader_id == B and set(p.isr_nodes) == {A, B},
            what="leader B with ISR {A, B}",
        )

        # 1. m1 and m2 (two batches) acknowledged in epoch E0 and replicated to A.
        for offset, value in enumerate([b"m1", b"m2"]):
            r = await c.produce(B, TOPIC, [value], acks=-1)
            assert r.error_code == 0 and r.base_offset == offset, r

        async def a_hw_checkpointed() -> bool:
            return checkpointed_hw(c, A) == 2

        await wait_until("A's checkpointed high watermark to reach 2", a_hw_checkpointed)
        before = await c.replica_log(B, TOPIC)
        assert batches(before) == batches(await c.replica_log(A, TOPIC))
        e0 = before.leader_epoch
        m1_batch = before.batches[0]
        assert (m1_batch.base_offset, m1_batch.last_offset) == (0, 0), before.batches

        # 2. The power outage: A first, then (once out of the ISR) B.
        c.brokers[A].kill()
        await c.wait_isr(TOPIC, {B})
        c.brokers[B].kill()
        # B's unflushed tail (m2) is lost: cut its segment at the end of m1's batch.
        b_dir = c.brokers[B].data_dir / f"{TOPIC}-0"
        segment = b_dir / f"{0:020d}.log"
        assert segment.stat().st_size == sum(b.size for b in before.batches)
        with open(segment, "r+b") as f:
            f.truncate(m1_batch.size)
        for index in (b_dir / f"{0:020d}.index", b_dir / f"{0:020d}.timeindex"):
            index.unlink(missing_ok=True)

        # 3. B comes back first, leads in a new epoch E1 and accepts m3 at offset 1.
        start_broker(c, B, protection)
        part = await c.wait_leader(TOPIC, B, min_epoch=e0 + 1)
        e1 = part.leader_epoch
        b_log = await c.replica_log(B, TOPIC)
        assert b_log.log_end_offset == 1, b_log
        r3 = await c.produce(B, TOPIC, [b"m3"], acks=-1, current_leader_epoch=e1)
        assert r3.error_code == 0 and r3.base_offset == 1, r3
        assert await c.epoch_entries(B, TOPIC) == [(e0, 0), (e1, 1)]

        # 4. A comes back as a follower and catches up (ISR {A, B} again).
        start_broker(c, A, protection)
        await c.wait_isr(TOPIC, {A, B})
        r4 = await c.produce(B, TOPIC, [b"m4"], acks=-1)
        assert r4.error_code == 0 and r4.base_offset == 2, r4

        async def caught_up():
            a, b = await c.replica_log(A, TOPIC), await c.replica_log(B, TOPIC)
            if a.log_end_offset == b.log_end_offset == 3 and a.high_watermark == 3:
                return a, b
            return None

        a_log, b_log = await wait_until("A to replicate m4", caught_up)
        a_values = await c.read_values(A, TOPIC)
        b_values = await c.read_values(B, TOPIC)
        assert b_values == [b"m1", b"m3", b"m4"]

        if protection:
            # A truncated m2 by epoch: the logs converged, byte for byte.
            assert batches(a_log) == batches(b_log), (a_log.batches, b_log.batches)
            assert [b.size for b in a_log.batches] == [b.size for b in b_log.batches]
            assert await c.epoch_entries(A, TOPIC) == await c.epoch_entries(B, TOPIC)
            assert await c.epoch_entries(A, TOPIC) == [(e0, 0), (e1, 1)]
            assert a_values == b_values
        else:
            # The anomaly: offset 1 holds m2 (epoch E0) on A and m3 (epoch E1) on B,
            # below the high watermark, with A in the ISR.
            a_at_1 = next(b for b in a_log.batches if b.base_offset == 1)
            b_at_1 = next(b for b in b_log.batches if b.base_offset == 1)
            assert (a_at_1.leader_epoch, b_at_1.leader_epoch) == (e0, e1)
            assert a_at_1.crc != b_at_1.crc
            assert a_values == [b"m1", b"m2", b"m4"], a_values
            assert await c.epoch_entries(A, TOPIC) != await c.epoch_entries(B, TOPIC)
            assert "UNSAFE: truncating to the high watermark 2" in c.brokers[A].log_text()
