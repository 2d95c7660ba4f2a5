"""The controller's durable metadata log and its snapshots.

On-disk format (all integers big-endian), in the controller's data directory:

``metadata-<first offset, 20 digits>.log``
    A sequence of entries, nothing else::

        int32   length    bytes of payload (1 .. 64 MiB)
        uint32  crc       CRC-32C (Castagnoli) of payload
        bytes   payload   MessagePack of protocol.messages.MetadataEntry
                          {offset, record, epoch, change_continues}: `epoch` is the
                          controller quorum's epoch when its leader appended the
                          entry, absent (read as -1, "before the quorum") in logs
                          written before issue 17 and left out when -1;
                          `change_continues` (true on every entry of a change but its
                          last, left out when false, absent in older logs) keeps the
                          records of one commit together: readers apply whole changes

    Offsets are dense: the first entry of a file has the offset in its name and each
    next entry the previous one plus one; a file continues where the previous one
    ended. Entries are written in batches (one `write` per change, then `fsync`) and
    a change is acknowledged only after its fsync returned. A new file is started
    right after each snapshot.

``snapshot-<last offset, 20 digits>.msgpack``
    The whole metadata image as of that offset (inclusive), as records::

        bytes[8] magic    b"MBSNAP01"
        uint32   crc      CRC-32C of payload
        bytes    payload  MessagePack of SnapshotFile {last_offset, records, epoch}

    (`epoch`: the quorum epoch of the entry at `last_offset`; snapshots written before
    the controller quorum have none and read as -1, as their log entries do.)

    Written atomically (``.tmp``, fsync, rename, fsync directory); then the log files
    it covers and older snapshots are deleted.

A quorum follower whose log diverges from its leader's cuts it (`truncate`: the
file holding the offset is cut at that entry, later files deleted, then fsync), and
one too far behind replaces it with the leader's snapshot (`install`: the snapshot is
written first, then every log file goes and a new one starts after it).

Recovery (`MetadataLog.open`): load the newest snapshot, then replay the log entries
after it. A damaged *tail* of the last log file (a partial entry, or a bad entry
with no valid entry after it: a write the crash interrupted, never acknowledged) is
cut with a WARNING, and so is a change the last file ends inside of (each change is
one write, so such a write was torn and never acknowledged). Damage anywhere else (a
bad entry followed by valid ones, a gap in the offsets, a bad snapshot, a CRC-valid
entry that does not decode) means acknowledged metadata is lost: the controller
refuses to start and says so.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import re
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

import crc32c
import msgspec

from controller.errors import CorruptMetadataError
from controller.errors import MetadataLogWriteError
from controller.errors import invariant
from protocol.messages import MetadataEntry
from protocol.metadata_records import MetadataRecord
from runtime.fileio import atomic_write
from runtime.fileio import fsync_directory
from runtime.fileio import off_loop
from runtime.fileio import write_all

log = logging.getLogger(__name__)

ENTRY_HEADER = struct.Struct(">iI")
MAX_ENTRY_BYTES = 64 * 1024 * 1024
SNAPSHOT_MAGIC = b"MBSNAP01"
_SNAPSHOT_HEADER = struct.Struct(">I")

_LOG_RE = re.compile(r"^metadata-(\d{20})\.log$")
_SNAPSHOT_RE = re.compile(r"^snapshot-(\d{20})\.msgpack$")
_TMP_RE = re.compile(r"^snapshot-\d{20}\.msgpack\.tmp$")


class SnapshotFile(msgspec.Struct, kw_only=True):
    last_offset: int
    records: list[MetadataRecord]
    epoch: int = -1


_entry_encoder = msgspec.msgpack.Encoder()
_entry_decoder = msgspec.msgpack.Decoder(MetadataEntry)
_snapshot_decoder = msgspec.msgpack.Decoder(SnapshotFile)


def log_file_name(first_offset: int) -> str:
    return f"metadata-{first_offset:020d}.log"


def snapshot_file_name(last_offset: int) -> str:
    return f"snapshot-{last_offset:020d}.msgpack"


def encode_entry(entry: MetadataEntry) -> bytes:
    payload = _entry_encoder.encode(entry)
    return ENTRY_HEADER.pack(len(payload), crc32c.crc32c(payload)) + payload


def encode_snapshot(last_offset: int, records: list[MetadataRecord], epoch: int = -1) -> bytes:
    payload = _entry_encoder.encode(
        SnapshotFile(last_offset=last_offset, records=records, epoch=epoch)
    )
    return SNAPSHOT_MAGIC + _SNAPSHOT_HEADER.pack(crc32c.crc32c(payload)) + payload


def decode_snapshot(data: bytes, path: Path) -> SnapshotFile:
    head = len(SNAPSHOT_MAGIC) + _SNAPSHOT_HEADER.size
    if len(data) < head or data[: len(SNAPSHOT_MAGIC)] != SNAPSHOT_MAGIC:
        raise CorruptMetadataError(
            f"snapshot {path} has no valid header; it cannot be used and the log it replaced "
            "is gone: restore the data dir from a backup"
        )
    (crc,) = _SNAPSHOT_HEADER.unpack_from(data, len(SNAPSHOT_MAGIC))
    payload = data[head:]
    if crc32c.crc32c(payload) != crc:
        raise CorruptMetadataError(
            f"snapshot {path} fails its CRC check; restore the data dir from a backup"
        )
    try:
        return _snapshot_decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CorruptMetadataError(f"snapshot {path} does not decode ({exc})") from exc


@dataclass
class _Parsed:
    entry: MetadataEntry
    end: int


def _parse_at(data: bytes, pos: int) -> _Parsed | str:
    """The entry at `pos`, or why there is none."""
    remaining = len(data) - pos
    if remaining < ENTRY_HEADER.size:
        return f"partial entry header ({remaining} of {ENTRY_HEADER.size} bytes)"
    length, crc = ENTRY_HEADER.unpack_from(data, pos)
    if not 0 < length <= MAX_ENTRY_BYTES:
        return f"invalid entry length {length}"
    end = pos + ENTRY_HEADER.size + length
    if end > len(data):
        return f"partial entry ({remaining - ENTRY_HEADER.size} of {length} payload bytes)"
    payload = data[pos + ENTRY_HEADER.size : end]
    if crc32c.crc32c(payload) != crc:
        return "CRC mismatch"
    try:
        entry = _entry_decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        # The CRC matched, so these are the bytes we wrote: not a torn write.
        raise CorruptMetadataError(
            f"entry at byte {pos} has a valid CRC but does not decode ({exc}); was the log "
            "written by another version? restore the data dir from a backup"
        ) from exc
    return _Parsed(entry, end)


def _valid_entry_after(data: bytes, start: int, after_offset: int) -> int | None:
    """Byte position of a valid entry with offset > `after_offset` at or after `start`,
    if any. A torn tail never has one: the crash interrupted the last write."""
    for pos in range(start, len(data) - ENTRY_HEADER.size + 1):
        try:
            parsed = _parse_at(data, pos)
        except CorruptMetadataError:
            continue
        if isinstance(parsed, _Parsed) and parsed.entry.offset > after_offset:
            return pos
    return None


@dataclass
class Recovered:
    """What `MetadataLog.open` found: replay `snapshot_records` (the image as of
    `snapshot_offset`, -1 when there is no snapshot) then `entries` in order."""

    snapshot_offset: int = -1
    snapshot_records: list[MetadataRecord] = field(default_factory=list)
    snapshot_epoch: int = -1
    entries: list[MetadataEntry] = field(default_factory=list)
    truncated_bytes: int = 0


def _load_newest_snapshot(directory: Path, snapshots: list[int], recovered: Recovered) -> None:
    """The newest snapshot into `recovered`; the older ones are deleted."""
    if not snapshots:
        return
    newest = snapshots[-1]
    path = directory / snapshot_file_name(newest)
    snap = decode_snapshot(path.read_bytes(), path)
    if snap.last_offset != newest:
        raise CorruptMetadataError(
            f"snapshot {path} holds offset {snap.last_offset}, not the one in its name"
        )
    recovered.snapshot_offset = newest
    recovered.snapshot_records = list(snap.records)
    recovered.snapshot_epoch = snap.epoch
    for old in snapshots[:-1]:
        (directory / snapshot_file_name(old)).unlink()


def _drop_covered_logs(directory: Path, logs: list[int], snap_offset: int) -> list[int]:
    """Delete the log files the snapshot wholly covers (a crash came before their
    deletion); the first offsets of the others."""
    kept: list[int] = []
    for i, first in enumerate(logs):
        nxt = logs[i + 1] if i + 1 < len(logs) else None
        if nxt is not None and nxt <= snap_offset + 1:
            (directory / log_file_name(first)).unlink()
            continue
        kept.append(first)
    return kept


def _replay_file(
    path: Path, cursor: int, snap_offset: int, recovered: Recovered, *, is_last: bool
) -> int:
    """Read one log file, whose first entry must be at `cursor`: its entries past the
    snapshot go to `recovered`; a torn tail of the last file is cut. Returns the
    offset after its last entry."""
    data = path.read_bytes()
    pos = 0
    # Where the change being read began: a change is written in one write, so one
    # that the file ends inside of is the torn tail of an unacknowledged write.
    change_pos, change_cursor, change_kept = 0, cursor, len(recovered.entries)
    while pos < len(data):
        try:
            parsed = _parse_at(data, pos)
        except CorruptMetadataError as exc:
            raise CorruptMetadataError(f"{path}: {exc}") from None
        if isinstance(parsed, str):
            _cut_torn_tail(path, data, pos, parsed, cursor, recovered, is_last=is_last)
            data = data[:pos]
            break
        entry = parsed.entry
        if entry.offset != cursor:
            raise CorruptMetadataError(
                f"metadata log {path} has offset {entry.offset} at byte {pos} where "
                f"{cursor} was expected; restore the data dir from a backup"
            )
        if entry.offset > snap_offset:
            if recovered.entries and entry.epoch < recovered.entries[-1].epoch:
                raise CorruptMetadataError(
                    f"metadata log {path} has an entry of epoch {entry.epoch} at offset "
                    f"{entry.offset} (byte {pos}) after one of epoch "
                    f"{recovered.entries[-1].epoch}: epochs never go back in a log this "
                    "controller wrote; restore the data dir from a backup"
                )
            recovered.entries.append(entry)
        cursor += 1
        pos = parsed.end
        if not entry.change_continues:
            change_pos, change_cursor, change_kept = pos, cursor, len(recovered.entries)
    if is_last and change_cursor < cursor:
        _cut_partial_change(path, len(data), change_pos, change_cursor, cursor, recovered)
        del recovered.entries[change_kept:]
        cursor = change_cursor
    return cursor


def _truncate_durably(path: Path, pos: int) -> None:
    os.truncate(path, pos)
    fd = os.open(path, os.O_WRONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _cut_partial_change(
    path: Path, size: int, pos: int, first: int, end: int, recovered: Recovered
) -> None:
    """The last file ends inside a change (entries `first`..`end - 1`, from byte `pos`):
    its write was torn, so it was never acknowledged; cut it so that no reader applies
    part of a change (half of a topic's partitions, say)."""
    log.warning(
        "metadata log %s: cutting a partial change at byte %d, offsets %d..%d (its "
        "write was torn; never acknowledged)",
        path,
        pos,
        first,
        end - 1,
    )
    _truncate_durably(path, pos)
    recovered.truncated_bytes += size - pos


def _cut_torn_tail(
    path: Path, data: bytes, pos: int, why: str, cursor: int, recovered: Recovered, *, is_last: bool
) -> None:
    """The entry at byte `pos` is damaged: cut the file there if it is the torn tail
    of the last file (nothing valid follows), else refuse to start."""
    later = _valid_entry_after(data, pos + 1, cursor - 1) if is_last else None
    if not is_last or later is not None:
        where = f"; valid entries follow at byte {later}" if later else ""
        raise CorruptMetadataError(
            f"metadata log {path} is corrupt at byte {pos} ({why}){where}: "
            "acknowledged metadata would be lost; restore the data dir from a "
            "backup"
        )
    cut = len(data) - pos
    log.warning(
        "metadata log %s: cutting a torn tail of %d bytes at byte %d (%s); "
        "offsets from %d on were never acknowledged",
        path,
        cut,
        pos,
        why,
        cursor,
    )
    _truncate_durably(path, pos)
    recovered.truncated_bytes += cut


class MetadataLog:
    """Appends entries durably. Not safe for concurrent appends: the controller's single
    writer (metadata_writer.py) serializes them."""

    def __init__(self, directory: Path, active_first_offset: int, next_offset: int) -> None:
        self.directory = directory
        self._active_first = active_first_offset
        self._next_offset = next_offset
        self._fd = self._open_append(directory / log_file_name(active_first_offset))
        # One thread: writes, fsyncs and snapshots happen in order, off the event loop.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="metadata-log")
        self._failed: str | None = None

    @property
    def next_offset(self) -> int:
        return self._next_offset

    @staticmethod
    def _open_append(path: Path) -> int:
        existed = path.exists()
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if existed:
            # What recovery read back is durable from here on (the quorum reports it
            # as such): a SIGKILL between a write and its fsync left it in the page
            # cache only, and a power cut would take it back.
            os.fsync(fd)
        else:
            fsync_directory(path.parent)
        return fd

    # ------------------------------------------------------------------ recovery

    @classmethod
    def open(cls, directory: Path) -> tuple[MetadataLog, Recovered]:
        """Recover the log in `directory` (see the module docstring) and open it for
        appending. Raises CorruptMetadataError when it cannot be recovered."""
        names = sorted(os.listdir(directory))
        for name in names:
            if _TMP_RE.match(name):
                # A snapshot the crash interrupted before its rename: never used.
                (directory / name).unlink()
        snapshots = sorted(int(m.group(1)) for n in names if (m := _SNAPSHOT_RE.match(n)))
        logs = sorted(int(m.group(1)) for n in names if (m := _LOG_RE.match(n)))

        recovered = Recovered()
        _load_newest_snapshot(directory, snapshots, recovered)
        snap_offset = recovered.snapshot_offset

        kept = _drop_covered_logs(directory, logs, snap_offset)

        if kept and kept[0] > snap_offset + 1:
            raise CorruptMetadataError(
                f"metadata log in {directory} is missing offsets {snap_offset + 1}.."
                f"{kept[0] - 1} (first file {log_file_name(kept[0])}); restore the data dir "
                "from a backup"
            )

        cursor = kept[0] if kept else snap_offset + 1
        for i, first in enumerate(kept):
            path = directory / log_file_name(first)
            is_last = i == len(kept) - 1
            if first != cursor:
                raise CorruptMetadataError(
                    f"{path} starts at offset {first} but the previous file ends at {cursor - 1}; "
                    "restore the data dir from a backup"
                )
            cursor = _replay_file(path, cursor, snap_offset, recovered, is_last=is_last)

        next_offset = max(cursor, snap_offset + 1)
        if cursor < snap_offset + 1 and kept:
            log.warning(
                "metadata log ends at offset %d, before snapshot %d; continuing from the snapshot",
                cursor - 1,
                snap_offset,
            )
        if kept and not recovered.entries and snap_offset >= 0 and kept[-1] != next_offset:
            # Every kept entry is in the snapshot (a crash between snapshot and roll):
            # start the file that follows it and drop the covered ones.
            active = next_offset
            mlog = cls(directory, active, next_offset)
            for first in kept:
                (directory / log_file_name(first)).unlink()
            fsync_directory(directory)
        else:
            active = kept[-1] if kept else next_offset
            mlog = cls(directory, active, next_offset)
        return mlog, recovered

    # ------------------------------------------------------------------ appends

    def _write_sync(self, data: bytes) -> None:
        write_all(self._fd, data)
        os.fsync(self._fd)

    async def append(self, entries: list[MetadataEntry]) -> None:
        """Write `entries` (offsets continuing the log) and fsync, off the event loop.
        Returns once they are durable. Raises MetadataLogWriteError on an I/O error:
        the caller must stop, the tail is unknown until the next replay."""
        if self._failed is not None:
            raise MetadataLogWriteError(self._failed)
        invariant(bool(entries), "empty append")
        expected = self._next_offset
        for entry in entries:
            invariant(
                entry.offset == expected,
                f"metadata offsets must be dense: got {entry.offset}, expected {expected}",
            )
            expected += 1
        data = b"".join(encode_entry(e) for e in entries)
        try:
            await off_loop(self._executor, self._write_sync, data)
        except OSError as exc:
            self._failed = (
                f"cannot write the metadata log in {self.directory}: {exc.strerror or exc}; "
                "check the disk, then restart (replay cuts the unfinished tail)"
            )
            raise MetadataLogWriteError(self._failed) from exc
        self._next_offset = expected

    # ------------------------------------------------------------------ snapshots

    def _snapshot_sync(self, last_offset: int, data: bytes) -> None:
        directory = self.directory
        atomic_write(directory / snapshot_file_name(last_offset), data)
        # The snapshot is durable; from here on a failure only delays the clean-up.
        new_first = last_offset + 1
        if new_first < self._next_offset:
            # A quorum voter's snapshot of what is committed, with entries after it in
            # the log: no new file; the files it wholly covers go (recovery skips the
            # covered entries of the file that straddles it).
            self._drop_covered_sync(last_offset)
            return
        try:
            self._switch_to(new_first)
        except OSError as exc:
            log.error(
                "cannot start a new metadata log file after snapshot %d: %s", last_offset, exc
            )
            return
        for name in os.listdir(directory):
            m = _LOG_RE.match(name) or _SNAPSHOT_RE.match(name)
            if m is None:
                continue
            stale = (name.startswith("metadata-") and int(m.group(1)) < new_first) or (
                name.startswith("snapshot-") and int(m.group(1)) < last_offset
            )
            if stale:
                try:
                    (directory / name).unlink()
                except OSError as exc:
                    log.warning("cannot delete %s after snapshot %d: %s", name, last_offset, exc)
        with contextlib.suppress(OSError):
            fsync_directory(directory)

    def _drop_covered_sync(self, last_offset: int) -> None:
        directory = self.directory
        files = self._log_files()
        for first, following in itertools.pairwise(files):
            if following <= last_offset + 1:
                (directory / log_file_name(first)).unlink()
        for name in os.listdir(directory):
            m = _SNAPSHOT_RE.match(name)
            if m is not None and int(m.group(1)) < last_offset:
                (directory / name).unlink()
        with contextlib.suppress(OSError):
            fsync_directory(directory)

    async def write_snapshot(
        self, last_offset: int, records: list[MetadataRecord], epoch: int = -1
    ) -> None:
        """Write the image as of `last_offset` (at most the last appended offset: a
        quorum voter snapshots what is committed), start a new log file when it is the
        last, and delete what the snapshot covers. Raises OSError when the snapshot
        could not be written (the log is intact: a later one retries)."""
        invariant(
            last_offset <= self._next_offset - 1,
            f"snapshot at {last_offset} but the log ends at {self._next_offset - 1}",
        )
        data = encode_snapshot(last_offset, records, epoch)
        # One hop for the whole sequence, in the log's one thread: a snapshot and the
        # appends around it never interleave (runtime/fileio.py off_loop says why not
        # aiofiles).
        await off_loop(self._executor, self._snapshot_sync, last_offset, data)

    # ------------------------------------------------------------------ as the writer's log

    async def wait_writable(self) -> None:
        """A local log is always writable (the quorum's answer: replicated_log.py)."""

    def committed_entries(self, start: int, limit: int) -> list[MetadataEntry]:
        """Nothing arrives from elsewhere: what the writer appends is committed when
        `append` returns, and it applies it itself."""
        return []

    def installed_snapshot(self, next_offset: int) -> tuple[int, list[MetadataRecord]] | None:
        """Never: only a quorum follower has snapshots installed from a leader."""
        return None

    # ------------------------------------------------------------------ quorum follower

    def _log_files(self) -> list[int]:
        return sorted(
            int(m.group(1)) for n in os.listdir(self.directory) if (m := _LOG_RE.match(n))
        )

    def _truncate_sync(self, offset: int) -> None:
        directory = self.directory
        files = self._log_files()
        holding = max((f for f in files if f <= offset), default=None)
        invariant(holding is not None, f"truncation to {offset} before the first log file")
        assert holding is not None
        for first in files:
            if first > holding:
                (directory / log_file_name(first)).unlink()
        path = directory / log_file_name(holding)
        data = path.read_bytes()
        pos, cursor = 0, holding
        while cursor < offset:
            parsed = _parse_at(data, pos)
            invariant(isinstance(parsed, _Parsed), f"{path}: no entry {cursor} to truncate after")
            assert isinstance(parsed, _Parsed)
            pos, cursor = parsed.end, cursor + 1
        os.truncate(path, pos)
        if holding != self._active_first:
            self._switch_to(holding)
        os.fsync(self._fd)
        fsync_directory(directory)

    async def truncate(self, offset: int) -> None:
        """Drop the entries at `offset` and after (a quorum follower's diverging
        suffix, never committed), durably, in order with the appends."""
        if offset >= self._next_offset:
            return
        await self._off_loop_or_fail("truncate", self._truncate_sync, offset)
        self._next_offset = offset

    def _switch_to(self, first_offset: int) -> None:
        """Appends go to the file starting at `first_offset` from now on (created if
        missing); the previous file is closed."""
        new_fd = self._open_append(self.directory / log_file_name(first_offset))
        old_fd, self._fd = self._fd, new_fd
        self._active_first = first_offset
        with contextlib.suppress(OSError):
            os.close(old_fd)

    def _install_sync(self, last_offset: int, data: bytes) -> None:
        directory = self.directory
        atomic_write(directory / snapshot_file_name(last_offset), data)
        new_first = last_offset + 1
        self._switch_to(new_first)
        for name in os.listdir(directory):
            m = _LOG_RE.match(name) or _SNAPSHOT_RE.match(name)
            if m is None:
                continue
            is_log = name.startswith("metadata-")
            if (is_log and int(m.group(1)) != new_first) or (
                not is_log and int(m.group(1)) != last_offset
            ):
                (directory / name).unlink()
        fsync_directory(directory)

    async def install(self, last_offset: int, records: list[MetadataRecord], epoch: int) -> None:
        """Replace the whole log with a snapshot fetched from the quorum leader (as of
        `last_offset`): the snapshot is durable before any entry is deleted."""
        data = encode_snapshot(last_offset, records, epoch)
        await self._off_loop_or_fail("install a snapshot in", self._install_sync, last_offset, data)
        self._next_offset = last_offset + 1

    async def _off_loop_or_fail(self, what: str, fn: Any, *args: Any) -> None:
        if self._failed is not None:
            raise MetadataLogWriteError(self._failed)
        try:
            await off_loop(self._executor, fn, *args)
        except OSError as exc:
            self._failed = (
                f"cannot {what} the metadata log in {self.directory}: {exc.strerror or exc}; "
                "check the disk, then restart"
            )
            raise MetadataLogWriteError(self._failed) from exc

    def close(self) -> None:
        """Sync and close. Appends were fsynced already; this is belt and braces."""
        self._executor.shutdown(wait=True)
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1
