"""What a long-running process does once it has started serving: move the start-up
heap out of the garbage collector's way, and trace when asked for
(runtime/hop_trace.py).

Why the GC: a full (generation 2) collection walks every tracked object, and a
server's start-up leaves tens of thousands of them (modules, functions, classes,
settings, the metadata image) that live until exit. gc.freeze() moves them to the
permanent generation, so the collections that run while serving walk only what was
made since; the per-request garbage stays the young generations' work. What the
process builds later that lives long (thousands of partitions) is frozen the same way
when a full collection over it turns slow (runtime/long_lived_heap.py).
"""

from __future__ import annotations

import gc
import logging

from runtime import hop_trace
from runtime.long_lived_heap import install_long_lived_heap_freezer

log = logging.getLogger(__name__)


def freeze_start_up_heap() -> int:
    """Collect once, then exempt every surviving object from later collections.
    Returns how many objects are frozen now."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def after_start(role: str) -> None:
    """Call from the running loop once start-up is done. `role` names the trace file."""
    frozen = freeze_start_up_heap()
    log.info("%s: %d start-up objects frozen out of garbage collection", role, frozen)
    install_long_lived_heap_freezer()
    tracer = hop_trace.enable_from_environment(role)
    if tracer is not None:
        tracer.start_loop_lag_probe()
