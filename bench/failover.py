"""Failover: how long producing stops when a partition's leader is SIGKILLed, and when
it is shut down in a controlled way (SIGTERM).

A 3-broker cluster, a topic with one partition and replication factor 3; an
AsyncProducer (acks=all, linger_ms=0, idempotent) in this process sends at a steady
`--rate` and stamps each acknowledgement with CLOCK_MONOTONIC. Each trial signals the
current leader, waits until acknowledgements have flowed again for a second, then
restarts the broker and waits for a full ISR before the next trial.

The unavailability window of a trial is the longest gap between consecutive
acknowledgements from half a second before the signal to the end of the trial (the
gap between the last ack before and the first ack after; at the steady rate the
normal gap is 1/rate). `elected_s` is when a new leader first showed in the
metadata, after the signal. The controller fences a silent broker after its session
timeout (`--session-timeout-ms`, the controller's default 4000); brokers heartbeat
every 200 ms (tests/integration/cluster.py's setting). The producer retries with
`retry_backoff_ms` 50 up to `retry_backoff_max_ms` 250, so its backoff adds at most
about 0.25 s to a window.

`--target controller` (issue 17): three controllers in a quorum. Each trial SIGKILLs
the active controller ("controller": `failover_s` is from the signal to the first topic
created through a broker afterwards, forwarded to the new active controller; target
2 s) or the active controller and the partition's leader broker together
("leader+controller": the produce window as above; the new active controller gives
every broker a fresh session, then fences the dead one after the session timeout;
target session timeout + 2 s). The killed servers are restarted and the quorum and
the ISR are whole again before the next trial.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import signal
import sys
import time
from collections.abc import Awaitable
from collections.abc import Callable
from typing import Any

from bench.harness import BenchCluster
from bench.harness import Progress
from bench.harness import common_args
from bench.harness import report
from bench.harness import run
from bench.harness import wait_full_isr
from client.admin import AsyncAdmin
from client.errors import MinibrokerError
from client.producer import AsyncProducer
from client.quorum_admin import describe_quorum

NAME = "failover"
TOPIC = "bench-failover"
RECORD_SIZE = 100
STEADY_S = 1.5  # acks flowing before a signal
RESUMED_S = 1.0  # acks flowing again before a trial ends
TRIAL_TIMEOUT_S = 60.0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench failover", description=__doc__.split("\n")[0])
    common_args(p)
    p.add_argument("--rate", type=int, default=1000, help="records/s sent steadily [1000]")
    p.add_argument("--trials", type=int, help="trials per kind [3; 1 with --quick]")
    p.add_argument(
        "--session-timeout-ms", type=int, default=4000, help="controller session timeout [4000]"
    )
    p.add_argument(
        "--target",
        choices=("broker", "controller"),
        default="broker",
        help="what is killed: the partition's leader broker, or the active controller of "
        "a 3-controller quorum (alone, and with the leader broker) [broker]",
    )
    return p


class SteadyProducer:
    """Sends `rate` records/s until stopped, recording each ack's time (monotonic s)."""

    def __init__(self, bootstrap: str, rate: int) -> None:
        self.producer = AsyncProducer(
            bootstrap, acks="all", linger_ms=0, retry_backoff_ms=50, retry_backoff_max_ms=250
        )
        self.rate = rate
        self.ack_times: list[float] = []
        self.failures = 0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.producer.start()
        await self.producer.partitions_for(TOPIC)
        self._task = asyncio.get_running_loop().create_task(self._send())

    def _on_done(self, future: asyncio.Future[Any]) -> None:
        if future.cancelled() or future.exception() is not None:
            self.failures += 1
        else:
            self.ack_times.append(time.monotonic())

    async def _send(self) -> None:
        value = b"x" * RECORD_SIZE
        start = time.monotonic()
        sent = 0
        while True:
            due = int((time.monotonic() - start) * self.rate) - sent
            for _ in range(due):
                (await self.producer.send(TOPIC, value)).add_done_callback(self._on_done)
                sent += 1
            await asyncio.sleep(0.001)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.producer.close()

    def acks_since(self, t: float) -> list[float]:
        # ack_times is appended in time order: search from the end.
        i = len(self.ack_times)
        while i > 0 and self.ack_times[i - 1] >= t:
            i -= 1
        return self.ack_times[i:]


async def current_leader(admin: AsyncAdmin) -> int:
    (desc,) = await admin.describe_topics([TOPIC], include_offsets=False)
    return desc.partitions[0].leader


async def trial(
    cluster: BenchCluster, producer: SteadyProducer, admin: AsyncAdmin, kind: str, n: int
) -> dict[str, Any]:
    await asyncio.sleep(STEADY_S)
    leader = await current_leader(admin)
    proc = cluster.cluster.brokers[leader]
    sig = signal.SIGKILL if kind == "SIGKILL" else signal.SIGTERM
    failures_before = producer.failures
    t_signal = time.monotonic()
    assert proc.popen is not None
    proc.popen.send_signal(sig)
    elected = None
    deadline = t_signal + TRIAL_TIMEOUT_S
    while True:
        now = time.monotonic()
        if now > deadline:
            raise TimeoutError(f"{kind}: produce did not resume within {TRIAL_TIMEOUT_S:.0f} s")
        if elected is None:
            try:
                new = await current_leader(admin)
            except Exception:
                new = -1
            if new >= 0 and new != leader:
                elected = time.monotonic() - t_signal
        acks = producer.acks_since(t_signal)
        # Resumed: acks for RESUMED_S after a gap (or, if there was none, after the signal).
        if elected is not None and acks and acks[-1] - _resume_time(acks, t_signal) >= RESUMED_S:
            break
        await asyncio.sleep(0.05)
    window = producer.acks_since(t_signal - 0.5)
    gaps = [b - a for a, b in itertools.pairwise(window)]
    biggest = max(range(len(gaps)), key=gaps.__getitem__)
    await asyncio.to_thread(proc.wait_exit, 30)
    await asyncio.to_thread(cluster.restart_broker, leader)
    await wait_full_isr(admin, TOPIC, 3, timeout_s=60)
    return {
        "kind": kind,
        "old_leader": leader,
        "unavailable_s": round(gaps[biggest], 3),
        "last_ack_before_s": round(window[biggest] - t_signal, 3),
        "first_ack_after_s": round(window[biggest + 1] - t_signal, 3),
        "elected_s": round(elected, 3),
        "failed_records": producer.failures - failures_before,
    }


def _resume_time(acks: list[float], t_signal: float) -> float:
    """The first ack after the biggest gap since the signal."""
    points = [t_signal, *acks]
    gaps = [(b - a, b) for a, b in itertools.pairwise(points)]
    return max(gaps)[1]


Trial = Callable[[BenchCluster, SteadyProducer, AsyncAdmin, str, int], Awaitable[dict[str, Any]]]


async def run_trials(
    cluster: BenchCluster,
    args: argparse.Namespace,
    progress: Progress,
    kinds: tuple[str, ...],
    one: Trial,
    measure: str,
) -> list[dict[str, Any]]:
    """`args.trials` of each kind, one steady producer throughout."""
    await cluster.create_topic(TOPIC, partitions=1, replication_factor=3)
    rows = []
    async with AsyncAdmin(cluster.bootstrap) as admin:
        producer = SteadyProducer(cluster.bootstrap, args.rate)
        await producer.start()
        try:
            for kind in kinds:
                for i in range(args.trials):
                    progress.update(f"{kind} trial {i + 1}")
                    rows.append(await one(cluster, producer, admin, kind, i))
                    progress.step(f"{kind}: {rows[-1][measure]:.3f} s")
        finally:
            await producer.stop()
    return rows


async def _active_controller(cluster: BenchCluster) -> int:
    voters = [("127.0.0.1", p.port) for p in cluster.cluster.quorum.values()]
    return (await describe_quorum(voters)).leader_id


async def _quorum_whole(cluster: BenchCluster, timeout_s: float = 60) -> None:
    voters = [("127.0.0.1", p.port) for p in cluster.cluster.quorum.values()]
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            q = await describe_quorum(voters)
            if all(v.lag == 0 for v in q.voters):
                return
        except MinibrokerError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("the controller quorum did not catch up")
        await asyncio.sleep(0.1)


async def controller_trial(
    cluster: BenchCluster, producer: SteadyProducer, admin: AsyncAdmin, kind: str, n: int
) -> dict[str, Any]:
    await asyncio.sleep(STEADY_S)
    active = await _active_controller(cluster)
    victims = [cluster.cluster.quorum[active]]
    leader = -1
    if kind == "leader+controller":
        leader = await current_leader(admin)
        victims.append(cluster.cluster.brokers[leader])
    failures_before = producer.failures
    t_signal = time.monotonic()
    for proc in victims:
        assert proc.popen is not None
        proc.popen.send_signal(signal.SIGKILL)
    deadline = t_signal + TRIAL_TIMEOUT_S
    name = f"{TOPIC}-{kind.replace('+', '-')}-{n}"
    while True:  # through a broker, forwarded to whichever controller is active
        try:
            await admin.create_topic(name, 1, 1)
            break
        except MinibrokerError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{kind}: no topic created in {TRIAL_TIMEOUT_S:.0f} s") from None
            await asyncio.sleep(0.02)
    failover = time.monotonic() - t_signal
    row: dict[str, Any] = {"kind": kind, "failover_s": round(failover, 3), "unavailable_s": None}
    if leader >= 0:
        while True:
            acks = producer.acks_since(t_signal)
            if acks and acks[-1] - _resume_time(acks, t_signal) >= RESUMED_S:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{kind}: produce did not resume")
            await asyncio.sleep(0.05)
        window = producer.acks_since(t_signal - 0.5)
        row["unavailable_s"] = round(max(b - a for a, b in itertools.pairwise(window)), 3)
    row["failed_records"] = producer.failures - failures_before
    for proc in victims:
        await asyncio.to_thread(proc.wait_exit, 30)
    await asyncio.to_thread(cluster.cluster.start_voter, active)
    if leader >= 0:
        await asyncio.to_thread(cluster.restart_broker, leader)
        await wait_full_isr(admin, TOPIC, 3, timeout_s=60)
    await _quorum_whole(cluster)
    return row


def controller_main(args: argparse.Namespace) -> int:
    progress = Progress(2 * args.trials, NAME)
    with BenchCluster(
        3, session_timeout_ms=args.session_timeout_ms, keep_data=args.keep_data, controllers=3
    ) as cluster:
        kinds = ("controller", "leader+controller")
        rows = run(run_trials(cluster, args, progress, kinds, controller_trial, "failover_s"))
    session_s = args.session_timeout_ms / 1000
    summary = []
    for kind, measure, target in (
        ("controller", "failover_s", 2.0),
        ("leader+controller", "unavailable_s", session_s + 2),
    ):
        values = sorted(r[measure] for r in rows if r["kind"] == kind)
        summary.append(
            {
                "kind": kind,
                "measure": measure,
                "trials": len(values),
                "median_s": values[len(values) // 2],
                "max_s": values[-1],
                "target_s": target,
            }
        )
    table = [[r["kind"], r["failover_s"], r["unavailable_s"], r["failed_records"]] for r in rows]
    columns = ["killed", "topic created after s", "produce unavailable s", "failed"]
    return report(NAME, args, progress, columns, table, rows, summary=summary, target="controller")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.trials is None:
        args.trials = 1 if args.quick else 3
    if args.target == "controller":
        return controller_main(args)
    progress = Progress(2 * args.trials, NAME)
    with BenchCluster(
        3, session_timeout_ms=args.session_timeout_ms, keep_data=args.keep_data
    ) as cluster:
        kinds = ("SIGKILL", "SIGTERM")
        rows = run(run_trials(cluster, args, progress, kinds, trial, "unavailable_s"))
    summary = []
    for kind in ("SIGKILL", "SIGTERM"):
        values = sorted(r["unavailable_s"] for r in rows if r["kind"] == kind)
        summary.append(
            {
                "kind": kind,
                "trials": len(values),
                "median_s": values[len(values) // 2],
                "max_s": values[-1],
                "target_s": args.session_timeout_ms / 1000 + 1 if kind == "SIGKILL" else 0.2,
            }
        )
    table = [
        [
            r["kind"],
            r["unavailable_s"],
            r["elected_s"],
            r["last_ack_before_s"],
            r["first_ack_after_s"],
            r["failed_records"],
        ]
        for r in rows
    ]
    columns = ["signal", "unavailable s", "elected s", "last ack s", "first ack s", "failed"]
    extra = {"summary": summary, "heartbeat_interval_ms": 200}
    return report(NAME, args, progress, columns, table, rows, **extra)


if __name__ == "__main__":
    sys.exit(main())
