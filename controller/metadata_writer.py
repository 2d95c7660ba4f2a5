"""The single writer of the metadata log.

Every change goes through `MetadataWriter.commit(build)`: under one lock, `build`
looks at the image and returns the records of the change and the answer to give;
the writer dry-runs the records against the image (an invariant violation is refused,
never persisted), appends them in one batch, waits for the fsync, applies them to
the image, wakes FetchMetadata long-polls and only then returns the answer. Offsets
are therefore assigned in order and an acknowledged change is always durable.

It also keeps the recent entries in memory to serve FetchMetadata (those after the
previous snapshot; older readers get a snapshot of the image instead) and writes a
snapshot every `snapshot_every` records.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TypeVar

from controller.errors import MetadataLogWriteError
from controller.errors import invariant
from controller.metadata_log import MetadataLog
from controller.state import MetadataImage
from protocol.messages import MetadataEntry
from protocol.messages.quorum_apis import as_change
from protocol.messages.quorum_apis import through_change_end
from protocol.metadata_records import MetadataRecord

log = logging.getLogger(__name__)

T = TypeVar("T")
Build = Callable[[MetadataImage], tuple[list[MetadataRecord], T]]


class MetadataWriter:
    def __init__(
        self,
        metadata_log: MetadataLog,
        image: MetadataImage,
        *,
        snapshot_every: int,
        max_waiters: int = 1000,
        retained: list[MetadataEntry] | None = None,
        snapshot_offset: int = -1,
        on_fatal: Callable[[str], None] | None = None,
    ) -> None:
        self.log = metadata_log
        self.image = image
        self.snapshot_every = snapshot_every
        self.max_waiters = max_waiters
        self.on_fatal = on_fatal
        self._lock = asyncio.Lock()
        self._retained: list[MetadataEntry] = list(retained or [])
        invariant(
            not self._retained or self._retained[-1].offset == image.last_offset,
            "the retained log ends where the image is",
        )
        self._snapshot_offset = snapshot_offset
        self._since_snapshot = len(self._retained)
        self._appended = asyncio.Event()
        self._waiters = 0
        self.failed: str | None = None
        self.snapshots_written = 0

    # ------------------------------------------------------------------ writes

    async def commit(self, build: Build[T]) -> T:
        """Run `build` against the image and make its records durable, in order with
        every other change. The work is shielded: a caller that goes away (its
        connection closed) cannot interrupt an append between fsync and apply."""
        task = asyncio.ensure_future(self._commit(build))
        # Retrieve the outcome even when nobody awaits it any more.
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return await asyncio.shield(task)

    async def _commit(self, build: Build[T]) -> T:
        async with self._lock:
            if self.failed is not None:
                raise MetadataLogWriteError(self.failed)
            # A quorum leader decides on the whole committed log (NotLeaderError on a
            # controller that is not the leader).
            await self.log.wait_writable()
            self.apply_committed()
            records, result = build(self.image)
            if records:
                await self._append(records)
            return result

    async def _append(self, records: list[MetadataRecord]) -> None:
        base = self.image.next_offset
        self.image.check(base, records)
        entries = as_change(
            [MetadataEntry(offset=base + i, record=r) for i, r in enumerate(records)]
        )
        try:
            await self.log.append(entries)
        except MetadataLogWriteError as exc:
            self.failed = str(exc)
            log.critical("%s", exc)
            if self.on_fatal is not None:
                self.on_fatal(str(exc))
            raise
        await self._apply(entries)

    async def _apply(self, entries: list[MetadataEntry]) -> None:
        self._apply_sync(entries)
        if self._since_snapshot >= self.snapshot_every:
            await self._snapshot()

    def _apply_sync(self, entries: list[MetadataEntry]) -> None:
        """Apply committed entries to the image (those it does not have yet: a quorum
        voter may have been handed them already by `apply_committed`)."""
        fresh = [e for e in entries if e.offset > self.image.last_offset]
        if not fresh:
            return
        for entry in fresh:
            self.image.apply(entry.offset, entry.record)
        self._retained.extend(fresh)
        self._since_snapshot += len(fresh)
        # Wake every long-poll: a new event for the next round of waiters.
        self._appended.set()
        self._appended = asyncio.Event()

    def apply_committed(self) -> None:
        """Bring the image up to what the log has committed (a quorum voter's entries
        committed by the leader; a snapshot installed from it). Synchronous: the image
        never shows half of a change."""
        installed = self.log.installed_snapshot(self.image.next_offset)
        if installed is not None:
            last_offset, records = installed
            image = MetadataImage()
            image.load_snapshot(last_offset, records)
            self.image = image
            self._retained.clear()
            self._snapshot_offset = last_offset
            self._since_snapshot = 0
            log.info("metadata image replaced by the leader's snapshot at offset %d", last_offset)
        while entries := self.log.committed_entries(self.image.next_offset, 10_000):
            self._apply_sync(entries)
        if self._since_snapshot >= self.snapshot_every and not self._lock.locked():
            self._snapshot_soon()

    def _snapshot_soon(self) -> None:
        task = asyncio.get_running_loop().create_task(self._snapshot_under_lock())
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _snapshot_under_lock(self) -> None:
        async with self._lock:
            if self._since_snapshot >= self.snapshot_every:
                await self._snapshot()

    async def _snapshot(self) -> None:
        last = self.image.last_offset
        records = self.image.snapshot_records()
        self._since_snapshot = 0  # on failure too: retry after another round, not per append
        try:
            await self.log.write_snapshot(last, records)
        except OSError as exc:
            log.error("cannot write metadata snapshot at offset %d: %s (will retry)", last, exc)
            return
        self.snapshots_written += 1
        # Keep serving entries since the previous snapshot, so brokers a little behind
        # still read entries rather than a whole image.
        previous = self._snapshot_offset
        drop = 0
        while drop < len(self._retained) and self._retained[drop].offset <= previous:
            drop += 1
        del self._retained[:drop]
        self._snapshot_offset = last
        log.info("metadata snapshot at offset %d (%d records)", last, len(records))

    # ------------------------------------------------------------------ reads

    @property
    def oldest_retained_offset(self) -> int:
        return self.image.next_offset - len(self._retained)

    def entries_from(self, from_offset: int, max_records: int) -> list[MetadataEntry] | None:
        """Entries starting at `from_offset`, about `max_records` of them but only whole
        changes (a topic of more partitions than that comes in one answer), or None when
        the reader needs a snapshot (older than what is retained, or beyond the end of
        the log)."""
        end = self.image.next_offset
        base = end - len(self._retained)
        if from_offset < base or from_offset > end:
            return None
        start = from_offset - base
        return self._retained[start : through_change_end(self._retained, start, max_records)]

    async def wait_for_append(self, from_offset: int, timeout_s: float) -> None:
        """Return when the log has an entry at `from_offset` or after `timeout_s`.
        Past `max_waiters` parked readers it returns at once (the reader polls)."""
        if self.image.next_offset > from_offset or timeout_s <= 0:
            return
        if self._waiters >= self.max_waiters:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        self._waiters += 1
        try:
            while self.image.next_offset <= from_offset:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return
                try:
                    await asyncio.wait_for(self._appended.wait(), remaining)
                except TimeoutError:
                    return
        finally:
            self._waiters -= 1

    @property
    def waiters(self) -> int:
        return self._waiters

    async def close(self) -> None:
        """Wait for the change in progress, then close the log."""
        async with self._lock:
            self.log.close()
