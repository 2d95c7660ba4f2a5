"""KIP-320 across a rebalance (issue 16): a partition handed to another member of the
group starts from the committed offset and its leader epoch, validated as after a seek.

    "Truncation detection keeps working across rebalances: a partition handed to a new
    member starts from the committed offset and its epoch, validated as today."

A member that takes over a partition has read none of it: all it has is the group's
committed offset. KIP-320 stores the leader epoch of the last consumed record with that
offset (OffsetCommit v6+), so the new owner can ask the current leader, with
OffsetsForLeaderEpoch, where that epoch ends in its log before fetching.

Invariant protected: a group never hands a member a position in a lineage other than
the one its committed offset was taken in without saying so. The new owner stops
(policy none) with the exact divergence offset, or resumes there (earliest) and reads
the new lineage with nothing duplicated after the kept part and nothing skipped.

Staging (`stage_unclean_divergence`, shared with scenario 3): replicas [1, 2, 3],
min.insync.replicas=1, unclean election on; offsets 0-4 on all replicas (epoch E0),
offsets 5-8 on broker 1 only. Before broker 1 dies, each group's two members (both
subscribed, the coordinator on brokers 4 and 5, which stay up) split the one partition:
the member that owns it reads offsets 0-8 and commits (9, E0). Broker 1 is killed,
broker 2 elected uncleanly at E2 writes "new-0..5" at 5-10: divergence offset 5. Then
the owner leaves; the rebalance hands the partition to the other member.

- ON, group "g-none" (policy none): the new owner's poll() raises LogTruncationError
  with divergent_offsets {tp: (5, E0)}, returning nothing.
- ON, group "g-earliest": the new owner is told (on_truncation) and reads 5-10, the new
  lineage, exactly.
- OFF, group "g-off": the owner committed offset 9 without its epoch; the new owner
  reads "new-4", "new-5" at 9 and 10 as if they followed offset 8 of the old lineage,
  skipping "new-0..3", and nothing tells it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

import pytest

from client import AsyncConsumer
from client.errors import LogTruncationError
from client.types import ConsumerRecord
from client.types import OffsetAndMetadata
from tests.scenarios.scenario_cluster import ScenarioCluster
from tests.scenarios.scenario_cluster import consume_n
from tests.scenarios.scenario_cluster import poll_until_error
from tests.scenarios.scenario_cluster import scenario_cluster
from tests.scenarios.test_kip101_appendix_unclean_divergence import BROKER_FLAGS
from tests.scenarios.test_kip101_appendix_unclean_divergence import DIVERGENCE
from tests.scenarios.test_kip101_appendix_unclean_divergence import IN_SYNC
from tests.scenarios.test_kip101_appendix_unclean_divergence import NEW
from tests.scenarios.test_kip101_appendix_unclean_divergence import NODES
from tests.scenarios.test_kip101_appendix_unclean_divergence import ONLY_ON_1
from tests.scenarios.test_kip101_appendix_unclean_divergence import TOPIC
from tests.scenarios.test_kip101_appendix_unclean_divergence import TP
from tests.scenarios.test_kip101_appendix_unclean_divergence import Staged
from tests.scenarios.test_kip101_appendix_unclean_divergence import bootstrap
from tests.scenarios.test_kip101_appendix_unclean_divergence import stage_unclean_divergence
from tests.scenarios.test_kip320_consumer_truncation import commit_retrying

pytestmark = [pytest.mark.integration, pytest.mark.scenario, pytest.mark.timeout(240)]

OLD = IN_SYNC + ONLY_ON_1
OLD_END = len(OLD)  # 9: the owner's position, committed before the election
COORDINATORS = (4, 5)  # __consumer_offsets' replicas: up throughout
GROUP_FLAGS = ("--group-initial-rebalance-delay-ms", "0")


@dataclass
class Group:
    """Two subscribed members of one group; `owner` read offsets 0-8 and committed."""

    name: str
    policy: str
    with_epoch: bool  # protection: the committed offset carries its leader epoch
    members: list[AsyncConsumer] = field(default_factory=list)
    truncations: list[tuple] = field(default_factory=list)
    owner: AsyncConsumer | None = None
    successor: AsyncConsumer | None = None

    def open(self, addrs: list[str]) -> None:
        self.members = [
            AsyncConsumer(
                addrs,
                group_id=self.name,
                auto_offset_reset=self.policy,
                on_truncation=lambda *a: self.truncations.append(a),
                session_timeout_ms=10_000,
                heartbeat_interval_ms=500,
                # OFF: the owner's leaving must not commit its position (with its epoch)
                commit_on_revoke=self.with_epoch,
            )
            for _ in range(2)
        ]


async def split_and_read(group: Group, timeout: float = 60) -> list[ConsumerRecord]:
    """Both members join; the one the assignor gives the partition reads offsets 0-8
    (the group's committed offset 0 is where it starts); the other is given nothing."""
    read: dict[int, list[ConsumerRecord]] = {0: [], 1: []}
    deadline = time.monotonic() + timeout
    while sum(map(len, read.values())) < OLD_END:
        assert time.monotonic() < deadline, f"{group.name}: read {read} within {timeout}s"
        polled = await asyncio.gather(*(m.poll(timeout_ms=300) for m in group.members))
        for i, batches in enumerate(polled):
            for records in batches.values():
                read[i].extend(records)
    owner = next(i for i in read if read[i])
    group.owner, group.successor = group.members[owner], group.members[1 - owner]
    assert read[1 - owner] == [], "both members of one generation read the partition"
    assert group.owner.assignment() == {TP} and group.successor.assignment() == set()
    return read[owner]


async def test_a_partition_handed_over_by_a_rebalance_is_validated_from_its_committed_epoch(
    tmp_path: Path,
) -> None:
    groups = [
        Group("g-none", "none", with_epoch=True),
        Group("g-earliest", "earliest", with_epoch=True),
        Group("g-off", "none", with_epoch=False),
    ]
    with scenario_cluster(tmp_path) as c:
        c.start_controller(session_timeout_ms=1500)
        c.start_brokers(NODES, *BROKER_FLAGS)
        c.start_brokers(COORDINATORS, *BROKER_FLAGS, *GROUP_FLAGS)
        await c.create_topic(
            "__consumer_offsets", replicas=list(COORDINATORS), configs={"min.insync.replicas": "2"}
        )
        addrs = bootstrap(c)
        for g in groups:
            g.open(addrs)

        async def members_read_and_commit(c: ScenarioCluster, s: Staged) -> None:
            for g in groups:
                async with AsyncConsumer(addrs, group_id=g.name) as seeder:
                    # Where the group starts: offset 0 (every policy then starts alike).
                    await commit_retrying(seeder, {TP: OffsetAndMetadata(0)})
                for m in g.members:
                    await m.start()
                    m.subscribe([TOPIC])
            for g in groups:
                records = await split_and_read(g)
                assert [(r.offset, r.value) for r in records] == list(enumerate(OLD))
                assert {r.leader_epoch for r in records} == {s.e0}
                assert g.owner is not None
                if g.with_epoch:
                    await commit_retrying(g.owner)  # its position (9, E0)
                    expected = OffsetAndMetadata(OLD_END, "", s.e0)
                else:
                    await commit_retrying(g.owner, {TP: OffsetAndMetadata(OLD_END)})
                    expected = OffsetAndMetadata(OLD_END, "", -1)
                assert await g.owner.committed(TP) == expected, g.name

        try:
            s = await stage_unclean_divergence(c, [], before_leader_dies=members_read_and_commit)
            final = await c.read_values(2, TOPIC, replica=False)
            assert final == IN_SYNC + NEW
            divergence = OffsetAndMetadata(DIVERGENCE, "", s.e0)

            # The owners leave: each group rebalances and hands the partition over.
            for g in groups:
                assert g.owner is not None and g.successor is not None
                await g.owner.close()
            none, earliest, off = (g.successor for g in groups)
            assert none is not None and earliest is not None and off is not None

            # ON, policy none: stopped at the exact divergence offset, nothing returned.
            error, returned = await poll_until_error(none)
            assert isinstance(error, LogTruncationError), repr(error)
            assert returned == [], "the new owner returned records of the new lineage"
            assert none.assignment() == {TP}
            assert error.divergent_offsets == {TP: divergence}
            assert error.positions == {TP: OLD_END}

            # ON, policy earliest: told, resumed at the divergence offset, new lineage.
            after = await consume_n(earliest, len(NEW))
            assert earliest.assignment() == {TP}
            assert groups[1].truncations == [(TP, OLD_END, divergence)]
            assert [(r.offset, r.value) for r in after] == list(enumerate(final))[DIVERGENCE:]
            assert {r.leader_epoch for r in after} == {s.e2}

            # OFF: no committed epoch, nothing to validate: the new owner reads on at 9
            # in the new lineage, "new-0..3" skipped, and is not told.
            silent = await consume_n(off, len(final) - OLD_END)
            assert off.assignment() == {TP}
            assert [(r.offset, r.value) for r in silent] == [(9, b"new-4"), (10, b"new-5")]
            assert groups[2].truncations == []
            assert OLD + [r.value for r in silent] != final
        finally:
            for g in groups:
                for m in g.members:
                    await m.close()
