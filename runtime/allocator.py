"""How much freed memory the C allocator keeps for reuse in a process that moves large
buffers (a broker: 1 MiB produce requests and fetch answers, read into buffers of
their own, protocol/framing.py).

glibc's malloc hands a freed block of 128 KiB or more back to the kernel: blocks that
large are mmap'd and unmapped on free, and free memory at the top of the heap is
trimmed once it passes 128 KiB (the thresholds move up with use, but only as far as
the largest block freed). So the next 1 MiB frame is new memory again: 256 page
faults, each page zeroed by the kernel, before a byte of it is read. On this 2-core VM
that made a 1 MiB `b"".join` cost 0.65-0.79 ms instead of 0.08 (1.3-1.6 GB/s against
13; measured in `bench/README.md`, "the allocator keeps freed memory").

`keep_freed_memory(n)` sets both thresholds (mallopt(3)): blocks under 32 MiB come
from the heap, and up to max(n, 32 MiB) bytes of free heap top stay mapped,
so buffers of the size the broker moves are recycled instead of faulted in again. The
price is RSS: the process keeps up to `n` bytes it no longer uses (plus what sits
between live blocks, as any heap does), bounded like every other buffer of the broker.
Where the C library is not glibc (musl, another OS) nothing changes.
"""

from __future__ import annotations

import logging

from runtime.linux_libc import linux_libc_function

log = logging.getLogger(__name__)

# mallopt(3) parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# glibc refuses an mmap threshold above HEAP_MAX_SIZE / 2 (32 MiB on 64-bit).
MAX_MMAP_THRESHOLD = 32 * 1024 * 1024
# Set thresholds are fixed: glibc stops moving them up with use (which it does up to
# 32 MiB). A small one would then make every block above it a mmap of its own, worse
# than the defaults (a 200 KB buffer allocated and freed 20,000 times: 980,000 page
# faults with 128 KiB set, 88 with glibc's defaults), so none is set below this.
MIN_THRESHOLD = MAX_MMAP_THRESHOLD

# The broker's default (its --allocator-retain-bytes): a few dozen 1 MiB frames.
DEFAULT_ALLOCATOR_RETAIN_BYTES = 64 * 1024 * 1024

_MALLOPT = linux_libc_function("mallopt")


def keep_freed_memory(retain_bytes: int) -> int:
    """Keep up to `retain_bytes` of freed memory for reuse (0: leave the C library's
    defaults; under MIN_THRESHOLD counts as MIN_THRESHOLD). Returns the bytes the
    allocator now keeps, 0 when it kept its defaults."""
    if retain_bytes < 0:
        raise ValueError(f"retain_bytes must be >= 0, got {retain_bytes}")
    if retain_bytes == 0:
        return 0
    mallopt = _MALLOPT
    if mallopt is None:
        log.info("the C library has no mallopt(3): freed memory is returned as it decides")
        return 0
    # mallopt returns 1 on success, 0 on error (and sets no errno).
    kept = max(retain_bytes, MIN_THRESHOLD)
    took = mallopt(_M_MMAP_THRESHOLD, min(kept, MAX_MMAP_THRESHOLD)) == 1
    took = mallopt(_M_TRIM_THRESHOLD, kept) == 1 and took
    if not took:
        log.warning("mallopt(3) refused the thresholds for %d bytes", retain_bytes)
        return 0
    return kept
