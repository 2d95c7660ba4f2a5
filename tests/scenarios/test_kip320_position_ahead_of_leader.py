"""KIP-320: a stored position whose leader epoch is newer than the leader a client
reaches is validated only once the metadata reaches that epoch (issue 13, item 4).

    "With the consumer's position at (offset 15, epoch 1), when the broker the client
    reaches is a deposed leader still at epoch 0 (it was paused through the change), it
    asks that broker where epoch 1 ends, gets 'unknown', and then resets to earliest
    (re-delivering offsets 0-9) or raises a spurious OffsetOutOfRangeError; the same
    for seek(OffsetAndMetadata(15, "", 1)) and for a committed (15, 1)."

KIP-320: "it is possible for the leader epoch included in the committed offset to be
ahead of the metadata that is known to the consumer. Consumers are expected to wait
until the metadata has at least reached the epoch of the committed offset before
checking for truncation."

Invariant protected: a position that is on the log stays where it is. A client that
reaches a deposed leader never asks it about a newer epoch, never resets or raises
because of it, and never reads that leader's older log; it waits for the metadata to
show the leader at the position's epoch (other brokers answer), then resumes exactly
at the position.

Staging, on real processes (controller + brokers 1, 2, 3; one partition, replicas
[1, 2, 3], min.insync.replicas=1, leader 1 at E): "a-0..9" (offsets 0-9, epoch E) on
every replica. The controller holds broker 1's FetchMetadata (it will hear of nothing
more), then broker 1 is paused (SIGSTOP) past the session timeout: it is fenced and
broker 2 leads at E+1 and takes "b-0..4" (offsets 10-14): a position (15, E+1).
Broker 1 is resumed (SIGCONT): still leader at E in its own eyes, with offsets 0-9 and
a Metadata answer "leader 1, epoch E". Clients bootstrap from broker 1 alone.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import NamedTuple

import pytest

from client import AsyncConsumer
from client.errors import MinibrokerError
from client.types import OffsetAndMetadata
from client.types import TopicPartition
from protocol.messages import MetadataRequest
from protocol.messages import MetadataResponse
from tests.scenarios.scenario_cluster import ScenarioCluster
from tests.scenarios.scenario_cluster import consume_n
from tests.scenarios.scenario_cluster import scenario_cluster

pytestmark = [pytest.mark.integration, pytest.mark.scenario, pytest.mark.timeout(240)]

TOPIC = "ahead"
TP = TopicPartition(TOPIC, 0)
SESSION_MS = 1500
DEPOSED, NEW_LEADER = 1, 2
OLD = [f"a-{i}".encode() for i in range(10)]  # offsets 0-9 at E, on every replica
NEWER = [f"b-{i}".encode() for i in range(5)]  # offsets 10-14 at E+1, on broker 2
POSITION = len(OLD) + len(NEWER)  # 15


class Deposed(NamedTuple):
    epoch: int  # broker 1's leader epoch, as it still believes
    new_epoch: int  # broker 2's


async def stage_deposed_leader(c: ScenarioCluster) -> Deposed:
    """Start the cluster and depose broker 1 while it is paused (see above)."""
    c.start_controller("--enable-test-faults", session_timeout_ms=SESSION_MS)
    c.start_brokers((1, 2, 3))
    # Committed offsets live on brokers 2 and 3, which stay up.
    await c.create_topic("__consumer_offsets", replicas=[2, 3])
    await c.create_topic(TOPIC, replicas=[1, 2, 3], configs={"min.insync.replicas": "1"})
    await c.wait_isr(TOPIC, {1, 2, 3})
    epoch = (await c.wait_leader(TOPIC, DEPOSED)).leader_epoch
    assert await c.produce_ok(DEPOSED, TOPIC, epoch, OLD) == 0
    for node in (1, 2, 3):
        await c.wait_replica_end(node, TOPIC, len(OLD))

    await c.cut_off_metadata(DEPOSED)
    c.pause(DEPOSED)
    fresh = await c.wait_new_leader(
        TOPIC, NEW_LEADER, epoch, what="broker 2 elected while broker 1 is paused", timeout=60
    )
    assert await c.produce_ok(NEW_LEADER, TOPIC, fresh.leader_epoch, NEWER) == len(OLD)
    c.resume(DEPOSED)

    view = await c.replica_log(DEPOSED, TOPIC)
    assert (view.leader_id, view.leader_epoch, view.log_end_offset) == (DEPOSED, epoch, 10), (
        "broker 1 must still believe it leads at E with offsets 0-9"
    )
    async with c.client(DEPOSED) as client:
        md = await client.call(MetadataRequest(topics=[TOPIC]))
    assert isinstance(md, MetadataResponse)
    stale = md.topics[0].partitions[0]
    assert (stale.leader_id, stale.leader_epoch) == (DEPOSED, epoch), "broker 1 must lag"
    return Deposed(epoch, fresh.leader_epoch)


def address(c: ScenarioCluster, node: int) -> str:
    host, port = c.brokers[node].address
    return f"{host}:{port}"


async def test_a_position_ahead_of_a_deposed_leader_resumes_where_it_was(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="client")
    with scenario_cluster(tmp_path) as c:
        try:
            s = await stage_deposed_leader(c)
            stored = OffsetAndMetadata(POSITION, "", s.new_epoch)
            async with AsyncConsumer(
                address(c, NEW_LEADER), group_id="g", auto_offset_reset="none"
            ) as committer:
                await committer.commit({TP: stored})
                assert await committer.committed(TP) == stored

            later = [f"c-{i}".encode() for i in range(3)]
            assert await c.produce_ok(NEW_LEADER, TOPIC, s.new_epoch, later) == POSITION
            expected = [(POSITION + i, v, s.new_epoch) for i, v in enumerate(later)]

            outcomes: dict[str, object] = {}
            for how, policy in (("seek", "earliest"), ("seek", "none"), ("committed", "none")):
                case = f"{how}/{policy}"
                caplog.clear()
                consumer = AsyncConsumer(
                    address(c, DEPOSED),
                    group_id="g" if how == "committed" else None,
                    auto_offset_reset=policy,
                )
                async with consumer:
                    await consumer.cluster.refresh_metadata([TOPIC])
                    assert consumer.cluster.leader_for(TP) == (DEPOSED, s.epoch)
                    consumer.assign([TP])
                    if how == "seek":
                        consumer.seek(TP, stored)
                    try:
                        got = await consume_n(consumer, len(later))
                    except MinibrokerError as exc:
                        outcomes[case] = f"raised {exc!r}"
                        continue
                    outcomes[case] = (
                        [(r.offset, r.value, r.leader_epoch) for r in got],
                        await consumer.position_with_epoch(TP),
                        consumer.cluster.leader_for(TP),
                        # It waited for the metadata instead of asking broker 1 about
                        # E+1, and never reset.
                        "knows no leader epoch" in caplog.text,
                        "reset position" in caplog.text,
                    )
            # Each resumed exactly at 15: nothing of broker 1's log, no error.
            end = OffsetAndMetadata(POSITION + len(later), "", s.new_epoch)
            resumed = (expected, end, (NEW_LEADER, s.new_epoch), False, False)
            assert outcomes == dict.fromkeys(outcomes, resumed), outcomes
        finally:
            await c.faults("controller", clear=True)
            for proc in c.brokers.values():
                if proc.alive:
                    os.kill(proc.pid, signal.SIGCONT)
