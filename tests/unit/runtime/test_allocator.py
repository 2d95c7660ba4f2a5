"""runtime/allocator.py: a process that keeps freed memory recycles its 1 MiB buffers
instead of page-faulting them in again (issue 20, produce cost per MB).

Each case runs in its own Python process (the allocator's settings are process-wide)
and counts the minor page faults of a loop shaped like a broker's: two 1 MiB buffers
alive at once (a frame being read while the last one is written), both freed, again.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from runtime.allocator import DEFAULT_ALLOCATOR_RETAIN_BYTES
from runtime.allocator import MIN_THRESHOLD
from runtime.allocator import keep_freed_memory

ROUNDS = 200
PAGES_PER_MIB = 256

# Runs `warm_up` then counts the minor page faults of `loop`, in a process of its own
# whose allocator keeps what argv[1] says.
_COUNT_FAULTS = """
import json, resource, sys
from runtime.allocator import keep_freed_memory
kept = keep_freed_memory(int(sys.argv[1]))
{warm_up}
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
{loop}
after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
print(json.dumps({{"kept": kept, "faults": after - before}}))
"""

# A broker's frames: two 1 MiB buffers alive at once (one read while the last is
# written), both freed, again.
_TWO_FRAMES = "a = bytearray(1 << 20); b = bytearray(1 << 20); del a, b"


def faults_of(retain_bytes: int, loop: str, warm_up: str = "") -> tuple[int, int]:
    """(bytes the allocator kept, minor page faults of `loop`)."""
    script = _COUNT_FAULTS.format(warm_up=warm_up, loop=loop)
    out = subprocess.run(
        [sys.executable, "-c", script, str(retain_bytes)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result = json.loads(out.stdout)
    return int(result["kept"]), int(result["faults"])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_kept_freed_memory_is_recycled_not_faulted_in_again() -> None:
    """Invariant: with the broker's default, a 1 MiB buffer freed and allocated again
    costs no page faults. Off (0, glibc's defaults): every round faults both buffers
    in again, 512 pages a round on this machine."""
    warm_up = f"for _ in range(20): {_TWO_FRAMES}"  # the heap reaches its working size
    loop = f"for _ in range({ROUNDS}): {_TWO_FRAMES}"
    kept, kept_faults = faults_of(DEFAULT_ALLOCATOR_RETAIN_BYTES, loop, warm_up)
    defaults, returned_faults = faults_of(0, loop, warm_up)
    assert kept == DEFAULT_ALLOCATOR_RETAIN_BYTES, "glibc took the thresholds"
    assert defaults == 0
    assert returned_faults >= ROUNDS * PAGES_PER_MIB, returned_faults  # the cost it removes
    assert kept_faults < ROUNDS * PAGES_PER_MIB // 20, (kept_faults, returned_faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_a_tiny_setting_is_never_worse_than_the_defaults() -> None:
    """A clumsy operator's --allocator-retain-bytes 1: set thresholds are fixed (glibc
    stops raising them with use), so it is taken as 32 MiB, and a 200 KB buffer
    allocated and freed again comes from the heap. Off (the thresholds set to 1 byte,
    or to glibc's starting 128 KiB): every such buffer is a mmap of its own and faults
    its 49 pages, ~98,000 faults here against ~0."""
    loop = "for _ in range(2000): b = bytearray(200_000); c = bytearray(4096); del b, c"
    kept, faults = faults_of(1, loop)
    assert kept == MIN_THRESHOLD, "the bytes kept are the ones the allocator uses"
    assert faults < 2000, faults


def test_a_negative_amount_is_refused() -> None:
    with pytest.raises(ValueError, match="retain_bytes must be >= 0"):
        keep_freed_memory(-1)
