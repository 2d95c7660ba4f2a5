"""KIP-359 (leader epoch in Produce), DESIGN section 11 scenario 7: the stale leader.

    "a deposed leader that has not yet heard of its deposition refuses a produce
    carrying the new epoch, and a producer with stale epoch is told to refresh."

The producer sends the partition's current_leader_epoch with every batch (KIP-359); the
leader compares it with its own: newer than ours -> UNKNOWN_LEADER_EPOCH (our metadata is
stale: refuse, append nothing), older -> FENCED_LEADER_EPOCH (the producer's metadata is
stale: it must refresh).

Invariant protected: a write is appended only by a leader whose epoch is the one the
producer (with fresh metadata) targets; a deposed leader never acknowledges a write
that the new leader's log will not hold.

Staging, on real processes (controller + brokers 1, 2, 3; one partition, replicas
[1, 2, 3], leader 1 at epoch E): the controller holds broker 1's FetchMetadata (it will
not hear of its deposition) and drops its heartbeats, so it is fenced and broker 2 is
elected at E+1. Broker 1 still believes it leads at E. A producer that learned E+1 (by
metadata from broker 2) but still has broker 1's address sends to broker 1 with epoch
E+1; a second producer with stale metadata sends to broker 2 with epoch E.

- protection ON: broker 1 answers UNKNOWN_LEADER_EPOCH and appends nothing; broker 2
  answers FENCED_LEADER_EPOCH to the stale producer.
- protection OFF (`--unsafe-ignore-leader-epoch` on the brokers): broker 1 accepts and
  acknowledges (acks=1) the write. When it finally hears of E+1 it becomes a follower
  and truncates: the acknowledged record is in no replica's log (lost), and was never
  in the new leader's. The stale producer's write to broker 2 is accepted without the
  producer ever being told its metadata is stale.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from protocol.api import ApiKey
from protocol.errors import ErrorCode
from tests.scenarios.scenario_cluster import FaultRule
from tests.scenarios.scenario_cluster import flags_under_test
from tests.scenarios.scenario_cluster import scenario_cluster

pytestmark = [pytest.mark.integration, pytest.mark.scenario, pytest.mark.timeout(120)]

TOPIC = "stale-leader"
SESSION_MS = 1500
STALE = 1
NEW = 2


@pytest.mark.parametrize("protection", ["on", "off"])
async def test_deposed_leader_refuses_produce_with_new_epoch(
    tmp_path: Path, protection: str
) -> None:
    broker_flags = flags_under_test(protection, "--unsafe-ignore-leader-epoch")
    with scenario_cluster(tmp_path) as c:
        c.start_three_brokers(*broker_flags, session_timeout_ms=SESSION_MS)
        async with c.faults_cleared_after():
            await c.create_on_three(TOPIC)
            epoch = (await c.wait_leader(TOPIC, STALE)).leader_epoch
            first = await c.produce(STALE, TOPIC, [b"committed"], current_leader_epoch=epoch)
            assert first.error_code == 0 and first.base_offset == 0

            # Broker 1 stops hearing from the metadata log, and is fenced.
            await c.cut_off_metadata(STALE)
            await c.faults(
                "controller",
                FaultRule(api_key=int(ApiKey.BROKER_HEARTBEAT), action="drop", peer_id=STALE),
            )
            fresh = await c.wait_new_leader(TOPIC, NEW, epoch, what="broker 2 elected")
            new_epoch = fresh.leader_epoch
            stale_view = await c.replica_log(STALE, TOPIC)
            assert (stale_view.leader_id, stale_view.leader_epoch) == (STALE, epoch), (
                "broker 1 must not have heard of its deposition yet"
            )
            stale_leo = stale_view.log_end_offset

            # A producer with fresh metadata (epoch E+1) reaching the deposed leader.
            to_stale = await c.produce(
                STALE, TOPIC, [b"to-deposed-leader"], acks=1, current_leader_epoch=new_epoch
            )
            # A producer with stale metadata (epoch E) reaching the new leader.
            to_new = await c.produce(
                NEW, TOPIC, [b"stale-producer"], acks=1, current_leader_epoch=epoch
            )
            after = await c.replica_log(STALE, TOPIC)

            if protection == "on":
                assert to_stale.error_code == ErrorCode.UNKNOWN_LEADER_EPOCH, to_stale
                assert after.log_end_offset == stale_leo, "the deposed leader appended"
                assert to_new.error_code == ErrorCode.FENCED_LEADER_EPOCH, to_new
                assert await c.read_values(NEW, TOPIC) == [b"committed"]
            else:
                # The deposed leader acknowledges a write at epoch E...
                assert to_stale.error_code == ErrorCode.NONE, to_stale
                assert after.log_end_offset == stale_leo + 1
                assert after.batches[-1].leader_epoch == epoch
                assert b"to-deposed-leader" in await c.read_values(STALE, TOPIC)
                # ...and the stale producer is never told to refresh.
                assert to_new.error_code == ErrorCode.NONE, to_new

            # Broker 1 hears of its deposition: it follows broker 2 and reconciles.
            await c.faults("controller", clear=True)
            await c.wait_partition(
                TOPIC,
                lambda p: p.leader_id == NEW and STALE in p.isr_nodes,
                what="broker 1 back in the ISR under leader 2",
                timeout=20,
                via=NEW,
            )
            view = await c.replica_log(STALE, TOPIC)
            assert (view.leader_id, view.leader_epoch) == (NEW, new_epoch)
            new_log = await c.read_values(NEW, TOPIC)
            stale_log = await c.read_values(STALE, TOPIC)
            # Whatever happened, the replicas converge on the new leader's log...
            assert stale_log == new_log
            # ...which never held the write acknowledged by the deposed leader: with the
            # protection off that acknowledged record is lost.
            assert b"to-deposed-leader" not in new_log
            assert new_log[0] == b"committed"
