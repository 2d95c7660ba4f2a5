"""Unclean leader election: availability traded for acknowledged records, only when a
topic says so (`unclean.leader.election.enable`).

Staging, on real processes (controller + brokers 1, 2, 3; one partition, fixed replicas
[1, 2, 3], leader 1 at epoch E0):

1. records "in-sync-*" are acknowledged (acks=all) by all three replicas;
2. the followers 2 and 3 stop (controlled shutdown): they leave the ISR, which becomes
   [1]; records "only-on-1-*" are acknowledged (acks=all, the ISR is just the leader);
3. the leader 1 is SIGKILLed: the whole ISR is down. Broker 2 (out of sync) comes back.

- unclean election OFF (the default): the partition has no leader (leader -1); produce
  at the live broker fails with a retriable error until broker 1 (the ISR) returns;
  then broker 1 leads again and every acknowledged record is there.
- unclean election ON (topic config): broker 2 becomes leader at once (the controller
  logs a WARNING naming it), and takes new writes. When broker 1 returns it truncates
  its divergent suffix: its epoch cache equals broker 2's, and the records lost are
  exactly the ones broker 2 never had ("only-on-1-*").
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
from tests.scenarios.scenario_cluster import scenario_cluster

pytestmark = [pytest.mark.integration, pytest.mark.scenario, pytest.mark.timeout(120)]

TOPIC = "unclean"
RETRIABLE_NO_LEADER = {ErrorCode.LEADER_NOT_AVAILABLE, ErrorCode.NOT_LEADER_OR_FOLLOWER}


async def stage_whole_isr_down(c: ScenarioCluster, *, unclean: bool) -> tuple[int, list, list]:
    """Steps 1-3. Returns (E0, in-sync values, values only broker 1 had)."""
    c.start_controller(session_timeout_ms=SESSION_MS)
    c.start_brokers(NODES, *BROKER_FLAGS)
    configs = {"min.insync.replicas": "1"}
    if unclean:
        configs["unclean.leader.election.enable"] = "true"
    await c.create_topic(TOPIC, replicas=NODES, configs=configs)
    p = await c.wait_leader(TOPIC, 1)
    await c.wait_isr(TOPIC, set(NODES))
    e0 = p.leader_epoch

    in_sync = [f"in-sync-{i}".encode() for i in range(5)]
    for i, v in enumerate(in_sync):
        assert await c.produce_ok(1, TOPIC, e0, [v]) == i
    for n in NODES:
        await c.wait_replica_end(n, TOPIC, len(in_sync))

    for n in (2, 3):  # the followers stop first and leave the ISR
        assert c.brokers[n].terminate() == 0
    p = await c.wait_isr(TOPIC, {1})
    assert (p.leader_id, p.leader_epoch) == (1, e0)
    only_on_1 = [f"only-on-1-{i}".encode() for i in range(4)]
    for i, v in enumerate(only_on_1):
        assert await c.produce_ok(1, TOPIC, e0, [v]) == len(in_sync) + i

    c.brokers[1].kill()  # the whole ISR is down
    c.start_broker(2, *BROKER_FLAGS)  # an out-of-sync replica comes back
    return e0, in_sync, only_on_1


async def test_unclean_election_off_keeps_partition_leaderless_until_isr_returns(
    tmp_path: Path,
) -> None:
    with scenario_cluster(tmp_path) as c:
        e0, in_sync, only_on_1 = await stage_whole_isr_down(c, unclean=False)
        p = await c.wait_partition(
            TOPIC, lambda q: q.leader_id == -1 and q.leader_epoch > e0, what="no leader", via=2
        )
        assert p.isr_nodes == [1], "the last ISR member stays in the ISR"
        # Stays leaderless, and produce fails retriably, for well over a session timeout.
        deadline = time.monotonic() + 3 * SESSION_MS / 1000
        codes = set()
        while time.monotonic() < deadline:
            q = await c.partition(TOPIC, via=2)
            assert q.leader_id == -1, f"broker {q.leader_id} was elected from outside the ISR"
            resp = await c.produce(2, TOPIC, [b"refused"], timeout_ms=1000)
            code = ErrorCode(resp.error_code)
            assert code in RETRIABLE_NO_LEADER, code.name
            assert code.retriable
            codes.add(code)
            await asyncio.sleep(0.2)
        assert codes
        assert "UNCLEAN" not in c.controller.log_text()  # type: ignore[union-attr]

        c.start_broker(1, *BROKER_FLAGS)  # the ISR member returns
        p = await c.wait_leader(TOPIC, 1, min_epoch=e0 + 1)
        after = [f"after-{i}".encode() for i in range(3)]
        base = await c.produce_ok(1, TOPIC, p.leader_epoch, after)
        assert base == len(in_sync) + len(only_on_1)
        acked = in_sync + only_on_1 + after
        c.start_broker(3, *BROKER_FLAGS)
        await c.wait_isr(TOPIC, set(NODES))
        for n in NODES:
            await c.wait_replica_end(n, TOPIC, len(acked))
            assert await c.read_values(n, TOPIC) == acked, f"broker {n}"
        assert await c.read_values(1, TOPIC, replica=False) == acked
        expected = [(e0, 0), (p.leader_epoch, base)]
        for n in NODES:
            assert await c.epoch_entries(n, TOPIC) == expected, f"broker {n}"


async def test_unclean_election_on_elects_out_of_sync_replica_and_truncates_old_leader(
    tmp_path: Path,
) -> None:
    with scenario_cluster(tmp_path) as c:
        e0, in_sync, only_on_1 = await stage_whole_isr_down(c, unclean=True)
        p = await c.wait_leader(TOPIC, 2, min_epoch=e0 + 1)
        assert p.isr_nodes == [2]
        e2 = p.leader_epoch
        controller_log = c.controller.log_text()  # type: ignore[union-attr]
        warning = re.search(
            r"WARNING.*UNCLEAN leader election.*leader -?\d+ -> (\d+)", controller_log
        )
        assert warning and warning[1] == "2", controller_log[-2000:]

        # Broker 2 never had the records only broker 1 acknowledged.
        assert await c.read_values(2, TOPIC) == in_sync
        new = [f"new-{i}".encode() for i in range(3)]
        base = await c.produce_ok(2, TOPIC, e2, new)
        assert base == len(in_sync)
        assert await c.epoch_entries(2, TOPIC) == [(e0, 0), (e2, len(in_sync))]

        c.start_broker(1, *BROKER_FLAGS)  # the old leader returns with a divergent suffix
        c.start_broker(3, *BROKER_FLAGS)
        await c.wait_isr(TOPIC, set(NODES))
        survived = in_sync + new
        for n in NODES:
            await c.wait_replica_end(n, TOPIC, len(survived))
        log1 = c.brokers[1].log_text()
        assert re.search(rf"truncated log {len(in_sync) + len(only_on_1)} -> {len(in_sync)}", log1)
        expected = [(e0, 0), (e2, len(in_sync))]
        for n in NODES:
            assert await c.epoch_entries(n, TOPIC) == expected, f"broker {n}"
            values = await c.read_values(n, TOPIC)
            assert values == survived, f"broker {n}"
        # The records lost are exactly those broker 2 never had.
        acked = in_sync + only_on_1 + new
        assert [v for v in acked if v not in survived] == only_on_1
        # Identical batches on every replica.
        logs = {n: await c.replica_log(n, TOPIC) for n in NODES}
        batches = {
            n: [(b.base_offset, b.last_offset, b.leader_epoch, b.crc) for b in lg.batches]
            for n, lg in logs.items()
        }
        assert batches[1] == batches[2] == batches[3]
