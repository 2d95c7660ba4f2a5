"""A bounded cache of open file descriptors for segment files (`.log`, `.index`,
`.timeindex`), as Redpanda's file-handle cache and Kafka's lazy indexes: the number of
open files stays at most the cache's capacity however many partitions the broker
holds.

A `CachedFile` names one file and the flags to reopen it with. It opens lazily, on
its first use, and the cache closes the least recently used descriptors beyond its
capacity. Nothing about the file changes when its descriptor is closed and reopened:
appends use O_APPEND and reads use pread, so neither depends on a file position.

A descriptor is pinned (reference counted) for the length of each operation on it
(`acquire` ... `release`), and a pinned descriptor is never closed by eviction: an
fsync on a worker thread and an append on the event loop may use the same file at
once. When every open descriptor is pinned the cache goes over its capacity for as
long as the pins last (a handful: the event loop plus the flush threads) rather than
fail.

Opening can fail (EMFILE or ENFILE when the process or the system has no descriptor
left, or any other OSError): `acquire` raises FileOpenError, a StorageError of the
one partition whose file it is. It is not a disk failure, so the data directory stays
online and the other partitions keep serving. Thread-safe.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import resource
import threading
from collections import OrderedDict
from pathlib import Path

from broker.storage.errors import FileOpenError

logger = logging.getLogger(__name__)

# 10,000 partitions x RF 3 over 3 brokers are 10,000 replicas (30,000 files) per
# broker: this many descriptors leave more than half of a 20,000 limit to sockets.
DEFAULT_MAX_OPEN_SEGMENT_FILES = 8192
# Below this the three files of one segment could not be open together.
MIN_OPEN_SEGMENT_FILES = 3


class FileHandleCache:
    """At most `capacity` open descriptors (more only while all of them are pinned)."""

    def __init__(self, capacity: int = DEFAULT_MAX_OPEN_SEGMENT_FILES) -> None:
        if capacity < MIN_OPEN_SEGMENT_FILES:
            raise ValueError(
                f"the open segment file cache needs room for at least "
                f"{MIN_OPEN_SEGMENT_FILES} files (one segment), got {capacity}"
            )
        self.capacity = capacity
        self._lock = threading.Lock()
        # Open files, least recently used first.
        self._open: OrderedDict[CachedFile, None] = OrderedDict()
        self.opens = 0  # descriptors opened so far (reopens included), for tests and stats

    @property
    def open_count(self) -> int:
        return len(self._open)

    def lazy(self, path: Path, flags: int) -> CachedFile:
        """An existing file, opened with `flags` on its first use."""
        return CachedFile(self, path, flags)

    def adopt(self, path: Path, fd: int, reopen_flags: int) -> CachedFile:
        """A descriptor the caller opened (e.g. with O_CREAT | O_EXCL), from now on in
        the cache; reopened with `reopen_flags` after an eviction."""
        handle = CachedFile(self, path, reopen_flags)
        with self._lock:
            handle._fd = fd
            self._open[handle] = None
            self._evict_beyond_capacity()
        return handle

    def _acquire(self, handle: CachedFile) -> int:
        with self._lock:
            if handle._closed:
                raise FileOpenError(handle.path, OSError(errno.EBADF, "file already closed"))
            if handle._fd < 0:
                try:
                    handle._fd = os.open(handle.path, handle._flags, 0o644)
                except OSError as exc:
                    raise OPEN_FAILURES.failed(FileOpenError(handle.path, exc)) from exc
                OPEN_FAILURES.succeeded(handle.path)
                self.opens += 1
                self._open[handle] = None
                handle._pins += 1  # before evicting: never the file just opened
                self._evict_beyond_capacity()
                return handle._fd
            self._open.move_to_end(handle)
            handle._pins += 1
            return handle._fd

    def _release(self, handle: CachedFile) -> None:
        with self._lock:
            handle._pins -= 1
            if handle._pins:
                return
            if handle._closed:
                self._close_locked(handle)
            elif len(self._open) > self.capacity:
                self._evict_beyond_capacity()

    def _close(self, handle: CachedFile) -> None:
        with self._lock:
            handle._closed = True
            if not handle._pins:
                self._close_locked(handle)

    def _evict(self, handle: CachedFile) -> None:
        with self._lock:
            if not handle._pins:
                self._close_locked(handle)

    def _evict_beyond_capacity(self) -> None:
        excess = len(self._open) - self.capacity
        if excess <= 0:
            return
        # From the least recently used end, stopping once enough are found (the
        # pinned ones are few): O(excess), not O(open files).
        unpinned = (handle for handle in self._open if not handle._pins)
        for victim in list(itertools.islice(unpinned, excess)):
            self._close_locked(victim)

    def _close_locked(self, handle: CachedFile) -> None:
        fd, handle._fd = handle._fd, -1
        if fd >= 0:
            del self._open[handle]
            os.close(fd)


class CachedFile:
    """One file whose descriptor the cache may close and reopen between uses.

    Use as `with f as fd:` (or `fd = f.acquire()` ... `f.release()`) around each
    operation; never keep the descriptor past the block."""

    __slots__ = ("_cache", "_closed", "_fd", "_flags", "_pins", "path")

    def __init__(self, cache: FileHandleCache, path: Path, flags: int) -> None:
        self._cache = cache
        self.path = path
        self._flags = flags
        self._fd = -1
        self._pins = 0
        self._closed = False

    @property
    def is_open(self) -> bool:
        """Whether a descriptor is open now (not whether the file may be used)."""
        return self._fd >= 0

    def acquire(self) -> int:
        """The descriptor, opened if needed and pinned until `release`; FileOpenError
        when it cannot be opened."""
        cache = self._cache
        with cache._lock:  # the hot path, inline: an open file used again
            fd = self._fd
            if fd >= 0:
                self._pins += 1
                cache._open.move_to_end(self)
                return fd
        return cache._acquire(self)  # opens (checks again under the lock)

    def release(self) -> None:
        cache = self._cache
        with cache._lock:  # the hot path, inline: nothing to close
            if self._pins > 1 or not (self._closed or len(cache._open) > cache.capacity):
                self._pins -= 1
                return
        cache._release(self)

    # `with handle as fd:` pins the descriptor for the block (acquire ... release).
    __enter__ = acquire

    def __exit__(self, *exc: object) -> None:
        self.release()

    def evict(self) -> None:
        """Close the descriptor now unless in use; the next `acquire` reopens it."""
        self._cache._evict(self)

    def close(self) -> None:
        """Close for good (once the operations in progress release it)."""
        self._cache._close(self)

    def __repr__(self) -> str:
        return f"CachedFile({self.path}, fd={self._fd}, pins={self._pins})"


class OpenFailureLog:
    """Logs a run of failed opens once: the first at ERROR (what and what to do),
    the rest at DEBUG until an open succeeds again. Request handlers therefore do not
    log FileOpenError themselves. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failing = False

    def failed(self, error: FileOpenError) -> FileOpenError:
        with self._lock:
            first, self._failing = not self._failing, True
        logger.log(logging.ERROR if first else logging.DEBUG, "%s", error)
        return error

    def succeeded(self, path: Path) -> None:
        if self._failing:
            with self._lock:
                self._failing = False
            logger.warning("files open again (%s): partitions serve again", path)


OPEN_FAILURES = OpenFailureLog()


def warn_if_open_files_exceed_limit(capacity: int) -> None:
    """Log a WARNING when `capacity` segment files would leave fewer than a quarter
    of the process's open-file limit to sockets and checkpoints."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and capacity > soft * 3 // 4:
        logger.warning(
            "--max-open-segment-files=%d leaves little of the open-file limit %d (ulimit -n) "
            "to connections and checkpoints: partitions will fail with storage errors when "
            "descriptors run out; raise the limit or lower the setting",
            capacity,
            soft,
        )


# Segments built without a cache of their own (tools, tests) share this one; a broker's
# LogManager has its own, sized by --max-open-segment-files.
SHARED_FILE_HANDLES = FileHandleCache()
