"""The per-record cost of the consumer's poll path in process, the GC's share of it, and
the floor of any per-record object API in plain CPython on this machine.

    python -m bench.record_floor [--records 300000] [--rounds 3]

`poll path`: copies of a 16 KiB batch of 100 B records (as a fetch returns them) are
decoded into the fetch buffer, drained 500 at a time as poll() does, and each
record's value is read; CPU time per record with the GC on and off, and the time spent
inside GC passes (gc.callbacks). `floor`: nothing of the decoder, only what a
per-record object API must do at least from pre-split bytes: one 100 B value slice
and one exact 8-field tuple appended per record, then the ConsumerRecord made from
it (500 at a time, C-level map) and one attribute read. For load-independent figures
run it under `valgrind --tool=callgrind` with --records 0 and N and subtract.

`--shapes`: the decode alone (`decode_batch_into`, one batch of 9,000 records) for
records of several layouts, one by one (`runs=False`) and with runs of alike records
cut out in bulk (protocol/records/alike_runs.py).
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from itertools import repeat
from typing import Any

from bench.micro import fetched_record_set
from client.consumer.async_consumer import AsyncConsumer
from client.consumer.partition_state import _PartitionState
from client.types import ConsumerRecord
from client.types import TopicPartition
from protocol.record_batch import BatchBuilder
from protocol.record_batch import decode_batch_into
from protocol.record_batch import parse_header

FETCH_RECORDS = 20_000  # about one 2 MiB fetch of 100 B records
DRAIN = 500  # poll()'s default max_poll_records


class _GcClock:
    """Seconds spent inside GC passes, from gc.callbacks."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0

    def __call__(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started


def poll_path(records: int) -> tuple[float, int]:
    """CPU seconds to decode, drain and touch ~`records` records (in fetches of ~20k),
    and how many."""
    data, per_fetch = fetched_record_set(FETCH_RECORDS)
    consumer = AsyncConsumer("127.0.0.1:1")  # never started: no connection
    tp = TopicPartition("floor", 0)
    state = _PartitionState()
    consumer._states[tp] = state
    fetches = max(1, records // per_fetch)
    started = time.process_time()
    for _ in range(fetches):
        state.set_position(0, 0)
        consumer._buffer.clear()
        consumer._buffer_records(tp, state, 0, data)
        while consumer._buffer:
            for chunk in consumer._drain(DRAIN).values():
                for record in chunk:
                    record.value  # noqa: B018 - what a caller does at least
    return time.process_time() - started, fetches * per_fetch


def floor(records: int) -> tuple[float, int]:
    """CPU seconds of the per-record object floor for `records` records, and how many."""
    data = bytes(100 * records)
    new = tuple.__new__
    started = time.process_time()
    fields: list[tuple[Any, ...]] = []
    append = fields.append
    for offset in range(0, 100 * records, 100):
        append(("t", 0, offset, 0, 1_700_000_000_000, None, data[offset : offset + 100], ()))
    for i in range(0, records, DRAIN):
        for record in map(new, repeat(ConsumerRecord, DRAIN), fields[i : i + DRAIN]):
            record.value  # noqa: B018
    return time.process_time() - started, records


# name -> (value size, key) of record i; timestamps tick 1 ms per 50 records but for
# "one timestamp"
SHAPES: dict[str, Callable[[int], tuple[int, bytes | None]]] = {
    "100 B, one timestamp": lambda i: (100, None),
    "100 B, timestamp ticking": lambda i: (100, None),
    "100 B, 8-byte keys, ticking": lambda i: (100, b"key-%04d" % (i % 1000)),
    "90-109 B, each size unlike the next": lambda i: (90 + i % 20, None),
    "90-109 B, runs of 10 alike": lambda i: (90 + (i // 10) % 20, None),
}


def shapes(rounds: int) -> None:
    """ns per record of decode_batch_into, one by one and with bulk runs, per shape."""
    value = bytes(range(200))
    for name, shape in SHAPES.items():
        builder = BatchBuilder(base_timestamp=1_700_000_000_000)
        for i in range(9_000):
            size, key = shape(i)
            tick = 0 if name.endswith("one timestamp") else i // 50
            builder.append(value[:size], key, (), 1_700_000_000_000 + tick)
        data = builder.build(0)
        header = parse_header(data)
        cells = []
        for runs in (False, True):
            best = float("inf")
            for _ in range(max(1, rounds)):
                out: list[Any] = []
                started = time.process_time()
                for _ in range(10):
                    out.clear()
                    decode_batch_into(out, data, 0, header, "t", 0, runs=runs)
                best = min(best, (time.process_time() - started) / 10 / len(out))
            cells.append(f"{best * 1e9:,.0f}")
        print(f"{name}: one by one {cells[0]} ns/record, bulk runs {cells[1]} ns/record")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.record_floor", description=__doc__)
    p.add_argument("--records", type=int, default=300_000, help="records per measure")
    p.add_argument("--rounds", type=int, default=3, help="rounds, best kept [3]")
    p.add_argument("--shapes", action="store_true", help="decode only, per record layout")
    args = p.parse_args(argv)
    if args.shapes:
        shapes(args.rounds)
        return 0
    if args.records <= 0:  # for callgrind's baseline run: imports only
        return 0
    clock = _GcClock()
    gc.callbacks.append(clock)
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        for case, measure in (("poll path", poll_path), ("floor", floor)):
            for gc_on in (True, False):
                gc.enable() if gc_on else gc.disable()
                clock.seconds = 0.0
                seconds, done = measure(args.records)
                gc.enable()
                name = f"{case}, GC {'on' if gc_on else 'off'}"
                best[name] = min(best.get(name, float("inf")), seconds / done)
                if gc_on:
                    inside = f"{case}, inside GC passes"
                    best[inside] = min(best.get(inside, float("inf")), clock.seconds / done)
    for name, per_record in best.items():
        rate = f", {1 / per_record:,.0f} records/s" if "inside" not in name else ""
        print(f"{name}: {per_record * 1e9:,.0f} ns/record{rate}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
