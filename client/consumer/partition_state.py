"""Per assigned partition: its position with the leader epoch of the record before it
(KIP-320), whether it awaits validation or a reset, and the records fetched for it;
and the error answers of the coordinator APIs."""

from __future__ import annotations

import logging
from typing import Any

from client.errors import BrokerResponseError
from client.errors import error_for
from protocol.api import EARLIEST_TIMESTAMP
from protocol.api import LATEST_TIMESTAMP
from protocol.api import NO_EPOCH
from protocol.errors import ErrorCode
from protocol.messages import Message

log = logging.getLogger(__name__)


_RESET_TIMESTAMPS = {"earliest": EARLIEST_TIMESTAMP, "latest": LATEST_TIMESTAMP}


_ISOLATION = {"read_uncommitted": 0, "read_committed": 1}


_COORDINATOR_MAX_BACKOFF_S = 1.0


# Longest pause between metadata refreshes while a position waits for its leader
# epoch to appear in the metadata (Kafka's retry.backoff.max.ms).
_EPOCH_WAIT_MAX_BACKOFF_S = 1.0


# Partition or response errors after which the coordinator is looked up again (as
# Kafka's commit handler marks the coordinator unknown).
_COORDINATOR_MOVED = frozenset(
    {ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.REQUEST_TIMED_OUT}
)


def _answer_errors(response: Message, group: str) -> list[BrokerResponseError]:
    """The errors of a coordinator answer: its whole-response error code if any, else
    one per partition that failed."""
    code = getattr(response, "error_code", 0)
    if code != ErrorCode.NONE:
        return [error_for(code, f"group {group!r}")]
    return [
        error_for(p.error_code, topic=topic.name, partition=p.partition_index)
        for topic in getattr(response, "topics", ())
        for p in topic.partitions
        if p.error_code != ErrorCode.NONE
    ]


class _PartitionState:
    __slots__ = (
        "awaiting_validation",
        "backoff_until",
        "epoch_wait_since",
        "epoch_waits",
        "high_watermark",
        "leader_epoch_seen",
        "log_start_offset",
        "paused",
        "position",
        "position_epoch",
        "position_epoch_start",
        "reset",
    )

    def __init__(self) -> None:
        self.position: int | None = None
        # Leader epoch of the record just before `position` (-1: unknown), and the
        # offset of the first record of that epoch read since (-1: not known).
        self.position_epoch = NO_EPOCH
        self.position_epoch_start = -1
        self.reset: str | None = None  # pending 'earliest' / 'latest'
        self.paused = False
        self.high_watermark = -1
        self.log_start_offset = -1
        self.backoff_until = 0.0
        # Leader epoch of the metadata we last fetched with, to notice leader changes.
        self.leader_epoch_seen = NO_EPOCH
        # KIP-320: hold fetching until OffsetsForLeaderEpoch confirms the position
        # (after a leader change, or a seek/committed offset carrying an epoch).
        self.awaiting_validation = False
        # Since when (monotonic s; 0: not) the position waits for a leader at its
        # epoch (client/epochs.py rules 1, 2), and how many retries so far.
        self.epoch_wait_since = 0.0
        self.epoch_waits = 0

    def set_position(self, offset: int, epoch: int, *, validate: bool = False) -> None:
        self.position = offset
        self.position_epoch = epoch
        self.position_epoch_start = -1
        self.reset = None
        self.awaiting_validation = validate and epoch != NO_EPOCH
        self.epoch_wait_since = 0.0
        self.epoch_waits = 0


# A decoded record as the fetch buffer holds it: ConsumerRecord's fields in an exact
# tuple. CPython's GC untracks an exact tuple of atomic fields (str, int, bytes, None,
# ()) at its first collection, but never a tuple subclass such as ConsumerRecord, so
# a buffered fetch (up to ~20k records) would otherwise be rescanned by every
# collection until poll() hands it out; _drain makes the ConsumerRecords.
RecordFields = tuple[str, int, int, int, int, Any, Any, tuple[tuple[str, bytes | None], ...]]


class _Fetched:
    """Decoded records of one partition not yet returned by poll() (as RecordFields),
    or (`data` set, `records` empty) one fetch's record batches not yet returned by
    poll_batches(), undecoded: poll_batches() decodes them only after the next fetch
    is on the wire, so the decode overlaps the broker's read and the network."""

    __slots__ = ("data", "fetch_offset", "index", "next_epoch", "next_offset", "records")

    def __init__(
        self,
        fetch_offset: int,
        records: list[RecordFields],
        next_offset: int,
        next_epoch: int,
        data: bytes | None = None,
    ) -> None:
        self.fetch_offset = fetch_offset
        self.records = records
        self.data = data
        self.index = 0
        # Where the batches end (the last complete batch's next offset) and its epoch;
        # for undecoded data only a prediction from the batch headers.
        self.next_offset = next_offset
        self.next_epoch = next_epoch
