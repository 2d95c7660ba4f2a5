"""Leader-epoch acceptance, in the manner of Kafka's
EpochDrivenReplicationProtocolAcceptanceTest and LeaderEpochIntegrationTest.

    "shouldFollowLeaderEpochBasicWorkflow": bounce the leader again and again, produce
    between the bounces, and check that every replica's leader-epoch cache holds exactly
    the (epoch, start offset) the test expects, and that the replicas' logs match.

Staging, on real processes (controller + brokers 1, 2, 3; one partition, fixed replicas
[1, 2, 3], min.insync.replicas=2):

- a scripted series of leader bounces: SIGKILL the leader three times, a controlled
  shutdown (SIGTERM) once, and once SIGKILL with an immediate restart (the new
  registration, inside the session timeout, moves the leadership: KIP-101's
  "returning leader"); after each, the test waits for the new leader and its epoch
  in Metadata, produces acks=all batches stamped with that epoch (current_leader_epoch),
  restarts the old leader and waits for the full ISR before the next bounce;
- the test computes the EXPECTED epoch cache from what it observed: one
  (epoch, offset of the first batch acknowledged in that epoch) entry per epoch it
  wrote in.

Invariants checked at the end:
- every replica's epoch cache (DescribeReplicaLog) equals the expected list;
- every replica holds identical batches below the high watermark (base offset, last
  offset, leader epoch, CRC), each batch stamped with the epoch the test wrote it in;
- the values read back (as a consumer from the leader, and from every replica) are
  exactly the acknowledged ones, in order, at the offsets they were acknowledged at.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest

from protocol.errors import ErrorCode
from tests.scenarios.scenario_cluster import BROKER_FLAGS
from tests.scenarios.scenario_cluster import NODES
from tests.scenarios.scenario_cluster import SESSION_MS
from tests.scenarios.scenario_cluster import ScenarioCluster
from tests.scenarios.scenario_cluster import committed_batches
from tests.scenarios.scenario_cluster import scenario_cluster

pytestmark = [pytest.mark.integration, pytest.mark.scenario, pytest.mark.timeout(120)]

TOPIC = "epochs"
# The bounces: how the leader goes away each time.
BOUNCES = ["kill", "kill", "terminate", "kill-restart", "kill"]
PER_EPOCH = 6  # acks=all batches per epoch, 1-3 records each

# Errors a Produce gets before anything is appended (a leader that has not yet heard
# of its leadership or epoch, a shrunken ISR): retry them with fresh metadata.
NOT_APPENDED = {
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.UNKNOWN_LEADER_EPOCH,
    ErrorCode.FENCED_LEADER_EPOCH,
    ErrorCode.NOT_ENOUGH_REPLICAS,
}


class Writer:
    """Produces acks=all batches at the leader and epoch seen in Metadata; keeps what
    was acknowledged and the epoch cache that must follow from it."""

    def __init__(self, c: ScenarioCluster) -> None:
        self.c = c
        self.acked: list[bytes] = []
        self.batches: list[tuple[int, int, int]] = []  # (base offset, last offset, epoch)
        self.expected: list[tuple[int, int]] = []  # (epoch, start offset)
        self.seq = 0

    async def write(self, leader: int, epoch: int, count: int) -> None:
        for _ in range(count):
            n = 1 + self.seq % 3
            values = [f"e{epoch}-b{self.seq}-r{j}".encode() for j in range(n)]
            self.seq += 1
            deadline = time.monotonic() + 20
            while True:
                resp = await self.c.produce(leader, TOPIC, values, current_leader_epoch=epoch)
                code = ErrorCode(resp.error_code)
                if code == ErrorCode.NONE:
                    break
                assert code in NOT_APPENDED, f"produce at {leader} epoch {epoch}: {code.name}"
                assert time.monotonic() < deadline, f"produce kept failing: {code.name}"
                await asyncio.sleep(0.1)
                p = await self.c.wait_leader(TOPIC, min_epoch=epoch)
                # The test scripts every leader change: the epoch must not move on its own.
                assert (p.leader_id, p.leader_epoch) == (leader, epoch), p
            assert resp.base_offset == len(self.acked), (resp.base_offset, len(self.acked))
            if not self.expected or self.expected[-1][0] != epoch:
                assert not self.expected or self.expected[-1][0] < epoch
                self.expected.append((epoch, resp.base_offset))
            self.batches.append((resp.base_offset, resp.base_offset + n - 1, epoch))
            self.acked += values


async def wait_converged(c: ScenarioCluster, end: int, timeout: float = 30.0) -> None:
    """Full ISR, and every replica's LEO and HW at `end`."""
    await c.wait_isr(TOPIC, set(NODES), timeout=timeout)
    deadline = time.monotonic() + timeout
    while True:
        logs = {n: await c.replica_log(n, TOPIC) for n in NODES}
        state = {n: (lg.log_end_offset, lg.high_watermark) for n, lg in logs.items()}
        if all(s == (end, end) for s in state.values()):
            return
        assert time.monotonic() < deadline, f"replicas never converged at {end}: {state}"
        await asyncio.sleep(0.1)


async def test_epoch_caches_and_logs_agree_after_scripted_leader_bounces(tmp_path: Path) -> None:
    with scenario_cluster(tmp_path) as c:
        c.start_three_brokers(*BROKER_FLAGS, session_timeout_ms=SESSION_MS, controller_faults=False)
        await c.create_on_three(TOPIC, min_insync=2)
        p = await c.wait_leader(TOPIC, 1)
        w = Writer(c)
        await w.write(p.leader_id, p.leader_epoch, PER_EPOCH)
        epochs_seen = [p.leader_epoch]

        for how in BOUNCES:
            old, old_epoch = p.leader_id, p.leader_epoch
            proc = c.brokers[old]
            if how == "kill":
                proc.kill()  # SIGKILL: the controller fences it after the session timeout
            elif how == "kill-restart":
                # SIGKILL and back at once, within the session timeout: its new
                # registration replaces the old incarnation, whose leadership moves.
                proc.kill()
                c.start_broker(old, *BROKER_FLAGS)
            else:
                assert proc.terminate() == 0  # SIGTERM: controlled shutdown
                assert "controlled shutdown acknowledged" in proc.log_text()
            p = await c.wait_partition(
                TOPIC,
                lambda q, old=old, e=old_epoch: q.leader_id not in (-1, old) and q.leader_epoch > e,
                what=f"a new leader after {how} of {old}",
            )
            if how == "kill-restart":
                # It may be back in the ISR already; the controller says it left it.
                assert re.search(
                    rf"broker {old} epoch \d+ replaced by a new incarnation\): leader {old} -> "
                    rf"{p.leader_id}, leader epoch {old_epoch} -> {old_epoch + 1}",
                    c.controller.log_text(),  # type: ignore[union-attr]
                )
            else:
                assert old not in p.isr_nodes
            epochs_seen.append(p.leader_epoch)
            # The new leader's epoch starts at the old epoch's end: everything was acked.
            await w.write(p.leader_id, p.leader_epoch, PER_EPOCH)
            if how != "kill-restart":
                c.start_broker(old, *BROKER_FLAGS)
            await c.wait_isr(TOPIC, set(NODES))
            # More in the same epoch, with the returned broker following.
            await w.write(p.leader_id, p.leader_epoch, 2)

        end = len(w.acked)
        await wait_converged(c, end)
        final = await c.wait_leader(TOPIC)
        assert (final.leader_id, final.leader_epoch) == (p.leader_id, p.leader_epoch)
        assert epochs_seen == sorted(set(epochs_seen)), epochs_seen
        assert [e for e, _ in w.expected] == epochs_seen

        # 1. every replica's epoch cache is the expected one
        for n in NODES:
            assert await c.epoch_entries(n, TOPIC) == w.expected, f"broker {n}"

        # 2. identical batches below the HW, each stamped with the epoch it was written in
        logs = {n: await c.replica_log(n, TOPIC) for n in NODES}
        hw = logs[final.leader_id].high_watermark
        assert hw == end
        assert [b[:3] for b in committed_batches(logs, hw)] == w.batches

        # 3. the values read back are exactly the acknowledged ones, in order
        assert await c.read_values(final.leader_id, TOPIC, replica=False) == w.acked
        for n in NODES:
            assert await c.read_values(n, TOPIC) == w.acked, f"broker {n}"
