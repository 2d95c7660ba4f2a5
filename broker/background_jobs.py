"""Background jobs: high-watermark / recovery-point / log-start checkpoints, the flush.ms
and flush.messages policies, and retention."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from broker.delayed_requests import log
from broker.delayed_requests import now_ms
from broker.partition import Partition
from broker.partition import Role
from broker.replica_transitions import REPLICA_RETRY_BACKOFF_MS
from broker.storage.errors import LogDirFailureError
from broker.storage.errors import StorageError
from runtime.fileio import off_loop


class BackgroundJobs:
    """Background jobs: high-watermark / recovery-point / log-start checkpoints, the flush.ms"""

    def start_background(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.fetchers.start()
        self.alter_partitions.start()
        self._tasks = [
            asyncio.create_task(
                self._every(max(1, self.config.replica_lag_time_max_ms // 2), self._check_isr)
            ),
            asyncio.create_task(
                self._every(self.config.hw_checkpoint_interval_ms, self.checkpoint)
            ),
            asyncio.create_task(
                self._every(self.config.flush_check_interval_ms, self._flush_by_time)
            ),
            asyncio.create_task(
                self._every(self.config.retention_check_interval_ms, self._retention)
            ),
            asyncio.create_task(
                self._every(REPLICA_RETRY_BACKOFF_MS[0], self.retry_failed_replicas)
            ),
        ]

    async def _every(self, interval_ms: int, job: Callable[[], object]) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            if self.log_dir_failure is not None:
                continue  # nothing to check, flush, checkpoint or delete any more
            try:
                result = job()
                if asyncio.iscoroutine(result):
                    await result
            except asyncio.CancelledError:
                raise
            except LogDirFailureError:
                pass  # the directory went offline: announced once, where it failed
            except Exception:
                log.exception("background job %s failed", getattr(job, "__name__", job))

    async def checkpoint(self) -> None:
        """High watermarks, recovery points and log start offsets, written in a worker
        thread (each file is replaced atomically with an fsync)."""
        async with self._checkpoint_lock:
            hws = {
                tp: p.high_watermark
                for tp, p in self.partitions.items()
                if p.role is not Role.STOPPED
            }
            # Partitions not opened yet keep their last checkpointed value.
            for tp, hw in self._checkpointed_hws.items():
                hws.setdefault(tp, hw)
            await off_loop(self._executor, self.log_manager.checkpoint_high_watermarks, hws)
            await off_loop(
                self._executor, self.log_manager.checkpoint_recovery_points_and_log_starts
            )

    async def flush_partition(self, p: Partition) -> None:
        lock = self._flush_locks.setdefault(p.tp, asyncio.Lock())
        async with lock:
            if p.role is Role.STOPPED:
                return
            target = p.log_end_offset
            if p.log.recovery_point >= target:
                return  # a concurrent flush already covered it
            await off_loop(self._executor, p.log.flush, target)

    async def _after_follower_append(self, p: Partition) -> None:
        """flush.messages holds on followers too (Kafka flushes on any append)."""
        flush_messages = p.log.config.flush_messages
        if flush_messages is not None and p.log.unflushed_messages >= flush_messages:
            # Shielded: a fetcher stopped meanwhile must not release the flush lock
            # while the fsync still runs in its thread.
            await asyncio.shield(self.flush_partition(p))

    async def _flush_by_time(self) -> None:
        ts = now_ms()
        # Most topics have no flush.ms: look only at those that do.
        for tp in list(self._timed_flush):
            p = self.partitions.get(tp)
            flush_ms = p.log.config.flush_ms if p is not None else None
            if p is None or flush_ms is None or p.role is Role.STOPPED:
                continue
            if p.log.unflushed_messages > 0 and ts - p.log.last_flush_ms >= flush_ms:
                await self.flush_partition(p)

    def _retention(self) -> None:
        ts = now_ms()
        for p in list(self.partitions.values()):
            if p.role is Role.STOPPED:
                continue
            before = p.log_start_offset
            try:
                p.log.delete_old_segments(high_watermark=p.high_watermark, now_ms=ts)
            except (StorageError, OSError) as exc:
                log.error("%s: retention failed: %s", p.name, exc)
                continue
            if p.log_start_offset != before:
                p.on_log_start_moved()
                log.info(
                    "%s: retention moved the log start offset %d -> %d",
                    p.name,
                    before,
                    p.log_start_offset,
                )
                self._notify(p.tp)
