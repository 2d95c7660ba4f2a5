"""Where a leader epoch ends on a partition's current leader (OffsetsForLeaderEpoch as a
consumer asks it, KIP-320), and which epoch a given offset belongs to.

A position is (next offset, leader epoch of the record just before it). To check that
such a position still lies on the current log lineage, ask the current leader where
that epoch ends: `end_offsets_for_epochs`. An end offset below the position means the
log was truncated under it (unclean election); the end offset is the divergence point.

To *store* a position for an offset that was not reached by reading (a high watermark
from ListOffsets, say), `epochs_before_offsets` finds the epoch of the record at
`offset - 1` from the leader's epoch cache, and the offset where that epoch begins, by
walking epochs backwards with OffsetsForLeaderEpoch: asking for epoch e - 1 returns the
epoch before e and where it ends, which is where e starts. Usually two round trips.

Every request carries the cached current_leader_epoch (a deposed leader answers
FENCED_LEADER_EPOCH); retriable errors schedule a metadata refresh and are returned
(or raised) for the caller to retry within its own time budget.

The rule for validating a position (offset, epoch e), one place for the consumer and
the Spark source (driver and executors), KIP-320:

1. Ask only a leader that the metadata shows at leader epoch >= e (`leader_for_epoch`).
   A stored epoch newer than the metadata's (the client reached a deposed leader, or a
   broker whose metadata lags) makes the client refresh its metadata until it reaches
   e: the seed says "consumers are expected to wait until the metadata has at least
   reached the epoch of the committed offset before checking for truncation". Kafka's
   consumer does it with Metadata.updateLastSeenEpochIfNewer (from seek and committed
   offsets) and Metadata.partitionMetadataIfCurrent: no current leader, so the
   position stays AWAIT_VALIDATION.
2. An answer "no epoch <= e" (UNDEFINED epoch / end offset) is retried after a
   metadata refresh, never read as a truncation (`ask_leader` turns it into a
   retriable LeaderEpochBehindError). Kafka's SubscriptionState.maybeCompleteValidation
   does read it as one (offset reset, or a LogTruncationException without divergent
   offset); it can afford to only because of rule 1: a leader at epoch >= e always has
   an entry at or below e (a new leader writes (epoch, LEO) before anything else,
   retention keeps the entry covering the log start, and an epoch older than every
   entry is answered with the first entry's start offset, not UNDEFINED). So UNDEFINED
   means the broker asked is not (yet) the leader at >= e, which a retry resolves.
3. An end offset below the position is a truncation (an unclean election): the log
   diverges at that end offset, whose epoch is the answer's leader epoch.
4. An answer with an older epoch than e means the leader has no entry of e at all (it
   was elected from a replica that never followed e): the records of e read from where
   e began are not in its log, however far the older epoch runs
   (`EpochEndOffset.diverges_at`, which also applies rule 3). Needs that start offset.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Mapping
from typing import NamedTuple

from client.cluster import ClusterClient
from client.errors import BrokerResponseError
from client.errors import ConnectionFailedError
from client.errors import KafkaTimeoutError
from client.errors import LeaderEpochBehindError
from client.errors import MinibrokerError
from client.errors import RequestTimedOutError
from client.errors import error_for
from client.types import TopicPartition
from protocol.api import CONSUMER_REPLICA_ID
from protocol.api import NO_EPOCH
from protocol.errors import ErrorCode
from protocol.messages import OffsetForLeaderEpochRequest
from protocol.messages import OffsetForLeaderEpochResponse
from protocol.messages import OffsetForLeaderPartition
from protocol.messages import OffsetForLeaderTopic

# An epoch walk steps over at most this many epochs (each step is one round trip).
MAX_EPOCH_STEPS = 64


class OffsetBeyondLogEndError(MinibrokerError):
    """An offset to look up is past the current leader's log end: the log changed since
    the offset was read (truncated), or another leader answered. Find the offset again."""


class EpochOfOffset(NamedTuple):
    """The leader epoch of the record at some offset, and the offset where that epoch
    begins on the leader asked (its first record: what rule 4 needs)."""

    epoch: int
    start: int


class EpochEndOffset(NamedTuple):
    """The leader's answer for a requested epoch e: the largest epoch <= e it has
    records for, and the offset where that epoch ends (the start offset of the next
    epoch, or the log end offset). (-1, -1): the leader has no epoch <= e (its log
    starts after it)."""

    leader_epoch: int
    end_offset: int

    @property
    def unknown(self) -> bool:
        """The leader knows no epoch at or below the requested one."""
        return self.leader_epoch < 0 or self.end_offset < 0

    def truncates(self, offset: int) -> bool:
        """Rule 3: the epoch ends below `offset`, so the log diverges under a position
        there (at `end_offset`)."""
        return self.end_offset < offset

    def diverges_at(self, position: int, epoch: int, epoch_start: int = -1) -> int | None:
        """Where a consumer at `position`, whose last records were of leader epoch
        `epoch` from offset `epoch_start` on (-1: not known), leaves the leader's
        lineage; None when it does not. Rule 3, and rule 4 (its unclean-election case):
        a leader that answers an older epoch than the one asked has no entry of `epoch`
        at all, so the records read in it, from `epoch_start`, are not in its log,
        however far its older epoch runs (KIP-320's end offset alone misses that: the
        leader elected from a replica that never followed the epoch)."""
        if self.end_offset < position:
            return self.end_offset
        if 0 <= self.leader_epoch < epoch and 0 <= epoch_start < position:
            return min(epoch_start, self.end_offset)
        return None


def leader_for_epoch(cluster: ClusterClient, tp: TopicPartition, epoch: int) -> tuple[int, int]:
    """(leader, its leader epoch) to ask about a position of leader epoch `epoch`
    (rule 1): until the metadata reaches `epoch` this raises LeaderEpochBehindError
    (retriable: refresh and wait), and answers older than it count as stale (KIP-232).
    NO_EPOCH: any current leader."""
    if epoch != NO_EPOCH:
        cluster.metadata.await_leader_epoch(tp, epoch)
    return cluster.leader_for(tp)


async def end_offsets_for_epochs(
    cluster: ClusterClient, epochs: Mapping[TopicPartition, int]
) -> tuple[dict[TopicPartition, EpochEndOffset], dict[TopicPartition, MinibrokerError]]:
    """OffsetsForLeaderEpoch(epoch) for each partition, at its current leader (one
    request per leader), under rules 1 and 2: a result is never `unknown`.

    Returns (results, errors); a partition is in exactly one of them. No retry here:
    a retriable error (leader moved, no leader yet, metadata behind the epoch) has
    already asked for a metadata refresh; the caller decides how long to keep trying."""
    if any(e < 0 for e in epochs.values()):
        raise ValueError(f"leader epochs must be >= 0: {dict(epochs)}")
    results: dict[TopicPartition, EpochEndOffset] = {}
    errors: dict[TopicPartition, MinibrokerError] = {}
    for tp, outcome in (await _one_round(cluster, epochs)).items():
        if isinstance(outcome, EpochEndOffset):
            results[tp] = outcome
        else:
            errors[tp] = outcome
    return results, errors


async def _one_round(
    cluster: ClusterClient, epochs: Mapping[TopicPartition, int]
) -> dict[TopicPartition, EpochEndOffset | MinibrokerError]:
    """One request per current leader; an outcome for every partition."""
    outcomes: dict[TopicPartition, EpochEndOffset | MinibrokerError] = {}
    by_leader: dict[int, dict[TopicPartition, tuple[int, int]]] = defaultdict(dict)
    for tp, epoch in epochs.items():
        try:
            leader, current = leader_for_epoch(cluster, tp, epoch)
        except BrokerResponseError as exc:
            if exc.invalid_metadata:
                cluster.request_refresh()
            outcomes[tp] = exc
            continue
        by_leader[leader][tp] = (current, epoch)
    answers = await asyncio.gather(
        *(ask_leader(cluster, node, asked) for node, asked in by_leader.items())
    )
    for answer in answers:
        outcomes.update(answer)
    return outcomes


async def ask_leader(
    cluster: ClusterClient,
    node: int,
    asked: Mapping[TopicPartition, tuple[int, int]],
    *,
    timeout_ms: int | None = None,
) -> dict[TopicPartition, EpochEndOffset | MinibrokerError]:
    """One OffsetsForLeaderEpoch request to broker `node`: `asked` maps each partition
    to (current_leader_epoch, leader epoch to look up). An outcome for every partition:
    the answer, or the error (retriable ones have asked for a metadata refresh). An
    UNDEFINED answer is a LeaderEpochBehindError (rule 2), never a result."""
    by_topic: dict[str, list[OffsetForLeaderPartition]] = defaultdict(list)
    for tp, (current, epoch) in asked.items():
        by_topic[tp.topic].append(
            OffsetForLeaderPartition(
                partition=tp.partition, current_leader_epoch=current, leader_epoch=epoch
            )
        )
    request = OffsetForLeaderEpochRequest(
        replica_id=CONSUMER_REPLICA_ID,
        topics=[OffsetForLeaderTopic(topic=t, partitions=ps) for t, ps in by_topic.items()],
    )
    try:
        response = await cluster.send(node, request, timeout_ms=timeout_ms)
    except (ConnectionFailedError, RequestTimedOutError, BrokerResponseError) as exc:
        return dict.fromkeys(asked, exc)
    assert isinstance(response, OffsetForLeaderEpochResponse)
    out: dict[TopicPartition, EpochEndOffset | MinibrokerError] = {}
    for topic in response.topics:
        for p in topic.partitions:
            tp = TopicPartition(topic.topic, p.partition)
            if tp not in asked:
                continue
            error: BrokerResponseError | None = None
            if p.error_code != ErrorCode.NONE:
                error = error_for(p.error_code, topic=tp.topic, partition=tp.partition)
            elif p.leader_epoch < 0 or p.end_offset < 0:
                current, epoch = asked[tp]
                error = LeaderEpochBehindError(
                    f"broker {node} (asked at leader epoch {current}) knows no leader epoch "
                    f"<= {epoch}: it is not the leader at that epoch yet; retrying after a "
                    "metadata refresh",
                    topic=tp.topic,
                    partition=tp.partition,
                )
            if error is None:
                out[tp] = EpochEndOffset(p.leader_epoch, p.end_offset)
                continue
            out[tp] = error
            if error.invalid_metadata:
                cluster.request_refresh()
    for tp in asked.keys() - out.keys():
        out[tp] = error_for(
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            f"broker {node} did not answer for this partition",
            topic=tp.topic,
            partition=tp.partition,
        )
    return out


async def epochs_before_offsets(
    cluster: ClusterClient,
    offsets: Mapping[TopicPartition, int],
) -> dict[TopicPartition, EpochOfOffset]:
    """For each partition, the leader epoch of the record at `offset - 1` on the current
    leader and where that epoch begins there ((-1, -1) for offset 0; epoch 0, the first
    epoch, begins at 0). Raises OffsetBeyondLogEndError for an offset past the
    leader's log end, the first error met (retriable ones too: the caller retries the
    whole walk), or KafkaTimeoutError if a walk needs more than MAX_EPOCH_STEPS steps."""
    out: dict[TopicPartition, EpochOfOffset] = {}
    # Per partition: the candidate epoch (its records start at or before offset - 1
    # unless a step shows otherwise). First candidate: the latest epoch of the log.
    walking: dict[TopicPartition, int] = {}
    first_ask: dict[TopicPartition, int] = {}
    for tp, offset in offsets.items():
        if offset <= 0:
            out[tp] = EpochOfOffset(NO_EPOCH, -1)
            continue
        _, leader_epoch = cluster.leader_for(tp)
        first_ask[tp] = leader_epoch
    if first_ask:
        latest = await _answers(cluster, first_ask)
        for tp, answer in latest.items():
            if answer.end_offset < offsets[tp]:
                raise OffsetBeyondLogEndError(
                    f"{tp}: offset {offsets[tp]} is past the current leader's log end "
                    f"{answer.end_offset}"
                )
            walking[tp] = answer.leader_epoch
    for _ in range(MAX_EPOCH_STEPS):
        done = {tp: e for tp, e in walking.items() if e == 0}
        out.update((tp, EpochOfOffset(0, 0)) for tp in done)
        ask = {tp: e - 1 for tp, e in walking.items() if tp not in done}
        if not ask:
            return out
        previous = await _answers(cluster, ask)
        walking = {}
        for tp, answer in previous.items():
            candidate = ask[tp] + 1
            # answer.end_offset is where the epoch after answer.leader_epoch starts: the
            # candidate epoch's start when the leader has records in it.
            if answer.end_offset <= offsets[tp] - 1:
                out[tp] = EpochOfOffset(candidate, answer.end_offset)
            else:
                walking[tp] = answer.leader_epoch
    raise KafkaTimeoutError(
        f"finding the leader epoch of offsets {dict(offsets)} took more than "
        f"{MAX_EPOCH_STEPS} steps"
    )


async def _answers(
    cluster: ClusterClient, epochs: Mapping[TopicPartition, int]
) -> dict[TopicPartition, EpochEndOffset]:
    results, errors = await end_offsets_for_epochs(cluster, epochs)
    if errors:
        raise next(iter(errors.values()))
    return results
