"""Keep full garbage collections short while a server's long-lived heap grows.

A full (generation 2) collection walks every tracked object. The start-up heap is
frozen out of it (runtime/process_start.py), but a broker that then takes 10,000
partitions builds a few million long-lived objects (logs, segments, indexes, partition
state), and each full collection after that walked all of them: 335-569 ms pauses,
8-15 of them while the partitions were created (issue 20, measured with
MINIBROKER_TRACE_DIR), every request on the loop waiting behind each one.

So, as the start-up freeze does once: when a full collection was slow, what survived it
is live and long-lived, and is frozen right then (its 'stop' callback), so the next
full collections walk only what was made since. The price of freezing is that a frozen
object which later becomes cyclic garbage (a deleted partition's objects, if they hold
a cycle) is not reclaimed while frozen; so at most every `refreeze_after_s` the next
full collection first unfreezes everything (its 'start' callback): that one collection
walks the whole heap, reclaims such garbage, is slow, and freezes the survivors again.
One slow pause per interval instead of one per collection.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

# A full collection at least this long freezes its survivors: at ~1 ms per 10k
# objects, a heap past ~100k long-lived objects (a few hundred partitions).
SLOW_FULL_COLLECTION_S = 0.010
# At most this often a full collection walks everything again (to reclaim garbage
# among frozen objects).
REFREEZE_AFTER_S = 600.0


class LongLivedHeapFreezer:
    """gc.callbacks hook: freeze the survivors of a slow full collection; unfreeze
    before a full collection at most every `refreeze_after_s` of `clock` (injectable;
    a collection's own length is always timed with perf_counter)."""

    def __init__(
        self,
        *,
        slow_s: float = SLOW_FULL_COLLECTION_S,
        refreeze_after_s: float = REFREEZE_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        assert slow_s > 0 and refreeze_after_s > 0, "both bounds must be positive"
        self.slow_s = slow_s
        self.refreeze_after_s = refreeze_after_s
        self.clock = clock
        self.freezes = 0  # how many slow full collections froze their survivors
        self.unfreezes = 0
        self._started = 0.0
        self._last_freeze = clock()

    def install(self) -> None:
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def uninstall(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        # Runs inside the collector: no allocation-heavy work, no logging.
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
            # (Not gc.get_freeze_count(): it walks the whole frozen generation, millions
            # of objects at 10,000 partitions, and this runs in every full collection.)
            if self.clock() - self._last_freeze >= self.refreeze_after_s:
                gc.unfreeze()  # this collection walks (and reclaims among) everything
                self.unfreezes += 1
                self._last_freeze = self.clock()  # at most one unfreeze per interval
            return
        if time.perf_counter() - self._started >= self.slow_s:
            gc.freeze()  # what survived a full collection is live: keep it out of the next
            self.freezes += 1
            self._last_freeze = self.clock()


_FREEZER: LongLivedHeapFreezer | None = None


def install_long_lived_heap_freezer() -> LongLivedHeapFreezer:
    """Install this process's freezer (once)."""
    global _FREEZER
    if _FREEZER is None:
        _FREEZER = LongLivedHeapFreezer()
        _FREEZER.install()
    return _FREEZER
