"""Durable file primitives shared by every on-disk structure of the broker and the
controller.

`write_all` never returns after a short write, `read_all` reads a whole file through
its descriptor, `fsync_directory` makes renames, creations and unlinks durable,
`sync_file_system` makes a whole file system durable in one call (syncfs), and
`atomic_write` replaces a small file so that a crash leaves either the old or the new
content, never a mix:

    1. write the data to `<name>.tmp` in the same directory (same filesystem)
    2. fsync the temp file           (the data is on disk before it has a name)
    3. os.replace(temp, name)        (atomic on POSIX)
    4. fsync the directory           (the rename itself is on disk)

A crash between 1 and 3 leaves a `.tmp` file that the loaders delete at startup.

`SerialWriter` runs such writes on one worker thread, in the order they were
submitted, so the event loop never waits for their fsyncs.

`off_loop` runs a whole blocking file sequence in a worker thread in ONE hop: the
cold paths (checkpoints, snapshots, replica deletion, the controller's metadata
log) go through it or through a `SerialWriter`, not through aiofiles, whose every
call (open, write, flush, fsync, close, replace) is a hop of its own:
`python -m bench.cold_file_io` measured a 19.6 KB checkpoint at 1.0-1.1 ms for the
caller and 62-87 us of event-loop CPU as one executor call, against 1.7-1.9 ms and
450-620 us through aiofiles (7 hops); a 12-file replica directory removal at
0.6 ms / 67-76 us (one `shutil.rmtree`) against 1.3-2.0 ms / 660-840 us (aiofiles.os
has no rmtree: scandir, 12 unlinks, rmdir). Both keep the loop's lag under ~1 ms at
p99; one hop also keeps each crash-safe sequence one unit in its thread, ordered
with the other writes of that thread (the controller's appends and snapshots).

`DataDirLock` holds ``<data dir>/.lock`` (an empty file) with ``flock(LOCK_EX)`` for
the life of a process, so two processes never share one data directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import fcntl
import os
import queue
import re
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from concurrent.futures import Future
from pathlib import Path
from typing import Any
from typing import TypeVar

from protocol.invariants import invariant
from runtime.linux_libc import linux_libc_function

T = TypeVar("T")

TMP_SUFFIX = ".tmp"
LOCK_FILE = ".lock"


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """os.write until every byte is written (a regular file may take a short write)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:  # never for regular files, but never loop forever either
            raise OSError(f"write returned {written} on fd {fd}")
        view = view[written:]


def read_all(fd: int) -> bytes:
    """The whole content of an open regular file, read with pread from position 0."""
    size = os.fstat(fd).st_size
    chunks = []
    position = 0
    while position < size:
        chunk = os.pread(fd, size - position, position)
        if not chunk:  # the file shrank underneath us
            break
        chunks.append(chunk)
        position += len(chunk)
    return b"".join(chunks)


def text_lines(raw: bytes, corrupt: Callable[[str], Exception]) -> list[str]:
    """The lines of a small UTF-8 text file that must end with a newline (a file
    without one was torn or truncated: its last line may be cut mid-number);
    `corrupt(problem)` builds the caller's error."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise corrupt(f"not UTF-8 text (byte {exc.start})") from exc
    if not text.endswith("\n"):
        raise corrupt("does not end with a newline (truncated?)")
    return text[:-1].split("\n")


def fsync_directory(path: Path) -> None:
    """fsync a directory so that entries created, renamed or removed in it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _find_syncfs() -> Callable[[int], int] | None:
    """libc's syncfs, where it reports write-back errors: Linux 5.8 and later (before
    that syncfs returned 0 whatever the disk said, so it could not replace fsync)."""
    if not sys.platform.startswith("linux"):
        return None
    version = re.match(r"(\d+)\.(\d+)", os.uname().release)
    if version is None or (int(version[1]), int(version[2])) < (5, 8):
        return None
    return linux_libc_function("syncfs")


_SYNCFS = _find_syncfs()


def can_sync_file_system() -> bool:
    return _SYNCFS is not None


def sync_file_system(path: Path) -> None:
    """syncfs(2) of the file system holding `path`: the data and metadata of every
    file and directory on it durable, as one fsync of each would make them; thousands
    of fsyncs cost ~0.1 ms each, one syncfs of as much dirty data ~3% of that
    (bench/README.md). OSError if the disk failed; only where `can_sync_file_system()`."""
    syncfs = _SYNCFS
    assert syncfs is not None, "syncfs(2) is not usable here: fsync file by file"
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs of the file system holding {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Replace `path` with `data` crash-safely (temp file, fsync, rename, fsync dir)."""
    path = Path(path)
    tmp = path.with_name(path.name + TMP_SUFFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_directory(path.parent)


async def off_loop(executor: Executor | None, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)` in a thread of `executor` (None: the loop's default), as one hop:
    the event loop neither blocks on its fsyncs nor pays a wake-up per step."""
    return await asyncio.get_running_loop().run_in_executor(executor, fn, *args)


class DataDirLock:
    """Exclusive use of a data directory for the life of the process: ``flock`` on
    ``<data_dir>/.lock``. `in_use(lock_path)` builds the error raised when another
    process holds it (each process names itself and its flag); any other OSError
    (creating the file, a filesystem without locks) passes through unchanged."""

    def __init__(self, data_dir: Path, in_use: Callable[[Path], Exception]) -> None:
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / LOCK_FILE
        self._in_use = in_use
        self._fd = -1

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise self._in_use(self.path) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def release(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1


class SerialWriter:
    """One worker thread running file writes off the event loop, one at a time, in
    submission order (a later write of a directory never overtakes an earlier one).
    Bounded: beyond `max_pending` queued writes `submit` blocks until one finishes,
    so a disk that cannot keep up slows the loop down instead of growing a queue."""

    def __init__(self, name: str = "storage-writer", *, max_pending: int = 64) -> None:
        invariant(max_pending > 0, "max_pending must be positive")
        self._queue: queue.Queue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None]
        self._queue = queue.Queue(maxsize=max_pending)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._closed = False
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        if self._closed:
            raise RuntimeError("SerialWriter is closed")
        future: Future[Any] = Future()
        self._queue.put((future, fn, args))
        return future

    def drain(self) -> None:
        """Block until everything submitted so far has run."""
        self.submit(lambda: None).result()

    def close(self) -> None:
        """Run what is queued, then stop the thread."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._thread.join()

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            future, fn, args = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as exc:  # handed to whoever waits on the future
                    future.set_exception(exc)


def describe_os_error(exc: OSError) -> str:
    """`<file>: <strerror> (<ERRNO NAME>)`, the parts of an OSError an operator needs."""
    name = errno.errorcode.get(exc.errno or 0, "") if exc.errno else ""
    text = exc.strerror or str(exc) or type(exc).__name__
    where = f"{exc.filename}: " if exc.filename else ""
    return f"{where}{text}" + (f" ({name})" if name else "")
