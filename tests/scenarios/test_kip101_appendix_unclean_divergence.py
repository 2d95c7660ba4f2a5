"""KIP-101 appendix (a), DESIGN section 11 scenario 3: divergence under unclean
election with min ISR 1: documented, and detected by consumers.

    "There is still the possibility for the log to corrupt, even with Leader epochs, if
    min.isr=1 and unclean.leader.election.enabled=true. [...] it seems sensible to forgo
    this guarantee for the unclean leader election case."

The broker cannot prevent the divergence (availability was chosen over acknowledged
records), so the guarantee moves to the consumer (KIP-320): a consumer never silently
reads a different lineage at offsets it believes follow the ones it already returned.

Invariant protected: a consumer whose position (offset, leader epoch e of the last
consumed record) lies past the point where the current leader's lineage diverges from
the one it read learns of it, and exactly where: the new leader's end offset for epoch e.

Staging, on real processes (controller + brokers 1, 2, 3; one partition, replicas
[1, 2, 3], min.insync.replicas=1, unclean.leader.election.enable=true, leader 1 at E0):

1. "in-sync-0..4" (offsets 0-4) are acknowledged by all three replicas;
2. the followers 2 and 3 stop (controlled shutdown) and leave the ISR; "only-on-1-0..3"
   (offsets 5-8, epoch E0) are acknowledged by broker 1 alone, and a consumer reads all
   nine records: its position is (9, E0);
3. broker 1 is SIGKILLed; broker 2 (out of sync, log end 5) comes back and is elected
   uncleanly at E2 > E0; "new-0..5" are written at offsets 5-10 (epoch E2).

- protection ON: the same consumer (still open, auto_offset_reset='none') notices the
  leader change, validates its position with OffsetsForLeaderEpoch(E0) and raises
  LogTruncationError; divergent_offsets = {tp: (5, E0)}, 5 being broker 2's end offset
  for epoch E0. It returns no record of the new lineage.
- protection OFF (the position kept as a plain int, so there is no epoch to validate):
  a consumer seeked to 9 reads "new-4", "new-5" at offsets 9, 10 as if they followed
  "only-on-1-3" at 8; offsets 5-8 now hold other values than the ones it returned, and
  "new-0..3" are skipped. Nothing tells it.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

import pytest

from client import AsyncConsumer
from client.errors import LogTruncationError
from client.types import ConsumerRecord
from client.types import OffsetAndMetadata
from client.types import TopicPartition
from tests.scenarios.scenario_cluster import ScenarioCluster
from tests.scenarios.scenario_cluster import consume_n
from tests.scenarios.scenario_cluster import poll_until_error
from tests.scenarios.scenario_cluster import scenario_cluster

pytestmark = [pytest.mark.integration, pytest.mark.scenario, pytest.mark.timeout(180)]

TOPIC = "divergence"
TP = TopicPartition(TOPIC, 0)
NODES = [1, 2, 3]
SESSION_MS = 1500
BROKER_FLAGS = ("--replica-lag-time-max-ms", "3000")
IN_SYNC = [f"in-sync-{i}".encode() for i in range(5)]
ONLY_ON_1 = [f"only-on-1-{i}".encode() for i in range(4)]
NEW = [f"new-{i}".encode() for i in range(6)]
DIVERGENCE = len(IN_SYNC)  # broker 2's end offset for epoch E0


@dataclass
class Staged:
    e0: int = -1
    e2: int = -1
    consumed: list[ConsumerRecord] = field(default_factory=list)  # before the election
    consumers: list[AsyncConsumer] = field(default_factory=list)


def bootstrap(c: ScenarioCluster) -> list[str]:
    return [f"{h}:{p}" for h, p in (c.brokers[n].address for n in NODES)]


async def start_cluster(c: ScenarioCluster, *extra_nodes: int) -> None:
    """Controller and brokers 1, 2, 3 (the consumers need their addresses), and any
    `extra_nodes` (not replicas of the topic)."""
    c.start_controller(session_timeout_ms=SESSION_MS)
    c.start_brokers([*NODES, *extra_nodes], *BROKER_FLAGS)


async def stage_unclean_divergence(
    c: ScenarioCluster,
    consumers: list[AsyncConsumer],
    *,
    before_followers_stop=None,  # async callable(ScenarioCluster)
    before_leader_dies=None,  # async callable(ScenarioCluster, Staged)
) -> Staged:
    """Steps 1-3 above, on a started cluster. Each consumer in `consumers` (not
    started) reads offsets 0-8 before broker 1 dies and stays open. Returns the epochs
    and the records read."""
    s = Staged(consumers=consumers)
    await c.create_topic(
        TOPIC,
        replicas=NODES,
        configs={"min.insync.replicas": "1", "unclean.leader.election.enable": "true"},
    )
    p = await c.wait_leader(TOPIC, 1)
    await c.wait_isr(TOPIC, set(NODES))
    s.e0 = p.leader_epoch
    for i, v in enumerate(IN_SYNC):
        assert await c.produce_ok(1, TOPIC, s.e0, [v]) == i
    for n in NODES:
        await c.wait_replica_end(n, TOPIC, len(IN_SYNC))
    if before_followers_stop is not None:
        await before_followers_stop(c)

    for n in (2, 3):  # the followers stop first and leave the ISR
        assert c.brokers[n].terminate() == 0
    p = await c.wait_isr(TOPIC, {1})
    assert (p.leader_id, p.leader_epoch) == (1, s.e0)
    for i, v in enumerate(ONLY_ON_1):
        assert await c.produce_ok(1, TOPIC, s.e0, [v]) == DIVERGENCE + i
    await c.wait_replica_end(1, TOPIC, DIVERGENCE + len(ONLY_ON_1))

    old = IN_SYNC + ONLY_ON_1
    for consumer in consumers:
        await consumer.start()
        consumer.assign([TP])
        consumer.seek(TP, 0)  # from the start, whatever the reset policy
        records = await consume_n(consumer, len(old))
        assert [r.value for r in records] == old
        assert [r.offset for r in records] == list(range(len(old)))
        assert {r.leader_epoch for r in records} == {s.e0}
        assert await consumer.position_with_epoch(TP) == OffsetAndMetadata(len(old), "", s.e0)
        s.consumed = records
    if before_leader_dies is not None:
        await before_leader_dies(c, s)

    c.brokers[1].kill()  # the whole ISR is down
    c.start_broker(2, *BROKER_FLAGS)  # an out-of-sync replica comes back
    p = await c.wait_leader(TOPIC, 2, min_epoch=s.e0 + 1, timeout=60)
    s.e2 = p.leader_epoch
    assert await c.produce_ok(2, TOPIC, s.e2, NEW) == DIVERGENCE
    await c.wait_replica_end(2, TOPIC, DIVERGENCE + len(NEW))
    assert await c.read_values(2, TOPIC, replica=False) == IN_SYNC + NEW
    assert await c.epoch_entries(2, TOPIC) == [(s.e0, 0), (s.e2, DIVERGENCE)]
    return s


async def test_consumer_detects_divergence_after_unclean_election(tmp_path: Path) -> None:
    with scenario_cluster(tmp_path) as c:
        await start_cluster(c)
        consumer = AsyncConsumer(bootstrap(c), auto_offset_reset="none")
        try:
            s = await stage_unclean_divergence(c, [consumer])
            error, returned = await poll_until_error(consumer)
            assert isinstance(error, LogTruncationError), repr(error)
            assert returned == [], "the consumer returned records of the new lineage"
            assert error.divergent_offsets == {TP: OffsetAndMetadata(DIVERGENCE, "", s.e0)}
            assert error.positions == {TP: len(IN_SYNC + ONLY_ON_1)}
            # The exact point: broker 2's end offset for the consumer's epoch E0.
            entries = await c.epoch_entries(2, TOPIC)
            end_of_e0 = next(start for epoch, start in entries if epoch > s.e0)
            assert error.divergent_offsets[TP].offset == end_of_e0 == DIVERGENCE
            # Resuming where it says reads the new lineage exactly.
            consumer.seek(TP, error.divergent_offsets[TP])
            after = await consume_n(consumer, len(NEW))
            assert [(r.offset, r.value) for r in after] == list(enumerate(NEW, start=DIVERGENCE))
        finally:
            await consumer.close()


async def test_without_epoch_tracking_consumer_silently_reads_other_lineage(
    tmp_path: Path,
) -> None:
    """Protection off: the consumer's position is a plain offset (no leader epoch)."""
    with scenario_cluster(tmp_path) as c:
        await start_cluster(c)
        reader = AsyncConsumer(bootstrap(c), auto_offset_reset="earliest")
        try:
            s = await stage_unclean_divergence(c, [reader])
        finally:
            await reader.close()
        before = {r.offset: r.value for r in s.consumed}
        position = len(before)  # 9, without its epoch E0

        async with AsyncConsumer(bootstrap(c), auto_offset_reset="none") as off:
            off.assign([TP])
            off.seek(TP, position)  # a plain int: nothing to validate
            after = await consume_n(off, len(NEW) - (position - DIVERGENCE))
        # No error: it reads on, offsets contiguous with what it returned before...
        assert [r.offset for r in after] == [position, position + 1]
        assert [r.value for r in after] == [b"new-4", b"new-5"]
        assert {r.leader_epoch for r in after} == {s.e2}
        # ...but the log it continues is another lineage: offsets it returned now hold
        # different values, and records of the new lineage were skipped.
        final = await c.read_values(2, TOPIC, replica=False)
        changed = {o: (before[o], final[o]) for o in before if final[o] != before[o]}
        assert sorted(changed) == [5, 6, 7, 8], changed
        seen = [before[o] for o in sorted(before)] + [r.value for r in after]
        assert seen != final
        assert [v for v in final if v not in seen] == [b"new-0", b"new-1", b"new-2", b"new-3"]
