"""A last in-sync replica that lost its disk is never elected; an operator's unclean
election brings the partition back with the records the other replicas kept (issue 13).

The second layer under the controller-stall fix: whatever shrank an ISR to one member,
that member coming back with an EMPTY data directory must not be elected cleanly, or
the replicas that still hold the records truncate to its empty log. Without ELR
(KIP-966) no other replica is known to hold every acknowledged record, so the partition
waits without a leader until an operator elects one uncleanly.

Staging, on real processes (controller, brokers 1, 2, 3; one partition, replicas
[1, 2, 3], min.insync.replicas 2):

1. 50 records are acknowledged with acks=all by leader 1 (ISR [1, 2, 3]).
2. Brokers 2 and 3 die (SIGKILL) and are fenced: ISR [1]. Then 1 dies: no leader, and
   1 stays the ISR's last member. 2 and 3 restart with their data: still no leader.
3. Broker 1's data directory is deleted and it restarts: it registers without a
   cluster id (no meta.properties).

Invariants: broker 1 leaves the ISR (now empty) and is not elected, although it is up
and first in replica order; the controller says why and what to do. Then
`minibroker topic elect-leader stranded -p 0 --unclean` elects broker 2, not the empty
broker 1, and all 50 records are readable; broker 1 catches up from it.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.cluster import REPO
from tests.scenarios.scenario_cluster import scenario_cluster

pytestmark = [pytest.mark.integration, pytest.mark.scenario, pytest.mark.timeout(150)]

TOPIC = "stranded"
ACKED = [f"r{i}".encode() for i in range(50)]
SESSION_MS = 1500


async def test_a_last_in_sync_replica_that_lost_its_disk_is_never_elected(
    tmp_path: Path,
) -> None:
    with scenario_cluster(tmp_path) as c:
        controller = c.start_controller(session_timeout_ms=SESSION_MS)
        c.start_brokers((1, 2, 3))
        await c.create_topic(TOPIC, replicas=[1, 2, 3], configs={"min.insync.replicas": "2"})
        await c.wait_isr(TOPIC, {1, 2, 3})
        await c.wait_leader(TOPIC, 1)

        # 1. 50 records acknowledged with acks=all.
        for value in ACKED:
            assert (await c.produce(1, TOPIC, [value], acks=-1)).error_code == 0

        # 2. The ISR shrinks to broker 1, which dies too; 2 and 3 come back with the data.
        for node in (2, 3):
            c.brokers[node].kill()
        await c.wait_isr(TOPIC, {1})
        c.brokers[1].kill()
        deadline = time.monotonic() + 20
        while "fenced broker 1 " not in controller.log_text():
            assert time.monotonic() < deadline, controller.tail()
            await asyncio.sleep(0.1)
        c.start_brokers((2, 3))
        p = await c.partition(TOPIC, via=2)
        assert (p.leader_id, p.isr_nodes) == (-1, [1]), p

        # 3. Broker 1 comes back with an empty disk.
        shutil.rmtree(c.brokers[1].data_dir)
        c.start_broker(1)  # returns once registered and unfenced
        deadline = time.monotonic() + 2 * SESSION_MS / 1000
        while time.monotonic() < deadline:
            p = await c.partition(TOPIC, via=2)
            assert (p.leader_id, p.isr_nodes) == (-1, []), f"the empty replica in play: {p}"
            await asyncio.sleep(0.1)
        assert "was the last in-sync replica of stranded-0" in controller.log_text()
        assert (await c.replica_log(2, TOPIC)).log_end_offset == len(ACKED)

        # The operator elects a replica that kept the records.
        bootstrap = "{}:{}".format(*c.brokers[2].address)
        command = ["topic", "elect-leader", TOPIC, "-p", "0", "--unclean", "-b", bootstrap]
        cli = subprocess.run(
            [sys.executable, "-m", "client.cli", *command],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
        assert cli.returncode == 0, cli.stderr
        assert cli.stdout.startswith("stranded-0: broker 2 leads at leader epoch"), cli.stdout
        p = await c.wait_leader(TOPIC, 2)
        assert await c.read_values(2, TOPIC, replica=False) == ACKED
        await c.wait_isr(TOPIC, {1, 2, 3})
        assert await c.read_values(1, TOPIC) == ACKED
