"""KIP-320, "Inadequate Replica Fencing" (KAFKA-6880): the zombie replica.

    "a deadlock caused a broker to enter a zombie state [...] Nevertheless, its fetchers
    continued attempting to make progress by fetching from leaders. Since it was no
    longer receiving updates from the controller, the leader metadata became stale.
    However, the replica was still able to make progress and even rejoin the ISR as the
    assigned leader periodically became accurate again."

    "We will include the leader epoch in the Fetch request and the leader will reject
    the request if the epoch does not match its own."

Invariant protected: a replica whose metadata is stale (it has not heard of a leader
change) is fenced from fetching (FENCED_LEADER_EPOCH) and therefore can never be
(re)admitted to the ISR on that stale state: every ISR member has fetched in the
leader's *current* epoch.

Staging, on real processes (controller + brokers 1, 2, 3; one partition, replicas
[1, 2, 3], leader 1 at epoch E):

1. broker 3 becomes the zombie: the controller holds its FetchMetadata long-polls (its
   heartbeats still flow, so it stays registered and unfenced). It keeps believing
   "leader 1, epoch E".
2. broker 1 is fenced (its heartbeats are dropped at the controller): broker 2 leads
   at E+1. The zombie keeps fetching from broker 1 (now a follower) and gets nowhere, so
   leader 2 shrinks it out of the ISR. Broker 1's heartbeats come back, it catches up
   and rejoins the ISR: ISR [1, 2].
3. broker 2 is fenced: broker 1 leads again, at E+2. The "assigned leader became
   accurate again": the zombie's fetches, still with current_leader_epoch E, reach the
   real leader.

- protection ON: leader 1 answers the zombie FENCED_LEADER_EPOCH; the zombie stays out
  of the ISR (ISR [1]) for well over replica.lag.time.max.ms.
- protection OFF (`--unsafe-ignore-leader-epoch` on the brokers, pre-KIP-320): leader 1
  serves the zombie's fetch as if it were current, and expands the ISR to [1, 3]. The
  ISR now counts, for acks=all and min.insync.replicas, a replica that does not know
  who leads the partition nor at which epoch (and that would not hear of the next leader
  change either): exactly KAFKA-6880.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from protocol.api import ApiKey
from tests.scenarios.scenario_cluster import FaultRule
from tests.scenarios.scenario_cluster import flags_under_test
from tests.scenarios.scenario_cluster import scenario_cluster

pytestmark = [pytest.mark.integration, pytest.mark.scenario, pytest.mark.timeout(120)]

TOPIC = "zombie"
SESSION_MS = 1500
LAG_MS = 2000
ZOMBIE = 3


def heartbeats_dropped(node: int, times: int = -1) -> FaultRule:
    return FaultRule(
        api_key=int(ApiKey.BROKER_HEARTBEAT), action="drop", peer_id=node, remaining=times
    )


@pytest.mark.parametrize("protection", ["on", "off"])
async def test_zombie_replica_with_stale_metadata_is_fenced_and_kept_out_of_isr(
    tmp_path: Path, protection: str
) -> None:
    broker_flags = flags_under_test(
        protection, "--unsafe-ignore-leader-epoch", "--replica-lag-time-max-ms", str(LAG_MS)
    )
    with scenario_cluster(tmp_path) as c:
        c.start_three_brokers(*broker_flags, session_timeout_ms=SESSION_MS)
        async with c.faults_cleared_after():
            await c.create_on_three(TOPIC)
            start = await c.wait_leader(TOPIC, 1)
            epoch = start.leader_epoch
            assert (await c.produce(1, TOPIC, [b"a"], current_leader_epoch=epoch)).error_code == 0

            # 1. Broker 3 stops hearing from the controller's metadata log.
            await c.cut_off_metadata(ZOMBIE)

            # 2. Broker 1 fenced (a burst of dropped heartbeats, ~4 s against a 1.5 s
            # session) -> broker 2 leads at E+1. The zombie, fetching from broker 1, falls
            # out of the ISR; broker 1's heartbeats come back and it rejoins.
            await c.faults("controller", heartbeats_dropped(1, times=20))
            await c.wait_leader(TOPIC, 2, min_epoch=epoch + 1)
            assert (await c.produce(2, TOPIC, [b"b"], acks=1)).error_code == 0
            await c.wait_partition(
                TOPIC,
                lambda p: p.leader_id == 2 and set(p.isr_nodes) == {1, 2},
                what="leader 2 with ISR [1, 2] (zombie shrunk, broker 1 back)",
            )

            # 3. Broker 2 fenced -> broker 1 leads again, at E+2: the zombie's idea of the
            # leader ("1") is accurate again, its epoch (E) is not.
            await c.faults("controller", heartbeats_dropped(2))
            now = await c.wait_leader(TOPIC, 1, min_epoch=epoch + 2, timeout=20)
            assert now.leader_epoch == epoch + 2
            zombie_view = await c.replica_log(ZOMBIE, TOPIC)
            assert (zombie_view.leader_id, zombie_view.leader_epoch) == (1, epoch), (
                "the zombie must still believe leader 1 at the old epoch"
            )
            assert (await c.produce(1, TOPIC, [b"c"], acks=1)).error_code == 0

            if protection == "on":
                # The zombie's fetches are refused, for longer than the lag time, so it
                # never rejoins the ISR on its stale state.
                deadline = time.monotonic() + LAG_MS / 1000 * 2.5
                while time.monotonic() < deadline:
                    p = await c.partition(TOPIC, via=1)
                    assert ZOMBIE not in p.isr_nodes, f"zombie admitted to the ISR: {p}"
                    await asyncio.sleep(0.2)
                fenced = f"fetch from broker 1 at leader epoch {epoch}: FENCED_LEADER_EPOCH"
                assert fenced in c.brokers[ZOMBIE].log_text()
                assert ZOMBIE not in (await c.replica_log(1, TOPIC)).isr
                assert (await c.replica_log(ZOMBIE, TOPIC)).leader_epoch == epoch
            else:
                # Pre-KIP-320: the stale fetch is served and the zombie rejoins the ISR.
                p = await c.wait_partition(
                    TOPIC,
                    lambda p: ZOMBIE in p.isr_nodes,
                    what="the zombie back in the ISR",
                    timeout=15,
                    via=1,
                )
                assert p.leader_id == 1 and p.leader_epoch == epoch + 2
                zombie_view = await c.replica_log(ZOMBIE, TOPIC)
                # An ISR member that still thinks the partition is at epoch E.
                assert zombie_view.leader_epoch == epoch
                assert await c.read_values(ZOMBIE, TOPIC) == [b"a", b"b", b"c"]
                assert "FENCED_LEADER_EPOCH" not in c.brokers[ZOMBIE].log_text()
