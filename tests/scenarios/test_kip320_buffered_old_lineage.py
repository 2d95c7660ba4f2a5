"""KIP-320: records buffered from a lineage that an unclean election truncated are not
handed out once the leader change is known (issue 13, item 5).

    "A consumer polling with max_records=5 has records 5-9 buffered from the old
    leader; an unclean election truncates them; the consumer's metadata already shows
    the new leader epoch (e.g. after end_offsets()); the next poll still returns
    offsets 5-9 of the old lineage, then re-delivers 5-9 of the new one."

Kafka's consumer moves a partition whose leader epoch changed in the metadata to
AWAIT_VALIDATION (SubscriptionState.maybeValidatePositionForCurrentLeader, at every
poll) and its fetch collector drops completed fetches of a partition that is not
FETCHING.

Invariant protected: once the consumer knows of a leader change, it returns nothing
fetched from the old leader until its position is validated on the new one: each
offset is returned once, from one lineage.

Staging, on real processes (controller + brokers 1, 2, 3; one partition, replicas
[1, 2, 3], min.insync.replicas=1, unclean election on, leader 1 at E0): "in-sync-0..4"
(offsets 0-4) on every replica; brokers 2 and 3 stop; "old-0..4" (offsets 5-9, E0) on
broker 1 alone. The consumer (auto_offset_reset=earliest) polls with max_records=5:
it gets offsets 0-4 and holds 5-9 fetched in the same answer. Broker 1 is killed,
broker 2 comes back and is elected uncleanly at E2, and takes "new-0..4" at offsets
5-9. end_offsets() brings E2 into the consumer's metadata.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from client import AsyncConsumer
from tests.scenarios.scenario_cluster import consume_n
from tests.scenarios.scenario_cluster import scenario_cluster
from tests.scenarios.test_kip101_appendix_unclean_divergence import BROKER_FLAGS
from tests.scenarios.test_kip101_appendix_unclean_divergence import NODES
from tests.scenarios.test_kip101_appendix_unclean_divergence import TOPIC
from tests.scenarios.test_kip101_appendix_unclean_divergence import TP
from tests.scenarios.test_kip101_appendix_unclean_divergence import bootstrap
from tests.scenarios.test_kip101_appendix_unclean_divergence import start_cluster

pytestmark = [pytest.mark.integration, pytest.mark.scenario, pytest.mark.timeout(180)]

IN_SYNC = [f"in-sync-{i}".encode() for i in range(5)]
OLD_TAIL = [f"old-{i}".encode() for i in range(5)]  # offsets 5-9 on broker 1 only
NEW_TAIL = [f"new-{i}".encode() for i in range(5)]  # offsets 5-9 after the election


async def test_records_of_a_truncated_lineage_are_not_returned_after_the_change_is_known(
    tmp_path: Path,
) -> None:
    with scenario_cluster(tmp_path) as c:
        await start_cluster(c)
        await c.create_topic(
            TOPIC,
            replicas=NODES,
            configs={"min.insync.replicas": "1", "unclean.leader.election.enable": "true"},
        )
        await c.wait_isr(TOPIC, set(NODES))
        e0 = (await c.wait_leader(TOPIC, 1)).leader_epoch
        for i, v in enumerate(IN_SYNC):
            assert await c.produce_ok(1, TOPIC, e0, [v]) == i
        for n in NODES:
            await c.wait_replica_end(n, TOPIC, len(IN_SYNC))
        for n in (2, 3):
            assert c.brokers[n].terminate() == 0
        await c.wait_isr(TOPIC, {1})
        for i, v in enumerate(OLD_TAIL):
            assert await c.produce_ok(1, TOPIC, e0, [v]) == len(IN_SYNC) + i
        await c.wait_replica_end(1, TOPIC, len(IN_SYNC) + len(OLD_TAIL))

        async with AsyncConsumer(bootstrap(c), auto_offset_reset="earliest") as consumer:
            consumer.assign([TP])
            consumer.seek(TP, 0)
            first = await consumer.poll(timeout_ms=10_000, max_records=5)
            assert [(r.offset, r.value) for r in first[TP]] == list(enumerate(IN_SYNC))

            c.brokers[1].kill()
            c.start_broker(2, *BROKER_FLAGS)
            e2 = (await c.wait_leader(TOPIC, 2, min_epoch=e0 + 1, timeout=60)).leader_epoch
            assert await c.produce_ok(2, TOPIC, e2, NEW_TAIL) == len(IN_SYNC)
            assert await c.read_values(2, TOPIC, replica=False) == IN_SYNC + NEW_TAIL

            # The change is known: end_offsets() refreshed the metadata to E2.
            assert await consumer.end_offsets([TP]) == {TP: len(IN_SYNC) + len(NEW_TAIL)}
            assert consumer.cluster.leader_for(TP) == (2, e2)

            after = await consume_n(consumer, len(NEW_TAIL))
            returned = [(r.offset, r.value, r.leader_epoch) for r in after]
            assert returned == [(5 + i, v, e2) for i, v in enumerate(NEW_TAIL)], (
                "records of the truncated lineage (or the same offsets twice) were returned"
            )
            assert await consumer.poll(timeout_ms=500) == {}
