"""The log getting shorter at either end, on all three of its on-disk things at once:
the segment files (local_log.py), the leader-epoch checkpoint (epoch_cache.py) and
the producer snapshots (producer_state.py).

At the end (followers reconciling with their leader, KIP-101): the segments are cut
and fsynced first, then the epoch cache drops the entries at or past the new end,
then the producer state is rolled back (the last snapshot at or below the new end,
then the batch headers after it). At the start (retention, DeleteRecords): the log
start moves, the epoch cache and the snapshots below it go, then whole segments.
Pending background snapshot writes are waited for before any snapshot is read,
deleted or replaced, so they keep their order.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from broker.storage.epoch_cache import LeaderEpochFileCache
from broker.storage.errors import OffsetOutOfRangeError
from broker.storage.local_log import LocalLog
from broker.storage.producer_snapshots import ProducerSnapshots
from broker.storage.producer_state import ProducerStateManager

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LogTruncation:
    """Truncation and deletion of one replica's log (Log's methods of those names)."""

    local: LocalLog
    epoch_cache: LeaderEpochFileCache
    producer_state: ProducerStateManager
    snapshots: ProducerSnapshots
    name: str

    # ------------------------------------------------------------------ at the end

    def truncate_to(self, offset: int) -> bool:
        local = self.local
        if offset < 0:
            raise ValueError(f"cannot truncate to negative offset {offset}")
        if offset >= local.log_end_offset:
            self.epoch_cache.truncate_from_end(offset)
            return False
        if local.segments[0].base_offset > offset:
            self.truncate_fully_and_start_at(offset, None)
            return True
        old_end = local.log_end_offset
        new_end = local.truncate_to(offset)
        self.epoch_cache.truncate_from_end(new_end)
        # Roll the producer state back: the last snapshot at or below the new end,
        # then the batch headers after it.
        self.snapshots.wait()
        self.producer_state.load(local.log_start_offset, new_end, local.iter_headers)
        logger.info(
            "[Log %s] truncated from log end %d to %d (asked for %d)",
            self.name,
            old_end,
            new_end,
            offset,
        )
        local.check_invariants()
        return True

    def truncate_fully_and_start_at(self, offset: int, now_ms: int | None) -> None:
        if offset < 0:
            raise ValueError(f"cannot restart the log at negative offset {offset}")
        self.local.truncate_fully_and_start_at(offset, now_ms)
        self.epoch_cache.clear()
        self.snapshots.wait()
        self.producer_state.clear(offset)
        logger.info("[Log %s] truncated fully, restarting at offset %d", self.name, offset)
        self.local.check_invariants()

    # ------------------------------------------------------------------ at the start

    def delete_old_segments(self, high_watermark: int, now_ms: int) -> int:
        count, reason = self.local.segments_to_delete(high_watermark=high_watermark, now_ms=now_ms)
        if count:
            self._delete_prefix(count, reason=reason)
        self.producer_state.remove_expired(now_ms)
        return count

    def delete_records_before(
        self, offset: int, high_watermark: int | None, roll: Callable[[], object]
    ) -> int:
        local = self.local
        limit = local.log_end_offset if high_watermark is None else high_watermark
        if offset > limit or offset < 0:
            raise OffsetOutOfRangeError(offset, local.log_start_offset, limit)
        if offset <= local.log_start_offset:
            return local.log_start_offset
        if offset == local.log_end_offset and not local.segments[-1].is_empty:
            roll()  # every batch goes: the active segment must be deletable too
        local.advance_log_start(offset)
        self.epoch_cache.truncate_from_start(offset)
        self.snapshots.wait()
        self.producer_state.delete_snapshots_before(offset)
        count = local.segments_below(offset)
        if count:
            self._delete_prefix(count, reason="delete records")
        local.check_invariants()
        return local.log_start_offset

    def _delete_prefix(self, count: int, *, reason: str) -> None:
        self.local.delete_prefix(count)
        log_start = self.local.log_start_offset
        self.epoch_cache.truncate_from_start(log_start)
        # A snapshot below the log start could not be replayed from any more.
        self.snapshots.wait()
        self.producer_state.delete_snapshots_before(log_start)
        logger.info(
            "[Log %s] deleted %d segment(s) (%s), log start offset now %d",
            self.name,
            count,
            reason,
            log_start,
        )
        self.local.check_invariants()
