"""How long a consumer group takes to rebalance: `python -m bench rebalance`
(issue 16: join and leave <= 1 s with the initial rebalance delay at 0, a SIGKILLed
member's partitions moved within its session timeout + 1 s).

Three brokers (`--group-initial-rebalance-delay-ms 0`), one topic of `--partitions`
partitions, a group of `--members` minibroker consumers, each its own process
(subscribe, poll every 100 ms, report every assignment with its wall-clock time). Per
round, from a Stable group of that size:

- join: one more member starts; done when every member's last assignment came after
  the start and the assignments cover every partition exactly once;
- leave: one member closes (LeaveGroup); done likewise over the others;
- kill: one member is SIGKILLed; the others notice at their next heartbeat after the
  coordinator expires its session, so the time includes the session timeout.

The members heartbeat every `--heartbeat-ms` (a member learns of a rebalance from its
next heartbeat, so this bounds join and leave times) with a `--session-ms` session.
The median of `--rounds` rounds per case.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import signal
import statistics
import time
from typing import Any

from bench.harness import BenchCluster
from bench.harness import common_args
from bench.harness import format_table
from bench.harness import run
from bench.harness import write_results

NAME = "rebalance"
TOPIC = "rebalanced"
GROUP = "bench-rebalance"
WAIT_S = 60.0


def _member(bootstrap: str, name: str, session_ms: int, heartbeat_ms: int, out: Any) -> None:
    """A member process: reports (name, wall time, partitions) at every assignment."""
    import asyncio

    from client import AsyncConsumer

    class Report:
        def on_partitions_revoked(self, revoked: Any) -> None:
            pass

        def on_partitions_assigned(self, assigned: Any) -> None:
            out.put((name, time.time(), sorted(tp.partition for tp in assigned)))

    async def go() -> None:
        consumer = AsyncConsumer(
            bootstrap,
            group_id=GROUP,
            client_id=name,
            session_timeout_ms=session_ms,
            heartbeat_interval_ms=heartbeat_ms,
        )
        stopping = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
        await consumer.start()
        consumer.subscribe([TOPIC], listener=Report())
        while not stopping.is_set():
            await consumer.poll(timeout_ms=100)
        await consumer.close()  # leaves the group

    asyncio.run(go())


class Group:
    """The member processes and their last reported assignments."""

    def __init__(self, bootstrap: str, args: argparse.Namespace) -> None:
        self.bootstrap = bootstrap
        self.args = args
        self.ctx = multiprocessing.get_context("spawn")
        self.reports: Any = self.ctx.Queue()
        self.procs: dict[str, Any] = {}
        self.last: dict[str, tuple[float, list[int]]] = {}
        self._next = 0

    def start(self) -> str:
        name = f"member-{self._next}"
        self._next += 1
        proc = self.ctx.Process(
            target=_member,
            args=(self.bootstrap, name, self.args.session_ms, self.args.heartbeat_ms, self.reports),
            daemon=True,
        )
        proc.start()
        self.procs[name] = proc
        return name

    def stop(self, name: str, *, kill: bool) -> None:
        proc = self.procs.pop(name)
        os.kill(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
        proc.join(30)
        self.last.pop(name, None)

    def settled_after(self, t0: float) -> float:
        """Wall time at which every live member had an assignment given after `t0`
        and together they cover every partition once: that moment minus `t0`."""
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            try:
                name, at, partitions = self.reports.get(timeout=0.1)
                if name in self.procs:
                    self.last[name] = (at, partitions)
            except queue.Empty:
                pass
            live = [self.last.get(n) for n in self.procs]
            if any(x is None or x[0] < t0 for x in live):
                continue
            owned = sorted(p for x in live if x is not None for p in x[1])
            if owned == list(range(self.args.partitions)):
                return max(x[0] for x in live if x is not None) - t0
        raise RuntimeError(f"the group did not settle within {WAIT_S} s: {self.last}")

    def close(self) -> None:
        for name in list(self.procs):
            self.stop(name, kill=True)


async def _create_topic(cluster: BenchCluster, partitions: int) -> None:
    await cluster.create_topic(TOPIC, partitions=partitions, replication_factor=3)


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    times: dict[str, list[float]] = {"join": [], "leave": [], "kill": []}
    flags = ["--group-initial-rebalance-delay-ms", "0", "--group-min-session-timeout-ms", "1000"]
    with BenchCluster(3, broker_args=flags, keep_data=args.keep_data) as cluster:
        run(_create_topic(cluster, args.partitions))
        group = Group(cluster.bootstrap, args)
        try:
            t0 = time.time()
            for _ in range(args.members):
                group.start()
            first = group.settled_after(t0)
            for _ in range(args.rounds):
                t0 = time.time()
                group.start()
                times["join"].append(group.settled_after(t0))
                t0 = time.time()
                group.stop(next(iter(group.procs)), kill=False)
                times["leave"].append(group.settled_after(t0))
                group.start()  # back to --members, then one is killed
                group.settled_after(time.time())
                group.start()
                group.settled_after(time.time())
                t0 = time.time()
                group.stop(next(iter(group.procs)), kill=True)
                times["kill"].append(group.settled_after(t0))
        finally:
            group.close()
    targets = {"join": 1.0, "leave": 1.0, "kill": args.session_ms / 1000 + 1.0}
    rows = [
        {
            "case": case,
            "members": args.members,
            "median_s": round(statistics.median(ts), 3),
            "max_s": round(max(ts), 3),
            "target_s": targets[case],
            "rounds": [round(t, 3) for t in ts],
        }
        for case, ts in times.items()
    ]
    rows.append({"case": "first generation", "members": args.members, "median_s": round(first, 3)})
    return rows


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m bench {NAME}", description=__doc__.split("\n")[0])
    common_args(p)
    p.add_argument("--members", type=int, default=4, help="members of the group [4]")
    p.add_argument("--partitions", type=int, default=12, help="partitions of the topic [12]")
    p.add_argument("--rounds", type=int, default=3, help="rounds per case [3]")
    p.add_argument("--session-ms", type=int, default=6_000, help="members' session [6000]")
    p.add_argument("--heartbeat-ms", type=int, default=300, help="heartbeat interval [300]")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.quick:
        args.rounds, args.session_ms = 1, 2_000
    started = time.monotonic()
    rows = measure(args)
    print(
        format_table(
            ["case", "members", "median s", "max s", "target s"],
            [
                [
                    r["case"],
                    r["members"],
                    r["median_s"],
                    r.get("max_s", "-"),
                    r.get("target_s", "-"),
                ]
                for r in rows
            ],
        )
    )
    write_results(NAME, args=args, rows=rows, started=started, out=args.out)
    return 0
