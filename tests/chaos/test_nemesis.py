"""The nemesis against a fake backend: seeded, bounded, always healed, and honest about
faults a backend cannot inject. No cluster: part of the default suite."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from .backends import (
    CONTROLLER,
    Backend,
    BackendError,
    ClusterSettings,
    ProcessBackend,
    Unsupported,
    broker_id,
    broker_name,
)
from .history import INFO, INVOKE, NEMESIS, History
from .nemesis import FAULTS, Nemesis, NemesisConfig, parse_faults


class FakeBackend(Backend):
    name = "fake"

    def __init__(self, *, partitions_supported: bool = True, fail_start: int = 0) -> None:
        super().__init__(ClusterSettings(), Path("/nonexistent"))
        self.down_nodes: set[str] = set()
        self.paused: set[str] = set()
        self.isolated: set[str] = set()
        self.wiped: list[str] = []
        self.calls: list[tuple[str, str]] = []
        self.partitions_supported = partitions_supported
        self.fail_start = fail_start  # start() fails this many times

    async def up(self) -> None: ...
    async def down(self) -> None: ...

    def bootstrap_servers(self) -> str:
        return "127.0.0.1:1"  # nothing listens: kill-leader falls back to a random broker

    def broker_addresses(self) -> dict[int, tuple[str, int]]:
        return {}

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

    async def running(self, node: str) -> bool:
        return node not in self.down_nodes and node not in self.paused

    async def collect_logs(self, dest: Path) -> None: ...

    @property
    def healthy(self) -> bool:
        return not (self.down_nodes or self.paused or self.isolated)


def nemesis(backend: Backend, seed: int, faults: list[str], **kw: object) -> Nemesis:
    config = NemesisConfig(
        faults=faults,
        seed=seed,
        topic="t",
        partitions=3,
        interval=(0.0, 0.01),
        duration=(0.0, 0.01),
        **kw,  # type: ignore[arg-type]
    )
    return Nemesis(backend, History(), config, backend.bootstrap_servers())


def actions(n: Nemesis) -> list[tuple[str, str | None]]:
    return [(op.f, op.value) for op in n.history.ops if op.type == INVOKE]


async def test_same_seed_same_schedule_and_every_fault_is_undone() -> None:
    schedules = []
    for _ in range(2):
        backend = FakeBackend()
        n = nemesis(backend, 42, list(FAULTS), max_faults=12)
        await n.run(asyncio.Event())
        assert n.applied == 12
        assert backend.healthy
        schedules.append(actions(n))
    assert schedules[0] == schedules[1]
    other = nemesis(FakeBackend(), 43, list(FAULTS), max_faults=12)
    await other.run(asyncio.Event())
    assert actions(other) != schedules[0]
    faults = {f for f, _ in schedules[0]}
    assert faults >= {"kill", "start", "heal"}
    assert schedules[0][-1] == ("heal", None)


async def test_targets_match_the_fault() -> None:
    backend = FakeBackend()
    n = nemesis(backend, 7, ["kill-controller", "partition", "wipe", "kill-leader"], max_faults=8)
    await n.run(asyncio.Event())
    for f, target in actions(n):
        if f == "kill-controller":
            assert target == CONTROLLER
        elif f in ("partition", "wipe", "kill-leader"):
            assert target is not None and broker_id(target) in backend.broker_ids
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
