"""Exceptions raised by the storage engine.

Every message says what is wrong, which file, and what the operator can do about it.
Request handlers map them to Kafka error codes: OffsetOutOfRangeError ->
OFFSET_OUT_OF_RANGE, RecordTooLargeError -> MESSAGE_TOO_LARGE, InvalidAppendError ->
CORRUPT_MESSAGE (follower side), any other StorageError -> KAFKA_STORAGE_ERROR.
"""

from __future__ import annotations

import errno
from pathlib import Path

from runtime.fileio import describe_os_error

# The process or the system has no file descriptor left: no disk failure.
OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)


class StorageError(Exception):
    """Base of every storage exception."""


class OffsetOutOfRangeError(StorageError):
    """A read asked for an offset outside [log_start_offset, log_end_offset]."""

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int) -> None:
        super().__init__(
            f"offset {offset} is out of range: the log holds [{log_start_offset}, {log_end_offset})"
        )
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset


class CorruptCheckpointError(StorageError):
    """A checkpoint or properties file does not parse or breaks its own invariants."""


class CorruptIndexError(StorageError):
    """An index file is inconsistent with itself or with its segment; it is rebuilt."""


class CorruptSegmentError(StorageError):
    """A segment file holds bytes that are not a clean sequence of batches."""

    def __init__(self, path: Path, position: int, problem: str) -> None:
        super().__init__(
            f"segment {path} is corrupt at position {position}: {problem}. If the other "
            f"replicas of the partition are in sync, stop the broker and move {path.parent} "
            "out of the data directory (keep it: it may hold the only copy of some "
            "records) so that the partition is re-replicated; otherwise restore it"
        )
        self.path = path
        self.position = position
        self.problem = problem


class InvalidAppendError(StorageError):
    """A follower append whose offsets do not strictly increase from the log end
    offset, or that holds a corrupt batch."""


class RecordTooLargeError(StorageError, ValueError):
    """A batch is larger than the topic's max.message.bytes."""

    def __init__(self, size: int, max_message_bytes: int) -> None:
        super().__init__(
            f"record batch of {size} bytes exceeds max.message.bytes={max_message_bytes}; "
            "send smaller batches or raise the topic's max.message.bytes"
        )
        self.size = size
        self.max_message_bytes = max_message_bytes


class LogDirFailureError(StorageError):
    """The file system under the data directory failed an operation (no space, I/O
    error, read-only, ...). The directory is offline from then on: no log in it is
    read or written again until the broker restarts (Kafka's LogDirFailureChannel)."""

    def __init__(self, data_dir: Path, operation: str, cause: OSError) -> None:
        super().__init__(
            f"log directory {data_dir} is offline: {operation} failed: "
            f"{describe_os_error(cause)}; {os_error_advice(cause, data_dir)}"
        )
        self.data_dir = data_dir
        self.operation = operation
        self.cause = cause


class FileOpenError(StorageError):
    """A file of one partition could not be opened (no descriptor left: EMFILE or
    ENFILE; or any other OSError of open). Only the operation that needed it fails,
    answered KAFKA_STORAGE_ERROR: it is not a disk failure, the data directory stays
    online and the operation may succeed once descriptors are free again."""

    def __init__(self, path: Path | str | None, cause: OSError) -> None:
        named = cause if cause.filename else OSError(cause.errno, cause.strerror, str(path))
        super().__init__(f"cannot open {describe_os_error(named)}; {open_advice(cause)}")
        self.path = path
        self.cause = cause


def open_advice(exc: OSError) -> str:
    """What to do about a file the broker could not open."""
    if exc.errno in OUT_OF_DESCRIPTORS:
        return (
            "the broker is out of file descriptors: raise its open-file limit (ulimit -n, "
            "LimitNOFILE) or lower --max-open-segment-files; the partition serves again "
            "once descriptors are free"
        )
    return "check the file and its permissions; the partition serves again once it opens"


def os_error_advice(exc: OSError, data_dir: Path) -> str:
    """What to do about a failed file operation under `data_dir`."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"free space on the file system of {data_dir}, then restart the broker"
    if exc.errno == errno.EROFS:
        return f"the file system of {data_dir} is read-only; remount it read-write and restart"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"give the broker's user write access to {data_dir} and restart"
    if exc.errno == errno.EIO:
        return (
            f"the disk under {data_dir} reports I/O errors; check the kernel log, replace the "
            "disk if needed (its replicas are re-replicated from the others) and restart"
        )
    return f"check the disk and file system of {data_dir}, then restart the broker"
