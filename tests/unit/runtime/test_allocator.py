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
from runtime.allocator import keep_freed_memory

ROUNDS = 200
PAGES_PER_MIB = 256

_LOOP = """
import json, resource, sys
from runtime.allocator import keep_freed_memory
took = keep_freed_memory(int(sys.argv[1]))
for _ in range(20):  # warm-up: the heap reaches its working size
    a = bytearray(1 << 20); b = bytearray(1 << 20); del a, b
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(int(sys.argv[2])):
    a = bytearray(1 << 20); b = bytearray(1 << 20); del a, b
after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
print(json.dumps({"took": took, "faults": after - before}))
"""


def faults_of_the_loop(retain_bytes: int) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", _LOOP, str(retain_bytes), str(ROUNDS)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_kept_freed_memory_is_recycled_not_faulted_in_again() -> None:
    """Invariant: with the broker's default, a 1 MiB buffer freed and allocated again
    costs no page faults. Off (0, glibc's defaults): every round faults both buffers
    in again, 512 pages a round on this machine."""
    kept = faults_of_the_loop(DEFAULT_ALLOCATOR_RETAIN_BYTES)
    returned = faults_of_the_loop(0)
    assert kept["took"] is True, "glibc took the thresholds"
    assert returned["took"] is False
    assert isinstance(kept["faults"], int) and isinstance(returned["faults"], int)
    assert returned["faults"] >= ROUNDS * PAGES_PER_MIB, returned  # the cost it removes
    assert kept["faults"] < ROUNDS * PAGES_PER_MIB // 20, (kept, returned)


_MIXED = """
import json, resource, sys
from runtime.allocator import keep_freed_memory
took = keep_freed_memory(int(sys.argv[1]))
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(2000):
    b = bytearray(200_000); c = bytearray(4096); del b, c
after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
print(json.dumps({"took": took, "faults": after - before}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_a_tiny_setting_is_never_worse_than_the_defaults() -> None:
    """A clumsy operator's --allocator-retain-bytes 1: set thresholds are fixed (glibc
    stops raising them with use), so it is taken as 32 MiB, and a 200 KB buffer
    allocated and freed again comes from the heap. Off (the thresholds set to 1 byte,
    or to glibc's starting 128 KiB): every such buffer is a mmap of its own and faults
    its 49 pages, ~98,000 faults here against ~0."""
    out = subprocess.run(
        [sys.executable, "-c", _MIXED, "1"], capture_output=True, text=True, timeout=60, check=True
    )
    result = json.loads(out.stdout)
    assert result["took"] is True
    assert result["faults"] < 2000, result


def test_a_negative_amount_is_refused() -> None:
    with pytest.raises(ValueError, match="retain_bytes must be >= 0"):
        keep_freed_memory(-1)
