"""Planning a micro-batch or a batch read, as plain functions over plain values (no I/O,
no Spark): validate stored positions, cap ranges, split ranges into tasks.

The driver gathers the facts (log start offsets, high watermarks, where each stored
epoch ends on the current leader: OffsetsForLeaderEpoch) and these functions decide.
The executors then check what they read against each OffsetRange's epoch bounds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import replace

from client.epochs import EpochEndOffset
from client.spark.offsets import NO_EPOCH
from client.spark.offsets import Position
from client.types import TopicPartition


def data_loss_hint(going_on: str) -> str:
    """The last sentence of a data-loss failure: what failOnDataLoss=false would do."""
    return (
        'If you want the query to go on in such cases, set the source option "failOnDataLoss" '
        f'to "false": the source then {going_on}, and logs a WARNING.'
    )


class DataLossError(RuntimeError):
    """Records the query was about to read, or already read, are no longer in the log."""


TRUNCATION = "truncation"
RETENTION = "retention"


@dataclass(frozen=True)
class DataLoss:
    """One detected loss: which partition, the message naming what was lost, what the
    source does about it with failOnDataLoss=false (a phrase after "the source then"),
    and its kind (TRUNCATION, RETENTION, or another: a partition gone or added late)."""

    tp: TopicPartition
    message: str
    going_on: str
    kind: str = RETENTION


@dataclass(frozen=True)
class StartDecision:
    """Where a partition's next range starts, and the loss found deciding it (if any)."""

    start: Position
    loss: DataLoss | None = None


def validate_stored_position(
    tp: TopicPartition,
    stored: Position,
    epoch_end: EpochEndOffset | None,
    log_start: int,
    *,
    given: bool = False,
) -> StartDecision:
    """Check a checkpointed position (or, `given`, a position with an epoch given in
    startingOffsets) against the current log.

    `epoch_end` is the current leader's answer to OffsetsForLeaderEpoch(stored.epoch)
    (None when the position has no epoch: nothing to validate, like Kafka), got under
    the rules of client/epochs.py: from a leader at that epoch or newer, and never
    "unknown" (that answer is retried, never a loss). Where the position leaves the
    leader's lineage is EpochEndOffset.diverges_at's rule: an end offset below the
    stored offset, or an older epoch than the stored one (the leader never had it) from
    where the stored epoch began (stored.epoch_start; unknown in checkpoints of the
    older source, which only the end offset then validates). The records from the
    divergence up to the stored offset that the query already processed are gone (even
    if the log has since grown back past the stored offset). A position below the log
    start is a retention loss, as Spark's Kafka source reports it. A given position is
    not blamed on an election: its epoch may simply be wrong."""
    if epoch_end is not None and stored.epoch != NO_EPOCH and stored.offset > 0:
        if epoch_end.unknown:
            raise ValueError(
                f"{tp}: an 'unknown epoch' answer for leader epoch {stored.epoch} must be "
                "retried (client.epochs.end_offsets_for_epochs), never read as a loss"
            )
        divergence = epoch_end.diverges_at(stored.offset, stored.epoch, stored.epoch_start)
        if divergence is not None:
            subject = "the startingOffsets position" if given else "the stored offset"
            detail = describe_divergence(
                f"{subject} {stored.offset}", stored, epoch_end, divergence
            )
            # The answer's epoch ends at its end offset, so it is the epoch of the record
            # before that offset; before an earlier divergence (rule 4) the epoch is
            # some epoch <= it, not known from this answer: the range starts without one.
            exact = divergence == epoch_end.end_offset
            if given:
                what = (
                    f"topic {tp.topic} partition {tp.partition}: {detail}. The leader epoch "
                    f"given for offset {stored.offset} is not the one the log has there "
                    f"(a wrong epoch, or a log truncated at offset {divergence} since the "
                    f"position was taken)"
                )
            else:
                what = (
                    f"log truncation detected on topic {tp.topic} partition {tp.partition}: "
                    f"truncated at offset {divergence} of leader epoch {stored.epoch}: "
                    f"{detail}. Records {divergence} to {stored.offset - 1} that this query "
                    f"already read are no longer in the log (an unclean leader election); "
                    f"offsets from {divergence} on now hold other records"
                )
            return StartDecision(
                Position(divergence, epoch_end.leader_epoch if exact else NO_EPOCH),
                DataLoss(
                    tp,
                    what + ".",
                    f"resumes at offset {divergence}, the divergence offset (on the current "
                    "leader's lineage)",
                    TRUNCATION,
                ),
            )
    if stored.offset < log_start:
        return StartDecision(Position(log_start), retention_loss(tp, stored.offset, log_start))
    return StartDecision(stored)


def retention_loss(tp: TopicPartition, offset: int, log_start: int) -> DataLoss:
    """Offsets from `offset` up to the log start were deleted before the query read them."""
    return DataLoss(
        tp,
        f"{tp.topic} partition {tp.partition}: retention deleted the log past offset "
        f"{offset}: offsets {offset} to {log_start - 1} are no longer in the log (the log "
        f"starts at {log_start}): the data was deleted by retention, or the topic was "
        f"recreated, before the query read it. Some data may have been lost.",
        f"resumes at offset {log_start}, the first offset still in the log",
        RETENTION,
    )


def describe_divergence(subject: str, at: Position, answer: EpochEndOffset, divergence: int) -> str:
    """Why the position `at` (named `subject`) leaves the current leader's lineage at
    `divergence` (what EpochEndOffset.diverges_at found from `answer`), for the data-loss
    messages of the driver and the executors."""
    if answer.truncates(at.offset):
        why = (
            f"is past the end of that epoch on the current leader (leader epoch "
            f"{answer.leader_epoch} ends at offset {answer.end_offset} there)"
        )
    else:
        why = (
            f"is not on the current leader's lineage: that leader has no records of leader "
            f"epoch {at.epoch} at all (the newest epoch it has at or below it, "
            f"{answer.leader_epoch}, runs to offset {answer.end_offset}; it was elected from "
            f"a replica that never had epoch {at.epoch}), so the records of epoch {at.epoch} "
            f"from offset {at.epoch_start} on are not in its log"
        )
    return f"{subject} (leader epoch {at.epoch}) {why}; the log diverges at offset {divergence}"


def new_partition_start(tp: TopicPartition, log_start: int) -> StartDecision:
    """A partition that appeared while the query runs is read from its earliest offset;
    like Spark's Kafka source, a log that no longer starts at 0 is reported."""
    if log_start == 0:
        return StartDecision(Position(0))
    return StartDecision(
        Position(log_start),
        DataLoss(
            tp,
            f"added partition {tp.topic} partition {tp.partition} starts at offset "
            f"{log_start} instead of 0: records before it were deleted before the query "
            f"saw the partition. Some data may have been lost.",
            f"reads it from offset {log_start}, the first offset still in the log",
        ),
    )


def vanished_partition(tp: TopicPartition, stored: Position) -> DataLoss:
    """A partition in the checkpoint that the cluster no longer has."""
    return DataLoss(
        tp,
        f"{tp.topic} partition {tp.partition} is gone (topic deleted?) while the query "
        f"was at offset {stored.offset} (leader epoch {stored.epoch}). Some data may "
        f"have been lost.",
        "stops reading it",
        "gone",
    )


def cap_ends(
    starts: Mapping[TopicPartition, int],
    latest: Mapping[TopicPartition, int],
    max_records: int | None,
) -> dict[TopicPartition, int]:
    """End offsets: `latest`, or with `max_records` at most that many records in total,
    shared in proportion to each partition's backlog (largest remainders first, ties by
    partition), so the cap is exact and the result deterministic."""
    backlog = {tp: max(0, latest[tp] - starts[tp]) for tp in starts}
    ends = {tp: starts[tp] + n for tp, n in backlog.items()}
    total = sum(backlog.values())
    if max_records is None or total <= max_records:
        return ends
    shares = {tp: n * max_records / total for tp, n in backlog.items()}
    granted = {tp: int(share) for tp, share in shares.items()}
    left = max_records - sum(granted.values())
    by_remainder = sorted(shares, key=lambda tp: (-(shares[tp] - granted[tp]), tp))
    for tp in by_remainder[:left]:
        granted[tp] += 1
    assert sum(granted.values()) == max_records
    return {tp: starts[tp] + granted[tp] for tp in starts}


@dataclass(frozen=True)
class OffsetRange:
    """Offsets [start, end) of one partition, read by one Spark task, with the epochs
    the plan expects there:

    - start_epoch: epoch of the record at start - 1 (the reader seeks with it, so the
      consumer validates it, KIP-320); -1: do not validate; start_epoch_start: where
      that epoch began (client/epochs.py rule 4; -1: not known);
    - end_epoch: epoch the record at end - 1 must carry; -1: not checked;
    - floor_epoch / ceiling_epoch: every record read must carry an epoch in this range
      (-1: unbounded), non-decreasing. A record outside it belongs to another lineage
      than the one the plan saw."""

    tp: TopicPartition
    start: int
    end: int
    start_epoch: int = NO_EPOCH
    start_epoch_start: int = -1
    end_epoch: int = NO_EPOCH
    floor_epoch: int = NO_EPOCH
    ceiling_epoch: int = NO_EPOCH

    def __post_init__(self) -> None:
        assert 0 <= self.start <= self.end, f"bad range {self}"

    @property
    def size(self) -> int:
        return self.end - self.start

    @classmethod
    def between(cls, tp: TopicPartition, start: Position, end: Position) -> OffsetRange:
        return cls(
            tp,
            start.offset,
            end.offset,
            start_epoch=start.epoch,
            start_epoch_start=start.epoch_start,
            end_epoch=end.epoch,
            floor_epoch=start.epoch,
            ceiling_epoch=end.epoch,
        )


def split_ranges(
    ranges: list[OffsetRange], min_partitions: int | None, max_records: int | None = None
) -> list[OffsetRange]:
    """Spark's Kafka source rule (KafkaOffsetRangeCalculator): with `max_records`
    (maxRecordsPerPartition) each range is cut into ceil(size / max_records) pieces;
    then, while there are fewer than `min_partitions` ranges, each is split into pieces
    in proportion to its size. Only the first piece of a range validates the start
    epoch and only the last checks the end epoch; all keep the epoch bounds."""
    ranges = [r for r in ranges if r.size > 0]
    if max_records is not None:
        ranges = [p for r in ranges for p in _divide(r, -(-r.size // max_records))]
    if min_partitions is None or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.size for r in ranges)
    return [
        p
        for r in ranges
        for p in _divide(r, min(r.size, max(1, round(r.size / total * min_partitions))))
    ]


def _divide(r: OffsetRange, pieces: int) -> list[OffsetRange]:
    """`r` in `pieces` consecutive ranges of (nearly) equal size."""
    if pieces <= 1:
        return [r]
    out: list[OffsetRange] = []
    step, extra = divmod(r.size, pieces)
    start = r.start
    for i in range(pieces):
        end = start + step + (1 if i < extra else 0)
        out.append(
            replace(
                r,
                start=start,
                end=end,
                start_epoch=r.start_epoch if i == 0 else NO_EPOCH,
                start_epoch_start=r.start_epoch_start if i == 0 else -1,
                end_epoch=r.end_epoch if i == pieces - 1 else NO_EPOCH,
            )
        )
        start = end
    assert start == r.end
    return out
