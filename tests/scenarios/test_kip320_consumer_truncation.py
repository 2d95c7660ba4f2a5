"""KIP-320 (consumer truncation detection), DESIGN section 11 scenario 5.

    "unclean election truncates the log; a consumer with reset policy none gets
    LogTruncationError with the exact divergence offset; with earliest/latest it
    resumes there."

KIP-320: the consumer keeps the leader epoch of the last consumed record with its
position (and its committed offset). After a leader change it asks the new leader,
with OffsetsForLeaderEpoch, where that epoch ends in its log; an end offset below the
position means records it returned are gone.

Invariant protected: a consumer never returns records of a new lineage as if they
followed records of a truncated one. It stops (policy none) with the exact divergence
offset, or resumes at that offset (earliest/latest) and then reads the new lineage
with no duplicate and no skip. The same holds for a consumer restarting from a
committed offset (with its epoch) after the truncation.

Staging (shared with scenario 3, `stage_unclean_divergence`): replicas [1, 2, 3],
min.insync.replicas=1, unclean election on; offsets 0-4 on all replicas (epoch E0),
offsets 5-8 on broker 1 only (epoch E0), read by every consumer (position (9, E0));
broker 1 killed, broker 2 elected uncleanly at E2 and given "new-0..5" at 5-10.
Divergence offset = broker 2's end offset for E0 = 5.

- ON: live consumers with policy none / earliest / latest; a group "g" that committed
  (9, E0) before the election, read back by a new consumer of the group (policy none).
- OFF: a live consumer whose position has no epoch (seek with a plain int), and a group
  "g-off" whose committed offset has no epoch: both read on at offset 9 of the new
  lineage without being told, skipping "new-0..3".
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from client import AsyncConsumer
from client.errors import LogTruncationError
from client.errors import MinibrokerError
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
from tests.scenarios.test_kip101_appendix_unclean_divergence import start_cluster

pytestmark = [pytest.mark.integration, pytest.mark.scenario, pytest.mark.timeout(240)]

OLD_END = len(IN_SYNC + ONLY_ON_1)  # 9: every consumer's position before the election


async def commit_retrying(consumer: AsyncConsumer, offsets=None, timeout: float = 60) -> None:
    """commit(), retried on retriable errors (a partition-level COORDINATOR_NOT_AVAILABLE
    while the coordinator loads is raised by commit() without retrying)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            await consumer.commit(offsets)
            return
        except MinibrokerError as exc:
            if not exc.retriable or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def test_consumer_truncation_detected_per_reset_policy(tmp_path: Path) -> None:
    truncations: dict[str, list] = {"earliest": [], "latest": []}
    with scenario_cluster(tmp_path) as c:
        # The group coordinator's __consumer_offsets (min.insync.replicas=2) lives on
        # brokers 4 and 5, which stay up: commits work while the topic's ISR is [1].
        await start_cluster(c, 4, 5)
        await c.create_topic(
            "__consumer_offsets", replicas=[4, 5], configs={"min.insync.replicas": "2"}
        )
        addrs = bootstrap(c)
        on_none = AsyncConsumer(addrs, auto_offset_reset="none")
        on_earliest = AsyncConsumer(
            addrs,
            auto_offset_reset="earliest",
            on_truncation=lambda *a: truncations["earliest"].append(a),
        )
        on_latest = AsyncConsumer(
            addrs,
            auto_offset_reset="latest",
            on_truncation=lambda *a: truncations["latest"].append(a),
        )
        off = AsyncConsumer(addrs, auto_offset_reset="none")
        group = AsyncConsumer(addrs, group_id="g", auto_offset_reset="none")
        group_off = AsyncConsumer(addrs, group_id="g-off", auto_offset_reset="none")
        consumers = [on_none, on_earliest, on_latest, off, group, group_off]

        async def commit_and_forget_epochs(c: ScenarioCluster, s: Staged) -> None:
            await commit_retrying(group)  # the position (9, E0)
            assert await group.committed(TP) == OffsetAndMetadata(OLD_END, "", s.e0)
            await commit_retrying(group_off, {TP: OffsetAndMetadata(OLD_END)})  # no epoch
            assert await group_off.committed(TP) == OffsetAndMetadata(OLD_END, "", -1)
            off.seek(TP, OLD_END)  # protection off: the same offset, no epoch

        try:
            s = await stage_unclean_divergence(
                c,
                consumers,
                before_leader_dies=commit_and_forget_epochs,
            )
            final = await c.read_values(2, TOPIC, replica=False)
            assert final == IN_SYNC + NEW
            divergence = OffsetAndMetadata(DIVERGENCE, "", s.e0)

            # Policy none: LogTruncationError with the exact divergence offset.
            error, returned = await poll_until_error(on_none)
            assert isinstance(error, LogTruncationError), repr(error)
            assert returned == []
            assert error.divergent_offsets == {TP: divergence}
            assert error.positions == {TP: OLD_END}

            # earliest / latest: resume at the divergence offset, new lineage, no
            # duplicate, no skip.
            for policy, consumer in (("earliest", on_earliest), ("latest", on_latest)):
                after = await consume_n(consumer, len(NEW))
                assert truncations[policy] == [(TP, OLD_END, divergence)], policy
                assert [r.offset for r in after] == list(range(DIVERGENCE, len(final)))
                kept = [r.value for r in s.consumed[:DIVERGENCE]]
                assert kept + [r.value for r in after] == final, policy
                assert {r.leader_epoch for r in after} == {s.e2}

            # OFF: no epoch, nothing to validate: reads on at 9 in the new lineage.
            silent = await consume_n(off, len(final) - OLD_END)
            assert [(r.offset, r.value) for r in silent] == [(9, b"new-4"), (10, b"new-5")]
            assert [r.value for r in s.consumed] + [r.value for r in silent] != final

            # Broker 1 returns, truncates its divergent suffix and rejoins.
            c.start_broker(1, *BROKER_FLAGS)
            c.start_broker(3, *BROKER_FLAGS)
            await c.wait_partition(
                TOPIC,
                lambda p: p.leader_id == 2 and set(p.isr_nodes) == set(NODES),
                what="all replicas in sync under leader 2",
                timeout=60,
            )
            assert await c.read_values(1, TOPIC) == final
        finally:
            for consumer in consumers:
                await consumer.close()

        async with AsyncConsumer(addrs, group_id="g", auto_offset_reset="none") as restarted:
            restarted.assign([TP])
            error, returned = await poll_until_error(restarted)
            assert isinstance(error, LogTruncationError), repr(error)
            assert returned == []
            assert error.divergent_offsets == {TP: divergence}
            assert error.positions == {TP: OLD_END}

        async with AsyncConsumer(addrs, group_id="g-off", auto_offset_reset="none") as r_off:
            r_off.assign([TP])
            silent = await consume_n(r_off, len(final) - OLD_END)
            assert [(r.offset, r.value) for r in silent] == [(9, b"new-4"), (10, b"new-5")]
