"""KIP-232 (detect outdated metadata using the leader epoch), DESIGN section 11
scenario 6: stale metadata.

    "a broker with lagging metadata answers a client; the client keeps its fresher
    view and no spurious offset reset happens."

Brokers answer Metadata from their own image, which may lag the controller. The client
remembers the highest leader epoch it has seen per partition and ignores a partition
whose answer carries an older one (KAFKA-6262: otherwise a lagging broker sends the
client back to a deposed leader, or makes a consumer reset its offset for nothing).

Invariant protected: the client's metadata for a partition never goes back in leader
epochs, so a consumer keeps consuming from its position on the current leader.

Staging, on real processes (controller + brokers 1, 2, 3; one partition, replicas
[1, 2, 3], leader 1 at epoch E, 5 records): the controller holds broker 1's
FetchMetadata and drops its heartbeats, so broker 1 is fenced and broker 2 leads at
E+1, which broker 1 never hears of: it still answers "leader 1, epoch E" and still
believes it leads (a zombie with the 5 records only). 5 more records go to broker 2.
A consumer (auto_offset_reset='none': any reset would raise) bootstraps from broker 2,
reads the 10 records at E+1, then takes a Metadata answer from broker 1 (its bootstrap
list pointed at broker 1 alone and bootstrap() run again).

- ON: the answer is reported stale for the partition and ignored: the cache still says
  leader 2 at E+1 (and the last seen epoch is E+1); the consumer goes on from its
  position (contiguous offsets, no reset, no truncation/validation error).
- OFF (the client's test-only `unsafe_accept_stale_metadata`): the cache goes back to
  leader 1 at E; the consumer sees a leader "change" and asks the deposed leader to
  validate its position 10 (epoch E+1). Broker 1 knows no epoch E+1 and says so.
  Before issue 13 that answer made the consumer report its position as lost (an
  out-of-range / truncation error under 'none', a reset under 'earliest'/'latest'),
  though all 15 records are on the real leader; since then KIP-320's retry rule
  (client/epochs.py rule 2: an "unknown epoch" answer is retried, never a truncation)
  is a second protection: the consumer retries until the metadata is right again.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import NamedTuple

import pytest

from client import AsyncConsumer
from client.types import TopicPartition
from protocol.api import ApiKey
from protocol.messages import MetadataRequest
from protocol.messages import MetadataResponse
from tests.scenarios.scenario_cluster import FaultRule
from tests.scenarios.scenario_cluster import ScenarioCluster
from tests.scenarios.scenario_cluster import consume_n
from tests.scenarios.scenario_cluster import scenario_cluster

pytestmark = [pytest.mark.integration, pytest.mark.scenario, pytest.mark.timeout(180)]

TOPIC = "stale-metadata"
TP = TopicPartition(TOPIC, 0)
SESSION_MS = 1500
STALE, NEW_LEADER = 1, 2  # broker 1: the old leader, cut off from the metadata log
FLAGS = ("--enable-test-faults", "--replica-lag-time-max-ms", "3000")


class Staged(NamedTuple):
    epoch: int  # broker 1's (stale) leader epoch
    new_epoch: int  # broker 2's
    values: list[bytes]  # on broker 2, offsets 0..9


async def stale_metadata_response(c: ScenarioCluster) -> MetadataResponse:
    async with c.client(STALE) as client:
        md = await client.call(MetadataRequest(topics=[TOPIC]))
    assert isinstance(md, MetadataResponse)
    return md


async def stage_lagging_old_leader(c: ScenarioCluster) -> Staged:
    """Start the cluster and depose broker 1 without its hearing of it (see above)."""
    c.start_three_brokers(*FLAGS, session_timeout_ms=SESSION_MS)
    await c.create_on_three(TOPIC)
    epoch = (await c.wait_leader(TOPIC, STALE)).leader_epoch
    first = [f"a-{i}".encode() for i in range(5)]
    assert await c.produce_ok(STALE, TOPIC, epoch, first) == 0
    await c.cut_off_metadata(STALE)
    await c.faults(
        "controller",
        FaultRule(api_key=int(ApiKey.BROKER_HEARTBEAT), action="drop", peer_id=STALE),
    )
    fresh = await c.wait_new_leader(TOPIC, NEW_LEADER, epoch, what="broker 2 elected", timeout=60)
    second = [f"b-{i}".encode() for i in range(5)]
    assert await c.produce_ok(NEW_LEADER, TOPIC, fresh.leader_epoch, second) == len(first)
    view = await c.replica_log(STALE, TOPIC)
    assert (view.leader_id, view.leader_epoch, view.log_end_offset) == (STALE, epoch, 5), (
        "broker 1 must still believe it leads at E with the first 5 records"
    )
    stale = (await stale_metadata_response(c)).topics[0].partitions[0]
    assert (stale.leader_id, stale.leader_epoch) == (STALE, epoch), "broker 1 must lag"
    return Staged(epoch, fresh.leader_epoch, first + second)


async def consumer_at_new_leader(
    c: ScenarioCluster, staged: Staged, *, unsafe_accept_stale_metadata: bool
) -> AsyncConsumer:
    """A consumer that read the 10 records from broker 2 at E+1, then was answered by
    the lagging broker 1."""
    host, port = c.brokers[NEW_LEADER].address
    consumer = AsyncConsumer(f"{host}:{port}", auto_offset_reset="none")
    consumer.cluster.metadata.unsafe_accept_stale_metadata = unsafe_accept_stale_metadata
    await consumer.start()
    consumer.assign([TP])
    consumer.seek(TP, 0)
    got = await consume_n(consumer, len(staged.values))
    assert [r.value for r in got] == staged.values
    meta = consumer.cluster.metadata
    assert (meta.partition(TP).leader, meta.partition(TP).leader_epoch) == (
        NEW_LEADER,
        staged.new_epoch,
    )
    position = await consumer.position_with_epoch(TP)
    assert (position.offset, position.leader_epoch) == (len(got), staged.new_epoch)
    # The lagging broker answers the client's Metadata request.
    shost, sport = c.brokers[STALE].address
    consumer.cluster.bootstrap_servers = [(shost, sport)]
    await consumer.cluster.bootstrap()
    return consumer


@contextlib.asynccontextmanager
async def answered_by_the_lagging_broker(
    c: ScenarioCluster, *, unsafe: bool
) -> AsyncIterator[tuple[Staged, AsyncConsumer]]:
    """The staging, then a consumer at the new leader answered by the lagging broker
    (`unsafe`: the client's KIP-232 rule off); controller faults cleared at the end."""
    async with c.faults_cleared_after():
        staged = await stage_lagging_old_leader(c)
        consumer = await consumer_at_new_leader(c, staged, unsafe_accept_stale_metadata=unsafe)
        async with consumer:
            yield staged, consumer


async def test_client_keeps_fresher_view_against_lagging_broker(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Protection ON (the default)."""
    caplog.set_level(logging.INFO, logger="client")
    with scenario_cluster(tmp_path) as c:
        async with answered_by_the_lagging_broker(c, unsafe=False) as (staged, consumer):
            assert "ignored stale metadata" in caplog.text
            # Still the fresher view: leader 2 at E+1.
            meta = consumer.cluster.metadata
            assert meta.partition(TP).leader == NEW_LEADER
            assert meta.partition(TP).leader_epoch == staged.new_epoch
            assert meta.last_seen_epoch(TP) == staged.new_epoch
            # The answer it ignored was the stale one (the rule, on the same cache).
            update = meta.update(await stale_metadata_response(c))
            assert update.stale == [TP] and TP not in update.updated
            assert meta.partition(TP).leader_epoch == staged.new_epoch

            # No spurious reset or validation failure: it consumes on from its
            # position (auto_offset_reset='none' would raise on any reset).
            done = len(staged.values)
            third = [f"c-{i}".encode() for i in range(5)]
            assert await c.produce_ok(NEW_LEADER, TOPIC, staged.new_epoch, third) == done
            more = await consume_n(consumer, len(third))
            assert [(r.offset, r.value) for r in more] == list(enumerate(third, start=done))
            assert meta.partition(TP).leader_epoch == staged.new_epoch
            assert (await consumer.position(TP)) == done + len(third)
            assert "reset position" not in caplog.text
            assert "truncation" not in caplog.text


async def test_stale_metadata_misleads_client_without_kip232(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Protection OFF: `unsafe_accept_stale_metadata` (test-only) lets the lagging
    broker's answer replace the fresher entry. The consumer goes back to the deposed
    leader 1 at epoch E and validates its position 10 there (a leader "change"
    E+1 -> E): the anomaly KAFKA-6262 is about. Broker 1 answers that it knows no
    epoch E+1; the consumer retries that (it used to reset, or raise under 'none')
    and goes on once a refresh shows broker 2 again: nothing is lost or re-read."""
    caplog.set_level(logging.INFO, logger="client")
    with scenario_cluster(tmp_path) as c:
        async with answered_by_the_lagging_broker(c, unsafe=True) as (staged, consumer):
            assert "ignored stale metadata" not in caplog.text
            meta = consumer.cluster.metadata
            # The fresher view is gone: back to the deposed leader at the old epoch.
            assert consumer.cluster.leader_for(TP) == (STALE, staged.epoch)
            assert meta.last_seen_epoch(TP) == staged.epoch

            done = len(staged.values)
            third = [f"c-{i}".encode() for i in range(5)]
            assert await c.produce_ok(NEW_LEADER, TOPIC, staged.new_epoch, third) == done
            more = await consume_n(consumer, len(third), timeout=60)
            # The anomaly: it asked the deposed leader about its position.
            asked_deposed = (
                f"broker {STALE} (asked at leader epoch {staged.epoch}) knows no "
                f"leader epoch <= {staged.new_epoch}"
            )
            assert asked_deposed in caplog.text
            # KIP-320's retry rule: no reset, no error, nothing re-read or skipped.
            assert [(r.offset, r.value) for r in more] == list(enumerate(third, start=done))
            assert "reset position" not in caplog.text
            values = await c.read_values(NEW_LEADER, TOPIC, replica=False)
            assert values == staged.values + third
