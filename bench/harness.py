"""What every bench shares: a local cluster of real processes, raw produce and fetch
helpers, a progress bar, a table, and the JSON results file with the machine in it.

The cluster is tests/integration/cluster.py's `Cluster` (controller and brokers started
the way a user starts them, on 127.0.0.1, port 0, readiness read from their logs),
under a fresh temp dir. `BenchCluster` adds topic creation and a teardown that
SIGKILLs every process and removes the data: a bench's data is throwaway and a
controlled shutdown would only slow the run down. Teardown runs on normal exit, on an
exception, on Ctrl-C (KeyboardInterrupt) and on SIGTERM (which kills the cluster and
then interrupts the bench like Ctrl-C).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Coroutine
from collections.abc import Iterator
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from typing import TypeVar

import uvloop

from client.admin import AsyncAdmin
from client.cluster import ClusterClient
from client.types import TopicPartition
from protocol.errors import ErrorCode
from protocol.messages import FetchPartition
from protocol.messages import FetchRequest
from protocol.messages import FetchResponse
from protocol.messages import FetchTopic
from protocol.messages import ProducePartition
from protocol.messages import ProduceRequest
from protocol.messages import ProduceResponse
from protocol.messages import ProduceTopic
from protocol.record_batch import HEADER_SIZE
from protocol.record_batch import BatchBuilder
from protocol.record_batch import Compression
from protocol.record_batch import iter_headers
from tests.integration.cluster import Cluster

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "bench" / "results"
MiB = 1024 * 1024
KiB = 1024
TOPIC_READY_TIMEOUT_S = 30.0
RAW_IN_FLIGHT = 4  # raw produce requests in flight per connection while filling a log

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run on uvloop, as the servers and the CLI do."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


# ------------------------------------------------------------------ the cluster


class BenchCluster:
    """One controller and `brokers` brokers under a temp dir; use as a context manager.

    `broker_args` are extra flags for every broker (e.g. `--max-message-bytes`)."""

    def __init__(
        self,
        brokers: int = 3,
        *,
        broker_args: Sequence[str] = (),
        session_timeout_ms: int = 4000,
        keep_data: bool = False,
        kafka: bool = False,
        controllers: int = 1,
    ) -> None:
        """`kafka`: every broker has a Kafka listener too (`kafka_bootstrap`);
        `controllers` > 1: a controller quorum of that many (`cluster.quorum`)."""
        assert brokers >= 1, "a cluster needs a broker"
        self.kafka = kafka
        self.broker_count = brokers
        self.broker_args = list(broker_args)
        self.session_timeout_ms = session_timeout_ms
        self.controllers = controllers
        self.keep_data = keep_data
        self.root = Path(tempfile.mkdtemp(prefix="minibroker-bench-"))
        self.cluster = Cluster(self.root)
        self._old_sigterm: Any = None
        self._closing = False  # set once teardown began: no broker may start after it

    def __enter__(self) -> BenchCluster:
        self._old_sigterm = signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            if self.controllers > 1:
                self.cluster.start_quorum(
                    self.controllers, session_timeout_ms=self.session_timeout_ms
                )
            else:
                self.cluster.start_controller(session_timeout_ms=self.session_timeout_ms)
            self.cluster.start_brokers(
                range(1, self.broker_count + 1), *self.broker_args, kafka=self.kafka
            )
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _on_sigterm(self, signum: int, frame: object) -> None:
        # Kill the cluster at once (an exception raised from here inside a running
        # event loop may not unwind), then stop the way Ctrl-C does: asyncio.Runner
        # turns SIGINT into a cancelled main task and a KeyboardInterrupt.
        self._kill_all()
        signal.raise_signal(signal.SIGINT)

    def _kill_all(self) -> None:
        self._closing = True
        procs = [*self.cluster.brokers.values(), *self.cluster.quorum.values()]
        if self.cluster.controller is not None:
            procs.append(self.cluster.controller)
        for proc in procs:
            with contextlib.suppress(Exception):
                proc.kill()

    def close(self) -> None:
        """SIGKILL everything we started, then remove the data (unless keep_data)."""
        self._kill_all()
        if self._old_sigterm is not None:
            signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None
        if self.keep_data:
            print(f"bench data kept in {self.root}", file=sys.stderr)
        else:
            shutil.rmtree(self.root, ignore_errors=True)

    def broker_cpu_seconds(self) -> float:
        """User + system CPU seconds used so far by the running brokers together."""
        return sum(process_cpu_seconds(b.pid) for b in self.cluster.brokers.values() if b.alive)

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{b.host}:{b.port}" for b in self.cluster.brokers.values() if b.port)

    @property
    def kafka_bootstrap(self) -> str:
        """The brokers' Kafka listeners (a cluster started with `kafka`)."""
        return self.cluster.kafka_bootstrap()

    def restart_broker(self, node_id: int, *, wait: bool = True) -> Any:
        """Start broker `node_id` again on its port and data dir (after kill/terminate)."""
        if self._closing:
            raise RuntimeError("the bench cluster is being torn down")
        return self.cluster.start_broker(node_id, *self.broker_args, wait=wait)

    async def create_topic(
        self,
        name: str,
        *,
        partitions: int,
        replication_factor: int,
        configs: dict[str, str] | None = None,
    ) -> None:
        """Create a topic and wait until every partition has a leader and a full ISR."""
        async with AsyncAdmin(self.bootstrap) as admin:
            await admin.create_topic(name, partitions, replication_factor, configs or {})
            await wait_full_isr(admin, name, replication_factor)

    async def delete_topic(self, name: str) -> None:
        async with AsyncAdmin(self.bootstrap) as admin:
            await admin.delete_topics([name])


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of a process from /proc (0 if it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def pin(broker_pid: int) -> str:
    """The broker on the last CPU, this process on the others: no stolen time."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return "not pinned (one CPU)"
    os.sched_setaffinity(broker_pid, {cpus[-1]})
    os.sched_setaffinity(0, set(cpus[:-1]))
    return f"broker on CPU {cpus[-1]}, bench on {cpus[:-1]}"


async def wait_full_isr(
    admin: AsyncAdmin, topic: str, replication_factor: int, timeout_s: float = TOPIC_READY_TIMEOUT_S
) -> None:
    """Until every partition of `topic` has a leader and `replication_factor` in its ISR."""
    deadline = time.monotonic() + timeout_s
    last = "no description yet"
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            (desc,) = await admin.describe_topics([topic], include_offsets=False)
            if desc.partitions and all(
                p.leader >= 0 and len(p.isr) >= replication_factor for p in desc.partitions
            ):
                return
            last = ", ".join(
                f"p{p.partition} leader {p.leader} isr {p.isr}" for p in desc.partitions
            )
        await asyncio.sleep(0.1)
    raise TimeoutError(f"topic {topic}: no full ISR within {timeout_s:.0f} s ({last})")


# ------------------------------------------------------------------ raw produce and fetch


def build_batch(
    record_size: int, batch_bytes: int, compression: Compression = Compression.NONE
) -> tuple[bytes, int]:
    """One encoded batch of `record_size`-byte values filling about `batch_bytes`
    (before compression); returns (batch, record count). The leader stamps offsets,
    so it can be resent."""
    builder = BatchBuilder(compression=compression)
    value = os.urandom(record_size)
    now = int(time.time() * 1000)
    per_record = record_size + 8  # length, attributes, deltas, key/value lengths, headers
    while builder.estimated_size + per_record <= batch_bytes or len(builder) == 0:
        builder.append(value, None, (), now)
    return builder.build(), len(builder)


async def raw_fill(
    client: ClusterClient,
    topic: str,
    partitions: int,
    batch: bytes,
    total_bytes: int,
    *,
    acks: int = 1,
    on_progress: Callable[[int], None] | None = None,
) -> int:
    """Append copies of `batch` round-robin to the partitions of `topic` until
    `total_bytes` are written, with RAW_IN_FLIGHT requests in flight per leader.
    Returns the bytes written. Much faster than a producer: no per-record work."""
    await client.wait_for_topics([topic], timeout_ms=10_000)
    leaders: dict[int, list[int]] = {}
    for p in range(partitions):
        leader, _ = client.leader_for(TopicPartition(topic, p))
        leaders.setdefault(leader, []).append(p)
    count = max(1, total_bytes // len(batch))
    written = 0

    async def one_leader(node: int, parts: list[int], share: int) -> None:
        nonlocal written
        sem = asyncio.Semaphore(RAW_IN_FLIGHT)
        tasks: set[asyncio.Task[None]] = set()

        async def send(p: int) -> None:
            nonlocal written
            try:
                request = ProduceRequest(
                    acks=acks,
                    topics=[
                        ProduceTopic(
                            name=topic, partitions=[ProducePartition(index=p, records=batch)]
                        )
                    ],
                )
                response = await client.send(node, request, timeout_ms=30_000)
                assert isinstance(response, ProduceResponse)
                code = response.topics[0].partitions[0].error_code
                if code != ErrorCode.NONE:
                    raise RuntimeError(f"raw produce to {topic}-{p}: {ErrorCode(code).name}")
                written += len(batch)
                if on_progress is not None:
                    on_progress(written)
            finally:
                sem.release()

        for i in range(share):
            await sem.acquire()
            task = asyncio.get_running_loop().create_task(send(parts[i % len(parts)]))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)

    nodes = sorted(leaders)
    shares = [count // len(nodes) + (1 if i < count % len(nodes) else 0) for i in range(len(nodes))]
    await asyncio.gather(
        *(one_leader(n, leaders[n], s) for n, s in zip(nodes, shares, strict=True))
    )
    return written


class RawFetcher:
    """A fetch loop of whole batches without decoding records: the broker's ceiling.

    One Fetch per leader carries all its partitions; records are counted from the
    batch headers (a struct unpack per batch, nothing per record)."""

    def __init__(self, client: ClusterClient, topic: str, partitions: int, max_bytes: int) -> None:
        self.client = client
        self.topic = topic
        self.partitions = partitions
        self.partition_max_bytes = max_bytes
        self.offsets = dict.fromkeys(range(partitions), 0)

    async def fetch_round(self) -> tuple[int, int]:
        """One fetch per leader; returns (bytes, records) received."""
        by_leader: dict[int, list[int]] = {}
        for p in range(self.partitions):
            leader, _ = self.client.leader_for(TopicPartition(self.topic, p))
            by_leader.setdefault(leader, []).append(p)
        results = await asyncio.gather(*(self._fetch(n, ps) for n, ps in by_leader.items()))
        return sum(r[0] for r in results), sum(r[1] for r in results)

    async def _fetch(self, node: int, parts: list[int]) -> tuple[int, int]:
        request = FetchRequest(
            max_wait_ms=0,
            min_bytes=1,
            max_bytes=self.partition_max_bytes * len(parts),
            topics=[
                FetchTopic(
                    topic=self.topic,
                    partitions=[
                        FetchPartition(
                            partition=p,
                            fetch_offset=self.offsets[p],
                            partition_max_bytes=self.partition_max_bytes,
                        )
                        for p in parts
                    ],
                )
            ],
        )
        response = await self.client.send(node, request, timeout_ms=30_000)
        assert isinstance(response, FetchResponse)
        nbytes = records = 0
        for topic in response.responses:
            for part in topic.partitions:
                if part.error_code != ErrorCode.NONE:
                    raise RuntimeError(
                        f"raw fetch {self.topic}-{part.partition_index}: "
                        f"{ErrorCode(part.error_code).name}"
                    )
                data = part.records
                if len(data) < HEADER_SIZE:
                    continue
                for _, header in iter_headers(data):
                    records += header.record_count
                    nbytes += header.size
                    self.offsets[part.partition_index] = header.next_offset
        return nbytes, records


# ------------------------------------------------------------------ progress and table


class Progress:
    """`[#####-----] 3/10 label` on stderr, redrawn in place on a terminal."""

    WIDTH = 30

    def __init__(self, total: int, title: str) -> None:
        self.total = max(1, total)
        self.title = title
        self.done = 0
        self.started = time.monotonic()
        self.tty = sys.stderr.isatty()

    def update(self, label: str, done: int | None = None) -> None:
        if done is not None:
            self.done = done
        filled = int(self.WIDTH * self.done / self.total)
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        elapsed = time.monotonic() - self.started
        text = f"{self.title} [{bar}] {self.done}/{self.total} {elapsed:5.0f}s {label}"
        if self.tty:
            sys.stderr.write("\r\x1b[K" + text)
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def step(self, label: str) -> None:
        self.update(label, self.done + 1)

    def finish(self) -> None:
        if self.tty:
            sys.stderr.write("\n")
        sys.stderr.flush()


def format_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned text table (numbers right-aligned)."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    numeric = [all(isinstance(row[i], int | float) for row in rows) for i in range(len(columns))]

    def line(values: Sequence[str]) -> str:
        return "  ".join(
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ).rstrip()

    out = [line(list(columns)), line(["-" * w for w in widths])]
    out.extend(line(r) for r in cells)
    return "\n".join(out)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        value = value + 0.0  # no "-0"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.3g}" if value < 10 else f"{value:.1f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


# ------------------------------------------------------------------ results


# A fixed pure-Python loop, timed with every result file: this VM's CPU speed moves
# from one day to the next (the same client code read 510k and 750k records/s on two
# days, bench/README.md), so figures of two runs compare only at a like probe.
CPU_PROBE_ADDS = 2_000_000


def cpu_probe_ms() -> float:
    """Milliseconds for CPU_PROBE_ADDS integer additions in a Python loop, best of 5
    (it moves by ~30% from one second to the next on this VM)."""
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        total = 0
        for i in range(CPU_PROBE_ADDS):
            total += i
        best = min(best, time.perf_counter() - started)
    return round(best * 1000, 1)


def machine_info() -> dict[str, Any]:
    """What the figures were measured on."""
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_gib = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        first = Path("/proc/meminfo").read_text().splitlines()[0]
        mem_gib = round(int(first.split()[1]) / 1024 / 1024, 1)
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "cores": os.cpu_count(),
        "cpu_model": model,
        "memory_gib": mem_gib,
        "python": platform.python_version(),
        "uvloop": uvloop.__version__,
        "platform": platform.platform(),
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "load_average_at_start": [round(x, 2) for x in load] if load else None,
        "cpu_probe_ms": cpu_probe_ms(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10, check=False
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def write_results(
    name: str,
    *,
    args: argparse.Namespace,
    rows: list[dict[str, Any]],
    started: float,
    extra: dict[str, Any] | None = None,
    out: Path | None = None,
) -> Path:
    """bench/results/<name>.json (or `out`): machine, settings, one dict per cell."""
    path = out or RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "bench": name,
        "mode": "quick" if getattr(args, "quick", False) else "full",
        "machine": machine_info(),
        "settings": {k: v for k, v in vars(args).items() if _jsonable(v)},
        "wall_time_s": round(time.monotonic() - started, 1),
        "results": rows,
        **(extra or {}),
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)
    print(f"results: {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    return path


# A results table's columns: header -> the row's key, or a function of the row.
Columns = dict[str, str | Callable[[dict[str, Any]], Any]]

# What the throughput benches measure, last in their tables.
THROUGHPUT_COLUMNS: Columns = {
    "records/s": "records_per_s",
    "MB/s": "mb_per_s",
    "client cores": "client_cores",
    "broker cores": "broker_cores",
}


def batch_column(row: dict[str, Any]) -> str:
    return size_label(row["batch_size"])


def table_of(columns: Columns, rows: Sequence[dict[str, Any]]) -> list[list[Any]]:
    return [[c(r) if callable(c) else r[c] for c in columns.values()] for r in rows]


def report(
    name: str,
    args: argparse.Namespace,
    progress: Progress,
    columns: Sequence[str],
    table: Sequence[Sequence[Any]],
    rows: list[dict[str, Any]],
    **extra: Any,
) -> int:
    """End the progress bar, print the table, write the JSON (`extra` goes into it as
    it is, beside the rows; the wall time counts from the progress bar's start); the
    exit code (0)."""
    progress.finish()
    print(format_table(columns, table))
    write_results(
        name, args=args, rows=rows, started=progress.started, extra=extra or None, out=args.out
    )
    return 0


def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except TypeError:
        return False
    return True


def int_list(text: str) -> list[int]:
    """argparse type: "1,3" -> [1, 3]."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, not {text!r}"
        ) from None


def size_label(n: int) -> str:
    """16384 -> '16 KiB', 1048576 -> '1 MiB', 100 -> '100 B'."""
    if n >= MiB and n % MiB == 0:
        return f"{n // MiB} MiB"
    if n >= KiB and n % KiB == 0:
        return f"{n // KiB} KiB"
    return f"{n} B"


def common_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument(
        "--quick", action="store_true", help="a few seconds per cell, for smoke tests"
    )
    parser.add_argument("--out", type=Path, help="JSON path [default: bench/results/<name>.json]")
    parser.add_argument(
        "--keep-data", action="store_true", help="keep the cluster's temp dir (logs) afterwards"
    )
    return parser


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence (q in 0..100)."""
    assert sorted_values, "no samples"
    rank = min(len(sorted_values) - 1, max(0, round(q / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[rank]


@contextlib.contextmanager
def timed() -> Iterator[Callable[[], float]]:
    start = time.perf_counter()
    yield lambda: time.perf_counter() - start


async def until(check: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    """Poll `check` every 50 ms until true; TimeoutError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")
        await asyncio.sleep(0.05)
