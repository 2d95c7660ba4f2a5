"""Cold-path file work off the event loop: one executor call or aiofiles?
`python -m bench.cold_file_io [--iterations N] [--dir PATH]`

Issue 14 item 6. The broker's checkpoints (high watermarks, recovery points, log
starts, leader epochs), its producer snapshots and replica deletions, and the
controller's metadata snapshots run in a worker thread. Two ways to get there:

- "executor": the whole crash-safe sequence is one function (runtime/fileio.py
  `atomic_write`: write temp + fsync + rename + fsync the directory) run by ONE
  `loop.run_in_executor` call: one thread hop;
- "aiofiles": the same steps through aiofiles (`aiofiles.open`, `write`, `flush`,
  fsync via `aiofiles.os.wrap`, close, `aiofiles.os.replace`, the directory fsync):
  each step is its own thread hop and its own trip back through the event loop;
- "on the loop": the sequence run inline, for reference (what the loop would stall).

For each: the wall time of one operation as its caller waits for it, and the event
loop's lag meanwhile (a ticker sleeps 1 ms over and over; lag = how late it wakes),
against an idle loop. Replica deletion compares one `shutil.rmtree` in the executor
with aiofiles.os (scandir, one unlink per file, rmdir). The last row is the hot
path's page-cache append (16 KiB `os.write` on the loop, no fsync), which stays as
it is whatever is chosen here: it is there to show what one loop-side write costs.

Bounded: `--iterations` operations per row (default 500), about 5 s on this
machine. Files go to `--dir` (default: a temp dir under the current directory, so
the fsyncs hit the same disk as a data dir; /tmp may be a tmpfs).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiofiles
import aiofiles.os
import uvloop

from bench.harness import format_table
from runtime.fileio import TMP_SUFFIX
from runtime.fileio import atomic_write
from runtime.fileio import fsync_directory
from runtime.fileio import write_all

TICK_S = 0.001
# A replication-offset-checkpoint of 1,000 partitions (the largest cold file the
# broker rewrites every few seconds).
CHECKPOINT = "0\n1000\n" + "".join(f"topic-{i % 50} {i} {i * 1000}\n" for i in range(1000))
# A replica directory: 3 segments (.log .index .timeindex) plus its other files.
REPLICA_FILES = [
    *(f"{base:020d}{ext}" for base in (0, 1000, 2000) for ext in (".log", ".index", ".timeindex")),
    "00000000000000002000.snapshot",
    "leader-epoch-checkpoint",
    "partition.metadata",
]


async def _aiofiles_atomic_write(path: Path, data: bytes) -> None:
    """atomic_write's four steps through aiofiles: every call below is a thread hop."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    async with aiofiles.open(tmp, "wb") as f:
        await f.write(data)
        await f.flush()
        await aiofiles.os.wrap(os.fsync)(f.fileno())
    await aiofiles.os.replace(tmp, path)
    await aiofiles.os.wrap(fsync_directory)(path.parent)


async def _aiofiles_rmtree(path: Path) -> None:
    for entry in await aiofiles.os.scandir(path):
        await aiofiles.os.unlink(entry.path)
    await aiofiles.os.rmdir(path)


def _make_replica_dir(parent: Path, n: int) -> Path:
    path = parent / f"orders-{n}.deadbeef-delete"
    path.mkdir()
    for name in REPLICA_FILES:
        (path / name).write_bytes(b"x" * 4096)
    return path


class LagProbe:
    """A ticker on the loop: how late each 1 ms sleep wakes up, in ms."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            start = time.perf_counter()
            await asyncio.sleep(TICK_S)
            self.lags.append((time.perf_counter() - start - TICK_S) * 1000)

    def __enter__(self) -> LagProbe:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()


def _p(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _measure(
    iterations: int, op: Callable[[int], Awaitable[None]]
) -> tuple[list[float], list[float]]:
    """(ms per operation, ms of loop lag per tick) over `iterations` operations."""
    times: list[float] = []
    with LagProbe() as probe:
        await asyncio.sleep(0.01)  # the ticker is running
        for i in range(iterations):
            start = time.perf_counter()
            await op(i)
            times.append((time.perf_counter() - start) * 1000)
            await asyncio.sleep(0)  # let the ticker in between operations too
    return times, probe.lags


async def _loop_cpu_us(iterations: int, op: Callable[[int], Awaitable[None]]) -> float:
    """CPU time of the event-loop thread per operation, in us (no ticker running): what
    the hops cost the loop (futures, wake-ups), apart from the waiting."""
    start = time.thread_time()
    for i in range(iterations):
        await op(i)
    return (time.thread_time() - start) / iterations * 1e6


async def run(iterations: int, directory: Path) -> list[list[object]]:
    loop = asyncio.get_running_loop()
    pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="bench-io")
    data = CHECKPOINT.encode()
    target = directory / "replication-offset-checkpoint"
    segment_fd = os.open(directory / "segment.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    chunk = b"x" * 16384

    async def idle(i: int) -> None:
        await asyncio.sleep(0.002)

    async def executor_write(i: int) -> None:
        await loop.run_in_executor(pool, atomic_write, target, data)

    async def aiofiles_write(i: int) -> None:
        await _aiofiles_atomic_write(target, data)

    async def inline_write(i: int) -> None:
        atomic_write(target, data)

    # Made before each row is timed: only the deletion is measured.
    replicas: list[Path] = []

    async def executor_rmtree(i: int) -> None:
        await loop.run_in_executor(pool, shutil.rmtree, replicas[i])

    async def aiofiles_rmtree(i: int) -> None:
        await _aiofiles_rmtree(replicas[i])

    async def page_cache_append(i: int) -> None:
        write_all(segment_fd, chunk)

    cases: list[tuple[str, str, int | str, Callable[[int], Awaitable[None]]]] = [
        ("idle loop (2 ms sleeps)", "-", 0, idle),
        (f"checkpoint write, {len(data):,} B", "executor", 1, executor_write),
        (f"checkpoint write, {len(data):,} B", "aiofiles", 7, aiofiles_write),
        (f"checkpoint write, {len(data):,} B", "on the loop", 0, inline_write),
        (
            f"replica dir delete, {len(REPLICA_FILES)} files",
            "executor",
            1,
            executor_rmtree,
        ),
        (
            f"replica dir delete, {len(REPLICA_FILES)} files",
            "aiofiles.os",
            len(REPLICA_FILES) + 2,
            aiofiles_rmtree,
        ),
        ("hot path: 16 KiB append, page cache", "on the loop (kept)", 0, page_cache_append),
    ]
    rows: list[list[object]] = []
    try:
        for what, how, hops, op in cases:
            deleting = op in (executor_rmtree, aiofiles_rmtree)
            if deleting:
                replicas[:] = [_make_replica_dir(directory, i) for i in range(iterations)]
            times, lags = await _measure(iterations, op)
            if deleting:
                replicas[:] = [_make_replica_dir(directory, i) for i in range(iterations)]
            cpu = await _loop_cpu_us(iterations, op)
            rows.append(
                [
                    what,
                    how,
                    hops,
                    statistics.fmean(times),
                    _p(times, 0.5),
                    _p(times, 0.99),
                    cpu,
                    _p(lags, 0.99),
                    max(lags, default=0.0),
                ]
            )
    finally:
        os.close(segment_fd)
        pool.shutdown(wait=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cold_file_io", description=__doc__)
    parser.add_argument("--iterations", type=int, default=500, help="operations per row")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (a real disk)")
    args = parser.parse_args(argv)
    if not 1 <= args.iterations <= 100_000:
        parser.error("--iterations must be in 1..100000")
    with (
        tempfile.TemporaryDirectory(prefix="cold-file-io-", dir=args.dir or Path.cwd()) as tmp,
        asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner,
    ):
        rows = runner.run(run(args.iterations, Path(tmp)))
    columns = [
        "operation",
        "how",
        "thread hops",
        "mean ms",
        "p50 ms",
        "p99 ms",
        "loop CPU us/op",
        "loop lag p99 ms",
        "loop lag max ms",
    ]
    print(format_table(columns, rows))
    print(
        f"{args.iterations} operations per row, uvloop; loop lag: lateness of a 1 ms "
        "ticker while the operations run (idle row: none running)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
