"""A controller stall with a wiped leader loses no acknowledged record (issue 13).

Found by the chaos suite (faults pause-controller and wipe): a controller that does not
run for longer than the session timeout used to find, when it ran again, every broker's
session run out, fence them all at once and shrink every ISR to one member: here the
dead leader. The leader, restarted meanwhile on an empty disk, then registered as a new
incarnation, was elected cleanly from that ISR with an empty log, and the two healthy
replicas truncated to it: every acknowledged record of the partition was gone.

Staging, on real processes (controller, brokers 1, 2, 3 with the default session
timeout of 3 s; one partition, replicas [1, 2, 3], min.insync.replicas 2):

1. 100 records are acknowledged with acks=all by leader 1 (ISR [1, 2, 3]).
2. The leader is killed (SIGKILL), the controller stalls (SIGSTOP), the leader's data
   directory is deleted and the leader restarts; it cannot register while the
   controller is stopped.
3. After 4 s (longer than the session timeout) the controller runs again (SIGCONT).

Invariant: every acknowledged record is still readable, from the new leader and from
every replica once the wiped one has caught up. The controller treats the stall as its
own, not the brokers': it logs it and fences neither of the healthy brokers.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from pathlib import Path

import pytest

from tests.scenarios.scenario_cluster import scenario_cluster

pytestmark = [pytest.mark.integration, pytest.mark.scenario, pytest.mark.timeout(120)]

TOPIC = "stalled"
LEADER, HEALTHY = 1, (2, 3)
HW_CATCH_UP_S = 10.0  # the new leader's followers fetch from it within this
ACKED = [f"v{i}".encode() for i in range(100)]
STALL_S = 4.0  # > the 3 s session timeout of Cluster.start_controller


async def test_a_controller_stall_with_a_wiped_leader_loses_no_acknowledged_record(
    tmp_path: Path,
) -> None:
    with scenario_cluster(tmp_path) as c:
        controller = c.start_controller()
        c.start_brokers((LEADER, *HEALTHY))
        stopped = False
        try:
            await c.create_topic(
                TOPIC, replicas=[LEADER, *HEALTHY], configs={"min.insync.replicas": "2"}
            )
            await c.wait_isr(TOPIC, {LEADER, *HEALTHY})
            before = await c.wait_leader(TOPIC, LEADER)

            # 1. 100 records acknowledged with acks=all.
            for value in ACKED:
                resp = await c.produce(LEADER, TOPIC, [value], acks=-1)
                assert resp.error_code == 0, resp
            assert await c.read_values(LEADER, TOPIC, replica=False) == ACKED

            # 2. The leader dies, the controller stalls, the leader's disk is lost and it
            #    restarts (registration waits for the controller).
            c.brokers[LEADER].kill()
            os.kill(controller.pid, signal.SIGSTOP)
            stopped = True
            shutil.rmtree(c.brokers[LEADER].data_dir)
            wiped = c.start_broker(LEADER, wait=False)

            # 3. The stall outlasts every broker's session.
            await asyncio.sleep(STALL_S)
            os.kill(controller.pid, signal.SIGCONT)
            stopped = False

            wiped.wait_for(f"broker {LEADER} started")
            after = await c.wait_leader(TOPIC, min_epoch=before.leader_epoch + 1)
            # Another broker may learn of the election before the new leader does.
            await c.wait_partition(
                TOPIC,
                lambda p: p.leader_id == after.leader_id and p.leader_epoch >= after.leader_epoch,
                what=f"broker {after.leader_id} knows it leads",
                via=after.leader_id,
            )
            # A new leader's high watermark may trail its log until its followers fetch
            # from it (KIP-101: it starts from what it last heard as a follower), so a
            # consumer can see the last records a moment later. Lost records never come.
            deadline = asyncio.get_running_loop().time() + HW_CATCH_UP_S
            values = await c.read_values(after.leader_id, TOPIC, replica=False)
            while values != ACKED and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.1)
                values = await c.read_values(after.leader_id, TOPIC, replica=False)
            assert values == ACKED, (
                f"leader {after.leader_id} (epoch {after.leader_epoch}, ISR "
                f"{after.isr_nodes}) serves {len(values)} of the 100 acknowledged records"
                f"\n{controller.tail()}"
            )
            log = controller.log_text()
            assert "the controller did not run for" in log, controller.tail()
            for node in HEALTHY:
                assert f"fenced broker {node} " not in log, controller.tail()

            # The wiped replica catches up from the others; every replica holds them all.
            await c.wait_isr(TOPIC, {LEADER, *HEALTHY})
            for node in (LEADER, *HEALTHY):
                assert await c.read_values(node, TOPIC) == ACKED, node
        finally:
            if stopped:
                os.kill(controller.pid, signal.SIGCONT)
