"""The checks and offset assignment of an append, before a byte reaches a segment.

A leader append validates a client's batches in full (as Kafka's LogValidator) and
stamps their base offsets and leader epoch into the batch headers in place (outside
the CRC, layout in protocol/record_batch.py); a follower append takes the leader's
stamped batches after checking their offsets and epochs against the log.
"""

from __future__ import annotations

from typing import NamedTuple

from broker.storage.errors import InvalidAppendError
from broker.storage.errors import RecordTooLargeError
from broker.storage.producer_state import BatchMetadata
from protocol.errors import CorruptRecordError
from protocol.record_batch import BatchHeader
from protocol.record_batch import check_produce_batches
from protocol.record_batch import stamp
from protocol.record_batch import validate_batches


class AppendInfo(NamedTuple):
    """What an append wrote. Offsets are -1 for an empty follower append."""

    first_offset: int
    last_offset: int
    log_append_time: int  # -1: batches keep their CreateTime timestamps
    max_timestamp: int
    valid_bytes: int
    batch_count: int
    # True: an idempotent producer's retry; nothing was written and the offsets are
    # those of the original append.
    duplicate: bool = False


EMPTY_APPEND = AppendInfo(-1, -1, -1, -1, 0, 0)


def appended(batches: list[tuple[int, BatchHeader]], valid_bytes: int) -> AppendInfo:
    return AppendInfo(
        first_offset=batches[0][1].base_offset,
        last_offset=batches[-1][1].last_offset,
        log_append_time=-1,
        max_timestamp=max(header.max_timestamp for _, header in batches),
        valid_bytes=valid_bytes,
        batch_count=len(batches),
    )


def validate_client_batches(
    buf: bytearray | memoryview, max_message_bytes: int
) -> list[tuple[int, BatchHeader]]:
    """Every check of a client's batches: InvalidRecordError, CorruptRecordError or
    RecordTooLargeError (a batch over max.message.bytes) before anything is written."""
    batches = validate_batches(buf)
    for _, header in batches:
        if header.size > max_message_bytes:
            raise RecordTooLargeError(header.size, max_message_bytes)
    check_produce_batches(buf, batches)
    return batches


def stamp_batches(
    buf: bytearray | memoryview,
    batches: list[tuple[int, BatchHeader]],
    offset: int,
    leader_epoch: int,
) -> list[tuple[int, BatchHeader]]:
    """Assign offsets from `offset` and `leader_epoch` to the batches, in `buf` and in
    the returned headers."""
    stamped: list[tuple[int, BatchHeader]] = []
    for position, header in batches:
        stamp(buf, position, offset, leader_epoch)
        stamped.append(
            (position, header._replace(base_offset=offset, partition_leader_epoch=leader_epoch))
        )
        offset += header.last_offset_delta + 1
    return stamped


def duplicate_append(dup: BatchMetadata) -> AppendInfo:
    """The answer to an idempotent producer's retry: the original append's offsets."""
    return AppendInfo(
        first_offset=dup.first_offset,
        last_offset=dup.last_offset,
        log_append_time=-1,
        max_timestamp=dup.timestamp,
        valid_bytes=0,
        batch_count=0,
        duplicate=True,
    )


def validate_leader_batches(
    name: str,
    records: bytes | bytearray | memoryview,
    log_end: int,
    last_epoch: int,
    max_epoch: int | None = None,
) -> list[tuple[int, BatchHeader]]:
    """A follower's check of the leader's batches: complete and intact, offsets
    strictly increasing from the LEO, epochs set, never going back and (`max_epoch`,
    the epoch of the leader fetched from) never above the leader's own: a leader at
    epoch E holds no batch of a later epoch, and one appended would leave the
    follower asking about an epoch no leader knows; else InvalidAppendError."""
    try:
        batches = validate_batches(records)
    except CorruptRecordError as exc:
        raise InvalidAppendError(f"[Log {name}] corrupt batch from the leader: {exc}") from exc
    next_offset = log_end
    epoch = last_epoch
    for _, header in batches:
        if header.base_offset < next_offset:
            raise InvalidAppendError(
                f"[Log {name}] batch base offset {header.base_offset} is below "
                f"{next_offset} (log end offset {log_end}): offsets must "
                "strictly increase from the log end; truncate first"
            )
        if header.partition_leader_epoch < 0:
            raise InvalidAppendError(
                f"[Log {name}] batch at offset {header.base_offset} carries no "
                f"leader epoch ({header.partition_leader_epoch})"
            )
        if header.partition_leader_epoch < epoch:
            raise InvalidAppendError(
                f"[Log {name}] batch at offset {header.base_offset} has leader epoch "
                f"{header.partition_leader_epoch}, below the log's {epoch}"
            )
        if max_epoch is not None and header.partition_leader_epoch > max_epoch:
            raise InvalidAppendError(
                f"[Log {name}] batch at offset {header.base_offset} has leader epoch "
                f"{header.partition_leader_epoch}, above the leader's {max_epoch}"
            )
        next_offset = header.next_offset
        epoch = header.partition_leader_epoch
    return batches
