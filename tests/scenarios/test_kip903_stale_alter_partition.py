"""KIP-903, DESIGN section 11 scenario 8: a stale AlterPartition after a disk wipe.

KIP-903 ("Replicas with stale broker epoch should not be allowed to join the ISR"):
the leader's AlterPartition that adds a follower to the ISR carries the follower's
broker epoch as the leader saw it in the follower's fetches. If the follower rebooted
meanwhile (a new incarnation, here with an EMPTY disk), that epoch is stale and the
controller must refuse the request: the broker that caught up is not the broker that
would join the ISR.

Invariant protected: the ISR never contains a replica incarnation that has not itself
caught up; so an ISR member holds every acknowledged (acks=all) record, and a clean
election never loses one.

Staging, on real processes (controller + brokers 1 (A) and 2 (B); one partition,
replicas [1, 2], leader A, min.insync.replicas 1):

1. B is killed (SIGKILL) and fenced: ISR [1]. Records a, b, c are acknowledged with
   acks=all by A alone.
2. The controller holds every AlterPartition from A. B restarts on its old disk,
   catches up, and A sends "ISR [1, 2], B at broker epoch e1": held in flight.
3. B is killed again, its data dir wiped, and it restarts: it registers as broker
   epoch e2 > e1 with an empty log. A drops B's fetches so it stays empty (it would
   otherwise quickly re-replicate and hide the anomaly).
4. The held AlterPartition is released.

- protection ON: the controller answers INELIGIBLE_REPLICA (B's epoch e1 is not the
  registered e2); the ISR stays [1] and never contains the wiped B. When A then dies,
  no clean leader exists: the partition waits (offline) rather than lose data, and A's
  return brings back every acknowledged record.
- protection OFF (controller `--unsafe-ignore-broker-epochs`): the controller commits
  ISR [1, 2] with B holding nothing. When A dies, B is elected *cleanly* from the ISR
  and the acknowledged records a, b, c are gone.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import time
from pathlib import Path

import pytest

from protocol.api import ApiKey
from protocol.errors import ErrorCode
from tests.scenarios.scenario_cluster import FaultRule
from tests.scenarios.scenario_cluster import ScenarioCluster
from tests.scenarios.scenario_cluster import flags_under_test
from tests.scenarios.scenario_cluster import scenario_cluster

pytestmark = [pytest.mark.integration, pytest.mark.scenario, pytest.mark.timeout(120)]

TOPIC = "wiped"
SESSION_MS = 1500
A, B = 1, 2
ACKED = [b"a", b"b", b"c"]
BROKER_FLAGS = ("--enable-test-faults", "--replica-lag-time-max-ms", "30000")


def broker_epoch(c: ScenarioCluster, node: int) -> int:
    match = re.search(r"broker epoch (\d+)", c.brokers[node].log_text())
    assert match, c.brokers[node].tail()
    return int(match[1])


@pytest.mark.parametrize("protection", ["on", "off"])
async def test_alter_partition_with_stale_broker_epoch_after_disk_wipe_is_refused(
    tmp_path: Path, protection: str
) -> None:
    controller_flags = flags_under_test(protection, "--unsafe-ignore-broker-epochs")
    with scenario_cluster(tmp_path) as c:
        controller = c.start_controller(*controller_flags, session_timeout_ms=SESSION_MS)
        c.start_broker(A, *BROKER_FLAGS)
        c.start_broker(B, *BROKER_FLAGS)
        async with c.faults_cleared_after():
            await c.create_topic(TOPIC, replicas=[A, B], configs={"min.insync.replicas": "1"})
            await c.wait_isr(TOPIC, {A, B})
            await c.wait_leader(TOPIC, A)

            # 1. B dies and is fenced; A alone acknowledges a, b, c with acks=all.
            c.brokers[B].kill()
            await c.wait_isr(TOPIC, {A})
            for value in ACKED:
                assert (await c.produce(A, TOPIC, [value], acks=-1)).error_code == 0

            # 2. A's AlterPartition adding B back (broker epoch e1) is held in flight.
            await c.faults(
                "controller",
                FaultRule(api_key=int(ApiKey.ALTER_PARTITION), action="hold", peer_id=A),
            )
            c.start_broker(B, *BROKER_FLAGS)
            old_epoch = broker_epoch(c, B)
            await c.wait_held("an AlterPartition")
            assert (await c.partition(TOPIC, via=A)).isr_nodes == [A]

            # 3. B reboots with an empty disk: a new incarnation, epoch e2, holding nothing.
            for api in (ApiKey.FETCH, ApiKey.OFFSET_FOR_LEADER_EPOCH):
                await c.faults(A, FaultRule(api_key=int(api), action="drop", peer_id=B))
            c.brokers[B].kill()
            shutil.rmtree(c.brokers[B].data_dir)
            c.start_broker(B, *BROKER_FLAGS)  # returns once registered and unfenced
            new_epoch = broker_epoch(c, B)
            assert new_epoch > old_epoch
            assert (await c.replica_log(B, TOPIC)).log_end_offset == 0

            # 4. The stale AlterPartition is released (and nothing is held any more).
            await c.faults("controller", clear=True)

            if protection == "on":
                deadline = time.monotonic() + 3.0
                while time.monotonic() < deadline:
                    p = await c.partition(TOPIC, via=A)
                    assert B not in p.isr_nodes, f"the wiped replica joined the ISR: {p}"
                    await asyncio.sleep(0.1)
                refusal = (
                    f"AlterPartition from broker {A} refused for {TOPIC}-0: INELIGIBLE_REPLICA "
                    f"(broker {B} has broker epoch {new_epoch}, the request says {old_epoch}"
                )
                assert refusal in controller.log_text(), controller.tail()
                # A dies: B, outside the ISR, is not elected; nothing acknowledged is lost.
                c.brokers[A].kill()
                await asyncio.sleep(SESSION_MS / 1000 * 2)
                p = await c.partition(TOPIC, via=B)
                assert p.leader_id == -1 and p.isr_nodes == [A], p
                c.start_broker(A, *BROKER_FLAGS)
                await c.wait_leader(TOPIC, A, timeout=20)
                assert await c.read_values(A, TOPIC, replica=False) == ACKED
            else:
                p = await c.wait_partition(
                    TOPIC,
                    lambda p: set(p.isr_nodes) == {A, B},
                    what="the wiped B in the ISR",
                    timeout=10,
                    via=A,
                )
                assert (
                    f"accepting broker {B} with stale broker epoch {old_epoch} "
                    f"(registered {new_epoch})" in controller.log_text()
                ), controller.tail()
                assert (await c.replica_log(B, TOPIC)).log_end_offset == 0
                # A dies: B is a clean choice by the ISR, and the acknowledged records
                # are gone.
                c.brokers[A].kill()
                p = await c.wait_leader(TOPIC, B, timeout=20)
                assert B in p.isr_nodes
                assert await c.read_values(B, TOPIC) == []
                produced = await c.produce(B, TOPIC, [b"after"], acks=1)
                assert produced.error_code == ErrorCode.NONE and produced.base_offset == 0
