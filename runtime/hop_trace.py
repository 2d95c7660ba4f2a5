"""Opt-in per-hop tracing of sampled records, for finding where latency goes.

Off unless MINIBROKER_TRACE_DIR names a directory: then every process that imports
this module (broker, controller, clients) appends lines to its own file there,
`<role>-<pid>.trace`, one line per event:

    hop <name> <topic> <partition> <offset> <CLOCK_MONOTONIC ns>
    gc <generation> <start ns> <duration ns>          (collections >= GC_LOG_MIN_NS)
    lag <start ns> <late ns>                           (event-loop wake-ups late by
                                                        >= LAG_LOG_MIN_NS)

A record is sampled when its offset is a multiple of MINIBROKER_TRACE_SAMPLE (default
100): every process decides alike without talking to the others, and offsets are
known on every hop. CLOCK_MONOTONIC is one clock for all processes of a machine, so
stamps from different processes subtract. Each event is one os.write (O_APPEND), so
a SIGKILLed process loses nothing already stamped. When tracing is off, `TRACER` is
None and the hooks cost one global lookup and a comparison.

`python -m bench latency --trace` reads the files and prints the breakdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from protocol.records.batch_headers import iter_headers

log = logging.getLogger(__name__)

TRACE_DIR_ENV = "MINIBROKER_TRACE_DIR"
TRACE_SAMPLE_ENV = "MINIBROKER_TRACE_SAMPLE"
DEFAULT_SAMPLE = 100
GC_LOG_MIN_NS = 20_000  # shorter collections are not logged (they are the many gen-0 ones)
LAG_TICK_S = 0.01  # the loop-lag probe's period (each tick is a wake-up of its own)
LAG_LOG_MIN_NS = 500_000  # a wake-up later than this is logged


class HopTracer:
    """Writes the trace lines of one process; see the module docstring."""

    def __init__(self, directory: Path, role: str, sample: int = DEFAULT_SAMPLE) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{role}-{os.getpid()}.trace"
        self.sample = max(1, sample)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._gc_started = 0
        self._lag_task: asyncio.Task[None] | None = None
        gc.callbacks.append(self._on_gc)

    def close(self) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._on_gc)
        if self._lag_task is not None:
            self._lag_task.cancel()
        with contextlib.suppress(OSError):
            os.close(self._fd)

    def _write(self, text: str) -> None:
        with contextlib.suppress(OSError):  # tracing must never break the traced
            os.write(self._fd, text.encode())

    def sampled(self, first: int, last: int) -> range:
        """The sampled offsets in [first, last]."""
        n = self.sample
        return range(-(-first // n) * n, last + 1, n)

    def stamp(
        self, hop: str, topic: str, partition: int, first: int, last: int, at: int = 0
    ) -> None:
        """Offsets first..last passed `hop` at `at` (CLOCK_MONOTONIC ns; 0: now)."""
        offsets = self.sampled(first, last)
        if offsets:
            now = at or time.monotonic_ns()
            self._write("".join(f"hop {hop} {topic} {partition} {o} {now}\n" for o in offsets))

    def stamp_each(
        self, hop: str, topic: str, partition: int, stamps: Iterable[tuple[int, int]]
    ) -> None:
        """(offset, CLOCK_MONOTONIC ns) pairs: those with a sampled offset passed `hop`
        at their time (a client's own stamps, e.g. the bench's send times)."""
        n = self.sample
        lines = [f"hop {hop} {topic} {partition} {o} {t}\n" for o, t in stamps if o % n == 0]
        if lines:
            self._write("".join(lines))

    def stamp_batches(self, hop: str, topic: str, partition: int, data: Any) -> None:
        """The records of the batches in `data` (a fetch answer) passed `hop` now."""
        if not data:
            return
        first = last = -1
        with contextlib.suppress(Exception):  # a truncated tail batch ends the walk
            for _, header in iter_headers(data):
                if first < 0:
                    first = header.base_offset
                last = header.next_offset - 1
        if first >= 0:
            self.stamp(hop, topic, partition, first, last)

    # ------------------------------------------------------------------ GC and loop lag

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        now = time.monotonic_ns()
        if phase == "start":
            self._gc_started = now
        elif self._gc_started:
            took = now - self._gc_started
            if took >= GC_LOG_MIN_NS:
                self._write(f"gc {info.get('generation', -1)} {self._gc_started} {took}\n")
            self._gc_started = 0

    def start_loop_lag_probe(self) -> None:
        """Log how late the running loop wakes a timer (blocking work, GC, a busy CPU)."""
        if self._lag_task is None:
            self._lag_task = asyncio.get_running_loop().create_task(self._probe_loop_lag())

    async def _probe_loop_lag(self) -> None:
        clock = time.monotonic_ns
        tick_ns = int(LAG_TICK_S * 1e9)
        while True:
            due = clock() + tick_ns
            await asyncio.sleep(LAG_TICK_S)
            late = clock() - due
            if late >= LAG_LOG_MIN_NS:
                self._write(f"lag {due} {late}\n")


def _from_environment(role: str) -> HopTracer | None:
    directory = os.environ.get(TRACE_DIR_ENV)
    if not directory:
        return None
    try:
        sample = int(os.environ.get(TRACE_SAMPLE_ENV) or DEFAULT_SAMPLE)
    except ValueError:
        sample = DEFAULT_SAMPLE
    try:
        return HopTracer(Path(directory), role, sample)
    except OSError as exc:  # tracing must never stop what it traces
        log.warning("%s=%s: cannot trace there: %s", TRACE_DIR_ENV, directory, exc)
        return None


TRACER: HopTracer | None = None


def enable_from_environment(role: str) -> HopTracer | None:
    """Turn tracing on for this process when MINIBROKER_TRACE_DIR is set (once;
    later calls return the same tracer). `role` names the file (broker-1, client)."""
    global TRACER
    if TRACER is None:
        TRACER = _from_environment(role)
    return TRACER
