"""Checkpoint files: small text files replaced atomically on every write.

All checkpoint files share Kafka's layout (`CheckpointFile`)::

    0                       line 1: format version, always 0
    2                       line 2: number of entry lines that follow
    <field> <field> ...     one entry per line, fields separated by one space
    <field> <field> ...
                            the file ends with a newline

The broker-wide offset checkpoints in the data directory (`OffsetCheckpointFile`)
have three fields per entry, `topic partition offset`::

    replication-offset-checkpoint       high watermark of every partition
    recovery-point-offset-checkpoint    offset below which a log is known to be on disk
    log-start-offset-checkpoint         first offset a log still exposes

for example::

    0
    2
    orders 0 1500
    orders 1 1422

A file is written with `atomic_write` (temp file, fsync, rename, fsync the
directory), so a crash leaves the old or the new version. A file that does not
parse (wrong version, count not matching the lines, a bad field, no final newline,
the same partition twice) raises CorruptCheckpointError naming the file and the
line, and is never used.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path

from broker.storage.errors import CorruptCheckpointError
from runtime.fileio import atomic_write
from runtime.fileio import text_lines

__all__ = [
    "LOG_START_OFFSET_CHECKPOINT",
    "RECOVERY_POINT_CHECKPOINT",
    "REPLICATION_OFFSET_CHECKPOINT",
    "CheckpointFile",
    "OffsetCheckpointFile",
    "atomic_write",
]

REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"

CHECKPOINT_VERSION = 0

TopicPartition = tuple[str, int]


class CheckpointFile:
    """The shared version/count/entries text layout; callers give meaning to fields.

    `hint` finishes every corruption message with what the operator should do.
    """

    def __init__(self, path: Path, *, fields: int, hint: str) -> None:
        self.path = Path(path)
        self.fields = fields
        self.hint = hint

    def corrupt(self, line: int | None, problem: str) -> CorruptCheckpointError:
        where = f"{self.path}" if line is None else f"{self.path} line {line}"
        return CorruptCheckpointError(f"corrupt checkpoint file {where}: {problem}; {self.hint}")

    def read_lines(self) -> list[tuple[int, list[str]]] | None:
        """(line number, fields) of every entry, or None when the file does not exist."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self.corrupt(None, f"cannot be read ({exc.strerror})") from exc
        lines = text_lines(raw, lambda problem: self.corrupt(None, problem))
        if len(lines) < 2:
            raise self.corrupt(len(lines) + 1, "missing the version or the count line")
        version = self._parse_int(lines[0], 1, "version")
        if version != CHECKPOINT_VERSION:
            raise self.corrupt(1, f"unsupported version {version} (expected {CHECKPOINT_VERSION})")
        count = self._parse_int(lines[1], 2, "entry count")
        entries = lines[2:]
        if count != len(entries):
            raise self.corrupt(2, f"announces {count} entries but {len(entries)} lines follow")
        out: list[tuple[int, list[str]]] = []
        for number, line in enumerate(entries, start=3):
            parts = line.split(" ")
            if len(parts) != self.fields or not all(parts):
                raise self.corrupt(
                    number, f"expected {self.fields} space-separated fields, got {line!r}"
                )
            out.append((number, parts))
        return out

    def write_lines(self, entries: Iterable[Sequence[object]]) -> None:
        rows = [" ".join(str(field) for field in entry) for entry in entries]
        for row in rows:
            assert len(row.split(" ")) == self.fields, f"bad checkpoint row {row!r}"
        text = f"{CHECKPOINT_VERSION}\n{len(rows)}\n" + "".join(row + "\n" for row in rows)
        atomic_write(self.path, text.encode("utf-8"))

    def parse_int(self, value: str, line: int, what: str, *, minimum: int = 0) -> int:
        number = self._parse_int(value, line, what)
        if number < minimum:
            raise self.corrupt(line, f"{what} {number} is below {minimum}")
        return number

    def _parse_int(self, value: str, line: int, what: str) -> int:
        # int() would accept " 7", "+7" and "7_0"; a checkpoint holds plain digits only.
        digits = value[1:] if value.startswith("-") else value
        if not digits.isascii() or not digits.isdigit():
            raise self.corrupt(line, f"{what} {value!r} is not an integer")
        return int(value)


class OffsetCheckpointFile:
    """A broker-wide `topic partition offset` checkpoint (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._file = CheckpointFile(
            self.path,
            fields=3,
            hint=(
                "move the file away and restart: the broker then falls back to safe "
                "defaults (full log recovery, high watermarks from the leaders)"
            ),
        )
        # What the file holds (last read or written): an idle broker's periodic
        # checkpoint of 10,000 unchanged offsets is then no rewrite and no fsync.
        self._on_disk: dict[TopicPartition, int] | None = None

    def read(self) -> dict[TopicPartition, int]:
        """The checkpointed offsets; {} when the file does not exist."""
        lines = self._file.read_lines()
        if lines is None:
            return {}
        out: dict[TopicPartition, int] = {}
        for number, (topic, partition_text, offset_text) in lines:
            partition = self._file.parse_int(partition_text, number, "partition")
            offset = self._file.parse_int(offset_text, number, "offset")
            tp = (topic, partition)
            if tp in out:
                raise self._file.corrupt(number, f"partition {topic}-{partition} appears twice")
            out[tp] = offset
        self._on_disk = dict(out)
        return out

    def write(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Replace the file with `offsets` (atomically, fsynced), unless it holds
        exactly these already."""
        wanted = dict(offsets)
        if wanted == self._on_disk and self.exists():
            return
        rows = []
        for (topic, partition), offset in sorted(offsets.items()):
            if not topic or any(ch.isspace() for ch in topic):
                raise ValueError(f"topic name {topic!r} cannot be written to a checkpoint")
            assert partition >= 0 and offset >= 0, (topic, partition, offset)
            rows.append((topic, partition, offset))
        self._on_disk = None  # unknown until the write below completes
        self._file.write_lines(rows)
        self._on_disk = wanted

    def exists(self) -> bool:
        return os.path.exists(self.path)
