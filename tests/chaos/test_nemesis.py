"""The nemesis against a fake backend (and its metadata): seeded, bounded, overlapping,
always healed, guarded where a fault could destroy the last copy, and honest about
faults a backend cannot inject. No cluster: part of the default suite (the process
chaos runs use the real thing)."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest

from client.admin import PartitionDescription

from .backends import CONTROLLER
from .backends import Backend
from .backends import BackendError
from .backends import ClusterSettings
from .backends import ProcessBackend
from .backends import Unsupported
from .backends import broker_id
from .backends import broker_name
from .history import INFO
from .history import INVOKE
from .history import NEMESIS
from .history import History
from .nemesis import CONTROLLER_FAULTS
from .nemesis import EXCLUSIVE
from .nemesis import FAULTS
from .nemesis import Nemesis
from .nemesis import NemesisConfig
from .nemesis import PlannedFault
from .nemesis import parse_faults
from .nemesis import plan


class FakeBackend(Backend):
    name = "fake"

    def __init__(
        self, *, partitions_supported: bool = True, fail_start: int = 0, controllers: int = 1
    ) -> None:
        super().__init__(ClusterSettings(controllers=controllers), Path("/nonexistent"))
        self.down_nodes: set[str] = set()
        self.paused: set[str] = set()
        self.isolated: set[str] = set()
        self.wiped: list[str] = []
        self.calls: list[tuple[str, str]] = []
        self.partitions_supported = partitions_supported
        self.fail_start = fail_start  # start() fails this many times
        self.out_of_isr: set[int] = set()  # brokers the fake metadata leaves out of ISRs
        self.leader = 1

    def describe(self, partitions: int) -> list[PartitionDescription]:
        """What Metadata would say: every broker replicates every partition; the ISR is
        the brokers up, unpaused and not held out (the last leader when none is); the
        leader stays while it is in the ISR, else the first ISR member leads."""
        up = [
            i
            for i in self.broker_ids
            if broker_name(i) not in self.down_nodes | self.paused and i not in self.out_of_isr
        ]
        isr = tuple(up) or (self.leader,)
        if self.leader not in up:
            self.leader = up[0] if up else -1
        return [
            PartitionDescription(p, self.leader, 0, tuple(self.broker_ids), isr)
            for p in range(partitions)
        ]

    async def up(self) -> None: ...
    async def down(self) -> None: ...

    def bootstrap_servers(self) -> str:
        return "127.0.0.1:1"  # nothing listens: kill-leader falls back to a random broker

    def kafka_bootstrap_servers(self) -> str:
        return ""

    def broker_addresses(self) -> dict[int, tuple[str, int]]:
        return {}

    def controller_addresses(self) -> dict[int, tuple[str, int]]:
        return {}

    async def copy_data(self, node: str, dest: Path) -> None:
        raise AssertionError("the nemesis never copies data")

    def active_controller(self) -> str | None:
        """The quorum's leader: the first controller up and running."""
        bad = self.down_nodes | self.paused | self.isolated
        return next((n for n in self.controller_nodes if n not in bad), None)

    def unsupported(self, fault: str) -> str | None:
        return None if self.partitions_supported or fault != "partition" else "no network here"

    async def kill(self, node: str) -> None:
        self.calls.append(("kill", node))
        self.down_nodes.add(node)

    async def start(self, node: str) -> None:
        self.calls.append(("start", node))
        if self.fail_start > 0:
            self.fail_start -= 1
            raise BackendError(f"{node} would not start")
        self.down_nodes.discard(node)
        self.paused.discard(node)

    async def pause(self, node: str) -> None:
        self.calls.append(("pause", node))
        self.paused.add(node)

    async def resume(self, node: str) -> None:
        self.calls.append(("resume", node))
        self.paused.discard(node)

    async def isolate(self, node: str) -> None:
        if not self.partitions_supported:
            raise Unsupported("no network here")
        self.calls.append(("isolate", node))
        self.isolated.add(node)

    async def reconnect(self, node: str) -> None:
        self.calls.append(("reconnect", node))
        self.isolated.discard(node)

    async def wipe(self, node: str) -> None:
        self.calls.append(("wipe", node))
        self.wiped.append(node)
        node_id = broker_id(node)
        assert node_id is not None
        self.out_of_isr.add(node_id)  # empty: out of every ISR until it has caught up

    async def running(self, node: str) -> bool:
        return node not in self.down_nodes and node not in self.paused

    async def collect_logs(self, dest: Path) -> None: ...

    @property
    def healthy(self) -> bool:
        return not (self.down_nodes or self.paused or self.isolated)


class FakeMetadataNemesis(Nemesis):
    """Asks the fake backend's metadata instead of a cluster."""

    async def _describe(self, via: list[int] | None = None) -> list[PartitionDescription] | None:
        assert isinstance(self.backend, FakeBackend)
        return self.backend.describe(self.config.partitions)

    async def _active_controller(self) -> str | None:
        assert isinstance(self.backend, FakeBackend)
        return self.backend.active_controller()


def nemesis(backend: Backend, seed: int, faults: list[str], **kw: object) -> Nemesis:
    settings: dict[str, object] = {
        "interval": (0.0, 0.01),
        "duration": (0.0, 0.01),
        "phase_timeout": 0.5,
        **kw,
    }
    config = NemesisConfig(
        faults=faults,
        seed=seed,
        topic="t",
        partitions=3,
        **settings,  # type: ignore[arg-type]
    )
    return FakeMetadataNemesis(backend, History(), config, backend.bootstrap_servers())


def actions(n: Nemesis) -> list[tuple[str, str | None]]:
    return [(op.f, op.value) for op in n.history.ops if op.type == INVOKE]


async def test_same_seed_same_schedule_and_every_fault_is_undone() -> None:
    schedules = []
    for _ in range(2):
        backend = FakeBackend()
        n = nemesis(backend, 42, [f for f in FAULTS if f != "wipe"], max_faults=12)
        await n.run(asyncio.Event())
        assert n.applied == 12
        assert backend.healthy
        schedules.append(actions(n))
    assert schedules[0] == schedules[1]
    other = nemesis(FakeBackend(), 43, [f for f in FAULTS if f != "wipe"], max_faults=12)
    await other.run(asyncio.Event())
    assert actions(other) != schedules[0]
    faults = {f for f, _ in schedules[0]}
    assert faults >= {"kill", "start", "heal"}
    assert schedules[0][-1] == ("heal", None)


def test_the_plan_is_seeded_bounded_and_overlapping() -> None:
    """The schedule comes from the seed alone; at most max_concurrent windows overlap,
    an exclusive fault overlaps none, all start within the time limit."""
    config = NemesisConfig(
        faults=list(FAULTS),
        seed=5,
        topic="t",
        partitions=3,
        max_faults=40,
        time_limit=120,
        interval=(0.5, 2.0),
        duration=(2.0, 6.0),
        max_concurrent=3,
    )
    schedule = plan(config, list(FAULTS))
    assert schedule == plan(config, list(FAULTS))
    assert schedule != plan(NemesisConfig(**{**config.__dict__, "seed": 6}), list(FAULTS))
    assert 0 < len(schedule) <= 40 and all(e.at < 120 for e in schedule)

    def overlapping(t: float) -> list[PlannedFault]:
        return [e for e in schedule if e.at <= t < e.at + e.window(config.phase_timeout)]

    peak = max(len(overlapping(e.at)) for e in schedule)
    assert peak == 3, "compound faults are planned, not left to chance"
    for e in schedule:
        during = overlapping(e.at)
        assert len(during) <= 3
        if any(x.fault in EXCLUSIVE for x in during):
            assert len(during) == 1, during
    one_at_a_time = plan(NemesisConfig(**{**config.__dict__, "max_concurrent": 1}), ["kill"])
    assert all(
        a.at + a.window(config.phase_timeout) <= b.at for a, b in itertools.pairwise(one_at_a_time)
    )


async def test_faults_overlap_bounded_and_never_two_on_one_node() -> None:
    """Run the plan: several faults are active at once (recorded with each), never more
    than max_concurrent, never two on one node; all are undone."""
    backend = FakeBackend()
    n = nemesis(
        backend,
        8,
        ["kill", "pause", "pause-controller", "kill-controller", "partition"],
        max_faults=12,
        max_concurrent=3,
        interval=(0.0, 0.02),
        duration=(0.05, 0.1),
    )
    await n.run(asyncio.Event())
    assert backend.healthy
    assert n.max_concurrent_seen == 3
    applied = [
        op for op in n.history.ops if op.type == INFO and op.extra and "concurrent" in op.extra
    ]
    assert max(op.extra["concurrent"] for op in applied) == 3  # type: ignore[index]
    on: dict[str, str] = {}
    undo = {"start": "kill", "resume": "pause", "reconnect": "partition"}
    for op in n.history.ops:
        if op.type != INFO or op.error or op.value is None:
            continue
        if op.f in ("kill", "pause", "pause-controller", "kill-controller", "partition"):
            assert op.value not in on, f"{op.f} on {op.value} while {on.get(op.value)}"
            on[op.value] = op.f
        elif op.f in undo:
            on.pop(op.value, None)
    plan_op = n.history.ops[0]
    assert (plan_op.f, plan_op.extra["seed"]) == ("plan", 8)  # type: ignore[index]
    assert len(plan_op.extra["faults"]) == 12  # type: ignore[index]


async def test_wipes_are_guarded_until_the_last_one_recovered() -> None:
    """Wipe, then other faults while it recovers, then wipe again only once the first
    wiped broker is back in every ISR: every acknowledged write keeps a copy."""
    backend = FakeBackend()
    n = nemesis(backend, 1, ["wipe"], max_faults=1)
    first = PlannedFault(0.0, "wipe", 0.0, 0.0)
    assert await n._target(first) == "broker-1"
    await backend.wipe("broker-1")
    n._wiped.add("broker-1")
    assert await n._target(first) is None
    skipped = n.history.ops[-1]
    assert skipped.error == (
        "skipped: broker-1 (wiped) is not back in the ISR of partition(s) [0, 1, 2]"
    )
    backend.out_of_isr.clear()  # caught up
    assert await n._target(first) == "broker-1"
    # A broker whose partitions have no other in-sync replica free of faults is spared.
    await backend.pause("broker-2")
    n._busy["broker-2"] = "pause"
    n._busy["broker-3"] = "kill"
    assert await n._target(first) is None
    assert "another in-sync replica" in (n.history.ops[-1].error or "")
    unguarded = nemesis(FakeBackend(), 1, ["wipe"], guard_wipes=False)
    unguarded._wiped.add("broker-1")
    assert await unguarded._target(first) == "broker-1"


async def test_diverge_leaves_the_leader_alone_then_replaces_it() -> None:
    """diverge: pause the followers until the ISR is the leader alone, kill the leader,
    resume the followers (one leads), start the old leader; nothing else meanwhile."""
    backend = FakeBackend()
    n = nemesis(backend, 2, ["diverge", "kill"], max_faults=4, duration=(0.05, 0.05))
    await n.run(asyncio.Event())
    assert backend.healthy
    calls = backend.calls
    i = calls.index(("pause", "broker-2"))
    assert calls[i : i + 6] == [
        ("pause", "broker-2"),
        ("pause", "broker-3"),
        ("kill", "broker-1"),
        ("resume", "broker-2"),
        ("resume", "broker-3"),
        ("start", "broker-1"),
    ]
    end = next(op for op in n.history.ops if op.f == "diverge-end")
    assert end.extra == {
        "partition": end.extra["partition"],
        "leader-alone": True,
        "new-leader": True,
    }  # type: ignore[index]


async def test_targets_match_the_fault() -> None:
    backend = FakeBackend()
    faults = ["kill-controller", "pause-controller", "partition", "wipe", "kill-leader", "pause"]
    n = nemesis(backend, 2, faults, max_faults=12, max_concurrent=2)
    await n.run(asyncio.Event())
    assert {f for f, _ in actions(n)} >= {"kill-controller", "pause-controller", "pause"}
    for f, target in actions(n):
        if target is None:
            continue  # skipped (its info says why) or heal
        if f in CONTROLLER_FAULTS:
            assert target == CONTROLLER
        elif f in ("partition", "wipe", "kill-leader", "pause"):
            assert broker_id(target) in backend.broker_ids
    assert backend.healthy


async def test_bounded_by_count_and_time() -> None:
    n = nemesis(FakeBackend(), 1, ["pause"], max_faults=3)
    await n.run(asyncio.Event())
    assert n.applied == 3
    slow = nemesis(FakeBackend(), 1, ["pause"], max_faults=1000, time_limit=0.3)
    started = asyncio.get_running_loop().time()
    await slow.run(asyncio.Event())
    assert asyncio.get_running_loop().time() - started < 5
    assert slow.applied < 1000


async def test_stop_event_ends_the_schedule_and_heals() -> None:
    backend = FakeBackend()
    config = NemesisConfig(
        faults=["kill"], seed=3, topic="t", partitions=1, interval=(0.0, 0.0), duration=(30, 30)
    )
    n = Nemesis(backend, History(), config, backend.bootstrap_servers())
    stop = asyncio.Event()
    task = asyncio.create_task(n.run(stop))
    await asyncio.sleep(0.2)
    assert backend.down_nodes  # killed, holding for 30 s
    stop.set()
    await asyncio.wait_for(task, 5)
    assert backend.healthy


async def test_heal_runs_even_when_the_run_is_cancelled() -> None:
    backend = FakeBackend()
    config = NemesisConfig(
        faults=["pause"], seed=3, topic="t", partitions=1, interval=(0.0, 0.0), duration=(30, 30)
    )
    n = Nemesis(backend, History(), config, backend.bootstrap_servers())
    task = asyncio.create_task(n.run(asyncio.Event()))
    await asyncio.sleep(0.2)
    assert backend.paused
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert backend.healthy


async def test_a_failed_restart_is_recorded_and_retried_by_heal() -> None:
    backend = FakeBackend(fail_start=1)
    n = nemesis(backend, 5, ["kill"], max_faults=1)
    await n.run(asyncio.Event())
    errors = [op for op in n.history.ops if op.type == INFO and op.error]
    assert [op.f for op in errors] == ["start"]
    assert backend.healthy  # heal started it


async def test_unsupported_faults_are_skipped_with_the_reason_recorded() -> None:
    backend = FakeBackend(partitions_supported=False)
    n = nemesis(backend, 9, ["partition"], max_faults=2)
    await n.run(asyncio.Event())
    assert n.applied == 0
    assert n.skipped == ["partition"]  # once, with its reason
    skipped = [op for op in n.history.ops if op.process == NEMESIS and op.error]
    assert [(op.f, op.error) for op in skipped] == [("partition", "unsupported: no network here")]
    assert not backend.isolated


async def test_unsupported_faults_leave_the_others() -> None:
    backend = FakeBackend(partitions_supported=False)
    n = nemesis(backend, 9, ["partition", "pause"], max_faults=3)
    await n.run(asyncio.Event())
    assert n.applied == 3 and n.skipped == ["partition"]
    assert {f for f, _ in actions(n)} == {"partition", "pause", "resume", "heal"}


def test_the_process_backend_cannot_partition(tmp_path: Path) -> None:
    backend = ProcessBackend(ClusterSettings(), tmp_path)
    try:
        reason = backend.unsupported("partition")
        assert reason is not None and "docker" in reason
        assert backend.unsupported("kill") is None
        with pytest.raises(Unsupported):
            asyncio.run(backend.isolate(broker_name(1)))
    finally:
        asyncio.run(backend.down())


def test_parse_faults() -> None:
    assert parse_faults("kill, pause,kill") == ["kill", "pause"]
    assert parse_faults("all") == list(FAULTS)
    assert parse_faults("none") == [] and parse_faults("") == []
    with pytest.raises(ValueError, match="unknown fault"):
        parse_faults("kill,explode")


async def test_controller_faults_keep_a_majority_of_the_quorum() -> None:
    """Invariant: with a quorum of three, faults take one controller at a time (a
    majority keeps running, so there is an active controller to fail over to), any
    voter may be hit, and kill-active-controller takes the leader of the moment."""
    backend = FakeBackend(controllers=3)
    faults = ["kill-controller", "pause-controller", "kill-active-controller", "partition"]
    n = nemesis(backend, 5, faults, max_faults=30, max_concurrent=3)
    leader_when_killed: dict[str, list[str | None]] = {}
    kill = backend.kill

    async def kill_noting_the_leader(node: str) -> None:
        leader_when_killed.setdefault(node, []).append(backend.active_controller())
        await kill(node)

    backend.kill = kill_noting_the_leader  # type: ignore[method-assign]
    await n.run(asyncio.Event())
    assert backend.healthy
    targets = {v for f, v in actions(n) if f in CONTROLLER_FAULTS and v is not None}
    assert targets <= set(backend.controller_nodes) and len(targets) >= 2, targets
    under_fault: set[str] = set()
    for op in n.history.ops:
        if op.process != NEMESIS or op.type != INFO or op.value is None or op.error:
            continue
        if op.f in CONTROLLER_FAULTS:
            under_fault.add(op.value)
            assert len(under_fault) <= 1, (op.index, under_fault)
        elif op.f in ("start", "resume", "reconnect"):
            under_fault.discard(op.value)
    skipped = [op.error for op in n.history.ops if op.f in CONTROLLER_FAULTS and op.error]
    assert any("minority" in e for e in skipped), skipped
    active_kills = [v for f, v in actions(n) if f == "kill-active-controller" and v]
    assert active_kills, actions(n)
    for node in active_kills:
        assert node in leader_when_killed.get(node, []), (node, leader_when_killed)
