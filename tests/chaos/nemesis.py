"""The nemesis: overlapping faults on a seeded schedule, bounded in number, overlap and
time, and healed.

Faults (names for --faults):

    kill             SIGKILL a random broker; restart it after a while
    kill-leader      SIGKILL the leader of a random partition (asked with Metadata)
    kill-controller  SIGKILL a random controller (with a quorum, any voter, the active
                     one included); restart it after a while
    kill-active-controller
                     SIGKILL the active controller, the quorum's leader (asked with
                     DescribeQuorum); restart it after a while
    pause            SIGSTOP a random broker (docker pause); resume it after a while
    pause-controller SIGSTOP a random controller (a stall: a GC pause, a frozen VM; a
                     paused quorum leader is a zombie that must be fenced); resume it
    partition        cut a random broker off the network (docker network disconnect);
                     connect it again after a while (docker backend only)
    partition-controller
                     the same for a random controller (docker backend only)
    wipe             SIGKILL a random broker, delete its data, start it (KIP-903); it
                     then recovers (catches up) for the fault's duration. An unguarded
                     wipe (data lost on purpose) can take a partition's last in-sync
                     copy: the controller then leaves it without a leader rather than
                     elect the empty replica, and the nemesis does what an operator
                     accepting the loss would: an unclean election (ElectLeaders)
    diverge          a leader left alone, then replaced: pause the followers of a random
                     partition until its ISR is the leader alone (it goes on taking
                     writes when min.insync.replicas is 1), SIGKILL the leader, resume
                     the followers (with unclean election on, one of them leads a new,
                     divergent lineage), then start the old leader. Runs alone.

The schedule is drawn from the seed before the run (`plan()`) and recorded first in the
history (`plan`): each fault's start time, its duration and a number that picks its
target among the nodes eligible when it starts. Faults overlap: a new one starts while
earlier ones still hold (wipe a broker, pause another while the first recovers, kill the
controller...), at most `max_concurrent` at once, at most `max_faults` in all, each for
at most the longest duration, and never two on one node. Faults on controllers take
at most a minority of a quorum at once (one of three, two of five), so the cluster
keeps an active controller to fail over to; a single controller is simply taken.
Wipes are guarded (unless
`guard_wipes` is off, to lose data on purpose): a broker is wiped only when every
partition it hosts has another in-sync replica not under a fault, and no earlier wiped
broker is still out of an ISR, so every acknowledged write keeps a copy. What the
cluster does meanwhile is not deterministic, so which targets are eligible is not
either; the plan is.

A fault the backend cannot inject is dropped from the mix at the start, its reason
logged and recorded (`info` with an error). `heal()` runs at the end whatever happened
(reconnect, resume, restart everything) and waits until every node is up.

History: the nemesis is process "nemesis"; each action is an `invoke` then an `info`
with the target as `value` (and `error` when it failed or was skipped); a fault's
`info` carries {"concurrent": faults active at that moment, itself included}.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import asdict
from dataclasses import dataclass
from typing import Any

from client import AsyncAdmin
from client.admin import PartitionDescription
from client.errors import MinibrokerError
from client.types import TopicPartition
from runtime.active_controller import describe_quorum_at
from runtime.peer_rpc import RpcError

from .backends import Backend
from .backends import BackendError
from .backends import Unsupported
from .backends import broker_id
from .backends import broker_name
from .backends import controller_name
from .history import INFO
from .history import INVOKE
from .history import NEMESIS
from .history import History

log = logging.getLogger(__name__)

FAULTS = (
    "kill",
    "kill-leader",
    "kill-controller",
    "kill-active-controller",
    "pause",
    "pause-controller",
    "partition",
    "partition-controller",
    "wipe",
    "diverge",
)
CONTROLLER_FAULTS = frozenset(
    {"kill-controller", "kill-active-controller", "pause-controller", "partition-controller"}
)
# What the backend does for each fault that is one action on one node.
_ACTION = {
    "kill": "kill",
    "kill-leader": "kill",
    "kill-controller": "kill",
    "kill-active-controller": "kill",
    "pause": "pause",
    "pause-controller": "pause",
    "partition": "isolate",
    "partition-controller": "isolate",
    "wipe": "wipe",
}
# Faults that run with no other fault active (they use every broker).
EXCLUSIVE = frozenset({"diverge"})
# A fault and how it is undone.
_RECOVERY = {"kill": "start", "pause": "resume", "isolate": "reconnect"}


def parse_faults(text: str) -> list[str]:
    """'kill,pause' -> ['kill', 'pause']; 'all' -> every fault; '' / 'none' -> []."""
    names = [f.strip() for f in text.split(",") if f.strip()]
    if names in (["none"], []):
        return []
    if names == ["all"]:
        return list(FAULTS)
    bad = [f for f in names if f not in FAULTS]
    if bad:
        raise ValueError(f"unknown fault(s) {bad}: choose from {', '.join(FAULTS)} or all")
    return list(dict.fromkeys(names))


@dataclass
class NemesisConfig:
    faults: list[str]
    seed: int
    topic: str
    partitions: int
    max_faults: int = 6
    time_limit: float = 60.0
    # seconds between fault starts, and how long a fault lasts
    interval: tuple[float, float] = (2.0, 5.0)
    duration: tuple[float, float] = (2.0, 6.0)
    max_concurrent: int = 1  # faults active at once
    guard_wipes: bool = True  # never wipe the last in-sync copy (see the module doc)
    # Seconds a diverge phase may wait for the cluster (the ISR to shrink to the leader,
    # a new leader to be elected) before it goes on regardless.
    phase_timeout: float = 15.0
    heal_timeout: float = 120.0


@dataclass(frozen=True)
class PlannedFault:
    at: float  # seconds after the nemesis started
    fault: str
    hold: float  # seconds the fault lasts (a wipe: its recovery time)
    pick: float  # [0, 1): which of the eligible targets (or partitions)

    def window(self, phase_timeout: float) -> float:
        """Seconds the plan reserves for it (a diverge holds twice and waits)."""
        return 2 * self.hold + phase_timeout if self.fault in EXCLUSIVE else self.hold


def plan(config: NemesisConfig, faults: list[str]) -> list[PlannedFault]:
    """The seeded schedule: start times `interval` apart, pushed later where
    `max_concurrent` windows (or an exclusive fault) would overlap; within time_limit."""
    rng = random.Random(config.seed)
    out: list[PlannedFault] = []
    if not faults:
        return out
    t = 0.0
    for _ in range(max(0, config.max_faults)):
        t += rng.uniform(*config.interval)
        fault = rng.choice(faults)
        entry = PlannedFault(t, fault, rng.uniform(*config.duration), rng.random())
        ends = sorted(e.at + e.window(config.phase_timeout) for e in out)
        if fault in EXCLUSIVE or any(
            e.fault in EXCLUSIVE for e in out if e.at + e.window(config.phase_timeout) > t
        ):
            t = max([t, *ends])
        else:
            active = [end for end in ends if end > t]
            if len(active) >= config.max_concurrent:
                t = active[len(active) - config.max_concurrent]
        if t >= config.time_limit:
            break
        out.append(PlannedFault(t, fault, entry.hold, entry.pick))
    return out


class Nemesis:
    def __init__(
        self, backend: Backend, history: History, config: NemesisConfig, bootstrap: str
    ) -> None:
        self.backend = backend
        self.history = history
        self.config = config
        self.bootstrap = bootstrap
        self.applied = 0
        self.skipped: list[str] = []
        self.max_concurrent_seen = 0
        self.schedule: list[PlannedFault] = []
        self._busy: dict[str, str] = {}  # node -> the fault on it
        self._active = 0  # faults applied and not yet over
        self._running = 0  # fault tasks started and not yet finished
        self._exclusive = False
        self._wiped: set[str] = set()  # wiped brokers not yet seen back in every ISR

    # -------------------------------------------------------------- schedule

    async def run(self, stop: asyncio.Event) -> None:
        """Inject the planned faults until done, time_limit or `stop`; always heal."""
        cfg = self.config
        started = time.monotonic()
        deadline = started + cfg.time_limit
        faults = []
        for fault in cfg.faults:
            reason = self.backend.unsupported(fault)
            if reason is None:
                faults.append(fault)
                continue
            log.warning("nemesis: skipping %s: %s", fault, reason)
            self.skipped.append(fault)
            self._record(fault, None, error=f"unsupported: {reason}")
        self.schedule = plan(cfg, faults)
        self.history.record(
            NEMESIS,
            INFO,
            "plan",
            extra={
                "seed": cfg.seed,
                "max_concurrent": cfg.max_concurrent,
                "faults": [
                    {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(e).items()}
                    for e in self.schedule
                ],
            },
        )
        tasks: set[asyncio.Task[None]] = set()
        changed = asyncio.Event()  # a fault ended: capacity may be free
        try:
            for entry in self.schedule:
                if await _wait(stop, started + entry.at - time.monotonic()):
                    break
                if not await self._until_room(entry, changed, stop, deadline):
                    break
                target = await self._target(entry)
                if target is None:
                    continue
                self._running += 1
                task = asyncio.get_running_loop().create_task(
                    self._one(entry, target, stop, deadline, changed),
                    name=f"nemesis-{entry.fault}-{target}",
                )
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:  # each recovers early once `stop` is set or time is up
                await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.heal()

    async def _until_room(
        self, entry: PlannedFault, changed: asyncio.Event, stop: asyncio.Event, deadline: float
    ) -> bool:
        """Wait until `entry` may start (False: stopped or out of time)."""
        while (
            self._running >= self.config.max_concurrent
            or self._exclusive
            or (entry.fault in EXCLUSIVE and self._running)
        ):
            changed.clear()
            left = deadline - time.monotonic()
            if stop.is_set() or left <= 0:
                return False
            stopping = asyncio.ensure_future(stop.wait())
            waiting = asyncio.ensure_future(changed.wait())
            try:
                await asyncio.wait(
                    {stopping, waiting}, timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                stopping.cancel()
                waiting.cancel()
        return not stop.is_set() and time.monotonic() < deadline

    async def _one(
        self,
        entry: PlannedFault,
        target: str,
        stop: asyncio.Event,
        deadline: float,
        changed: asyncio.Event,
    ) -> None:
        fault = entry.fault
        nodes = self.backend.nodes if fault in EXCLUSIVE else [target]
        for node in nodes:
            self._busy[node] = fault
        self._exclusive = fault in EXCLUSIVE
        try:
            if fault == "diverge":
                await self._diverge(entry, target, stop, deadline)
                return
            op = self.history.record(NEMESIS, INVOKE, fault, value=target)
            try:
                await getattr(self.backend, _ACTION[fault])(target)
            except (Unsupported, BackendError, OSError) as exc:
                log.warning("nemesis: %s %s failed: %s", fault, target, exc)
                self.history.record(NEMESIS, INFO, fault, value=target, error=str(exc)[:500])
                await self._recover(fault, target)
                return
            if fault == "wipe":
                self._wiped.add(target)
                if not self.config.guard_wipes:
                    await self._elect_stranded(target)
            self._applied(op.index, fault, target, entry.hold)
            try:
                # Recover early when the run is stopping or its time is up. A wiped
                # broker is left alone while it recovers.
                await _wait(stop, max(0.0, min(entry.hold, deadline - time.monotonic())))
                await self._recover(fault, target)
            finally:
                self._active -= 1
        finally:
            for node in nodes:
                self._busy.pop(node, None)
            self._exclusive = False
            self._running -= 1
            changed.set()

    def _applied(self, index: int, fault: str, target: str, hold: float) -> None:
        self.applied += 1
        self._active += 1
        self.max_concurrent_seen = max(self.max_concurrent_seen, self._active)
        log.info(
            "nemesis: %s %s (op %d), holding %.1fs, %d fault(s) active",
            fault,
            target,
            index,
            hold,
            self._active,
        )
        self.history.record(
            NEMESIS,
            INFO,
            fault,
            value=target,
            extra={"concurrent": self._active, "hold": round(hold, 3)},
        )

    async def _recover(self, fault: str, target: str) -> None:
        action = _RECOVERY.get(_ACTION.get(fault, ""))
        if action is not None:
            await self._act(action, target)

    async def _act(self, action: str, target: str) -> bool:
        """One recorded backend action (kill, start, pause, resume, reconnect); False
        when it failed (heal retries what must be undone)."""
        self.history.record(NEMESIS, INVOKE, action, value=target)
        try:
            await getattr(self.backend, action)(target)
        except (BackendError, OSError) as exc:
            log.warning("nemesis: %s %s failed (heal retries it): %s", action, target, exc)
            self.history.record(NEMESIS, INFO, action, value=target, error=str(exc)[:500])
            return False
        self.history.record(NEMESIS, INFO, action, value=target)
        return True

    # -------------------------------------------------------------- targets

    async def _target(self, entry: PlannedFault) -> str | None:
        """The node for `entry` among those free now (None: skipped, recorded)."""
        fault = entry.fault
        free = [b for b in (broker_name(i) for i in self.backend.broker_ids) if b not in self._busy]
        why = "every eligible node is under another fault"
        candidates: list[str] = []
        if fault in CONTROLLER_FAULTS:
            candidates, reason = await self._controller_targets(fault)
            why = reason or why
        elif fault == "kill-leader":
            partition = int(entry.pick * self.config.partitions)
            leader = await self._leader_of(partition)
            if leader is not None and broker_name(leader) in free:
                return broker_name(leader)
            log.info("nemesis: the leader of partition %d is unknown or busy", partition)
            candidates = free
        elif fault == "wipe":
            candidates, reason = await self._wipe_targets(free)
            why = reason or why
        elif fault == "diverge":
            return await self._diverge_target(entry)
        else:
            candidates = free
        if not candidates:
            self._record(fault, None, error=f"skipped: {why}")
            return None
        return candidates[min(int(entry.pick * len(candidates)), len(candidates) - 1)]

    async def _controller_targets(self, fault: str) -> tuple[list[str], str | None]:
        """The controllers `fault` may take now, or the reason there is none: a quorum
        keeps a majority free of faults."""
        nodes = self.backend.controller_nodes
        taken = [n for n in nodes if n in self._busy]
        if len(nodes) > 1 and len(taken) >= (len(nodes) - 1) // 2:
            return [], f"a minority of the controllers is under faults already ({taken})"
        free = [n for n in nodes if n not in self._busy]
        if fault != "kill-active-controller" or len(nodes) == 1:
            return free, None
        active = await self._active_controller()
        if active is None or active not in free:
            return [], f"the active controller is unknown or busy ({active})"
        return [active], None

    async def _active_controller(self) -> str | None:
        """The quorum leader's node per the controllers not under a fault."""
        nodes = self.backend.controller_nodes
        addresses = self.backend.controller_addresses()
        for node_id, (host, port) in addresses.items():
            node = controller_name(node_id, len(nodes))
            if node in self._busy:
                continue
            try:
                answer = await describe_quorum_at(
                    (host, port), "minibroker-chaos", 2.0, tls=self.backend.tls_context()
                )
            except (RpcError, OSError) as exc:
                log.info("nemesis: DescribeQuorum of %s failed: %s", node, exc)
                continue
            if answer.leader_id in addresses:
                return controller_name(answer.leader_id, len(nodes))
        return None

    async def _wipe_targets(self, free: list[str]) -> tuple[list[str], str | None]:
        """The brokers a wipe may take now, or the reason there is none."""
        if not self.config.guard_wipes:
            return free, None
        partitions = await self._describe()
        if partitions is None:
            return [], "cannot read the ISRs to guard the wipe"
        for node in sorted(self._wiped):
            node_id = broker_id(node)
            missing = [
                p.partition for p in partitions if node_id in p.replicas and node_id not in p.isr
            ]
            if missing:
                return [], f"{node} (wiped) is not back in the ISR of partition(s) {missing}"
            self._wiped.discard(node)
        ok = []
        for node in free:
            node_id = broker_id(node)
            if all(
                any(i != node_id and broker_name(i) not in self._busy for i in p.isr)
                for p in partitions
                if node_id in p.replicas
            ):
                ok.append(node)
        if not ok:
            return [], "no broker whose partitions all keep another in-sync replica"
        return ok, None

    async def _leader_of(self, partition: int) -> int | None:
        """The leader of `partition` per Metadata (None: unknown right now)."""
        for p in await self._describe() or ():
            if p.partition == partition and p.leader in self.backend.broker_ids:
                return p.leader
        return None

    async def _describe(self, via: list[int] | None = None) -> list[PartitionDescription] | None:
        """The topic's partitions per Metadata, asked of `via` (default: the brokers
        under no fault); None when no answer came."""
        if via is None:
            via = [i for i in self.backend.broker_ids if broker_name(i) not in self._busy]
        addresses = self.backend.broker_addresses()
        bootstrap = ",".join(f"{h}:{port}" for i, (h, port) in addresses.items() if i in via)
        try:
            async with asyncio.timeout(10):
                admin = AsyncAdmin(
                    bootstrap or self.bootstrap,
                    request_timeout_ms=5000,
                    bootstrap_retries=2,
                    **self.backend.client_options(),
                )
                try:
                    await admin.start()
                    (topic,) = await admin.describe_topics(
                        [self.config.topic], include_offsets=False
                    )
                finally:
                    await admin.close()
        except (MinibrokerError, TimeoutError, OSError, ValueError) as exc:
            log.info("nemesis: cannot describe %s: %s", self.config.topic, exc)
            return None
        return list(topic.partitions)

    async def _elect_stranded(self, wiped: str) -> None:
        """The operator's way back after an unguarded wipe took the last in-sync copy
        of partitions: an unclean election for those left with no leader and an empty
        ISR (recorded as `elect-unclean`)."""
        node_id = broker_id(wiped)
        partitions = await self._describe()
        stranded = [
            TopicPartition(self.config.topic, p.partition)
            for p in partitions or ()
            if p.leader < 0 and not p.isr and node_id in p.replicas
        ]
        if not stranded:
            return
        op = self.history.record(NEMESIS, INVOKE, "elect-unclean", value=wiped)
        error = None
        try:
            async with (
                asyncio.timeout(30),
                AsyncAdmin(self.bootstrap, **self.backend.client_options()) as admin,
            ):
                results = await admin.elect_leaders(stranded, unclean=True)
            failed = [f"{tp}: {r.error}" for tp, r in results.items() if r.error is not None]
            error = "; ".join(failed)[:500] or None
        except (MinibrokerError, TimeoutError, OSError) as exc:
            error = str(exc)[:500]
        log.info("nemesis: unclean election of %s (op %d): %s", stranded, op.index, error or "ok")
        self.history.record(
            NEMESIS,
            INFO,
            "elect-unclean",
            value=wiped,
            error=error,
            extra={"partitions": [tp.partition for tp in stranded]},
        )

    # -------------------------------------------------------------- diverge

    async def _diverge_target(self, entry: PlannedFault) -> str | None:
        partition = int(entry.pick * self.config.partitions)
        p = next((d for d in await self._describe() or () if d.partition == partition), None)
        if p is None or p.leader not in self.backend.broker_ids or len(p.replicas) < 2:
            self._record(
                "diverge",
                None,
                error=f"skipped: partition {partition} has no known leader with followers",
            )
            return None
        return broker_name(p.leader)

    async def _diverge(
        self, entry: PlannedFault, leader: str, stop: asyncio.Event, deadline: float
    ) -> None:
        partition = int(entry.pick * self.config.partitions)
        leader_id = broker_id(leader)
        assert leader_id is not None
        followers = [broker_name(i) for i in self.backend.broker_ids if i != leader_id]
        op = self.history.record(
            NEMESIS,
            INVOKE,
            "diverge",
            value=leader,
            extra={"partition": partition, "followers": followers},
        )
        self._applied(op.index, "diverge", leader, entry.hold)
        facts: dict[str, Any] = {"partition": partition}
        paused = [f for f in followers if await self._act("pause", f)]
        killed = False
        try:
            # 1. The followers fall out of the ISR; the leader writes alone.
            facts["leader-alone"] = await self._until(
                lambda ps: _isr_of(ps, partition) == (leader_id,), [leader_id], stop, deadline
            )
            await _wait(stop, max(0.0, min(entry.hold, deadline - time.monotonic())))
            if stop.is_set():
                return
            # 2. The leader dies; the out-of-sync followers come back and one leads.
            killed = await self._act("kill", leader)
            for f in paused:
                await self._act("resume", f)
            paused = []
            follower_ids = [broker_id(f) for f in followers]
            facts["new-leader"] = await self._until(
                lambda ps: _leader_of(ps, partition) in follower_ids,
                [i for i in follower_ids if i is not None],
                stop,
                deadline,
            )
            # 3. Writes on the new lineage before the old leader returns and truncates.
            await _wait(stop, max(0.0, min(entry.hold, deadline - time.monotonic())))
        finally:
            for f in paused:
                await self._act("resume", f)
            if killed:
                await self._act("start", leader)
            self._active -= 1
            self.history.record(NEMESIS, INFO, "diverge-end", value=leader, extra=facts)

    async def _until(
        self,
        condition: Callable[[list[PartitionDescription]], bool],
        via: list[int],
        stop: asyncio.Event,
        deadline: float,
    ) -> bool:
        """Poll Metadata (asked of `via`) until `condition`, phase_timeout at most."""
        until = min(deadline, time.monotonic() + self.config.phase_timeout)
        while not stop.is_set() and time.monotonic() < until:
            partitions = await self._describe(via)
            if partitions is not None and condition(partitions):
                return True
            await _wait(stop, 0.3)
        return False

    def _record(self, fault: str, target: str | None, *, error: str | None = None) -> None:
        self.history.record(NEMESIS, INVOKE, fault, value=target)
        self.history.record(NEMESIS, INFO, fault, value=target, error=error)

    # -------------------------------------------------------------- heal

    async def heal(self) -> None:
        """Reconnect, resume and start every node; wait until all are up. Errors are
        recorded, not raised (the run goes on to its final read and reports)."""
        self.history.record(NEMESIS, INVOKE, "heal")
        errors: list[str] = []
        try:
            async with asyncio.timeout(self.config.heal_timeout):
                for node in self.backend.nodes:
                    for action in ("reconnect", "resume"):
                        try:
                            await getattr(self.backend, action)(node)
                        except (BackendError, OSError) as exc:
                            errors.append(f"{action} {node}: {exc}")
                # The controller first: brokers register with it.
                for node in self.backend.nodes:
                    try:
                        await self.backend.start(node)
                    except (BackendError, OSError) as exc:
                        errors.append(f"start {node}: {exc}")
        except TimeoutError:
            errors.append(f"heal did not finish in {self.config.heal_timeout}s")
        for e in errors:
            log.error("nemesis: heal: %s", e)
        self.history.record(
            NEMESIS, INFO, "heal", error="; ".join(errors)[:1000] if errors else None
        )


def _isr_of(partitions: list[PartitionDescription], partition: int) -> tuple[int, ...] | None:
    return next((tuple(p.isr) for p in partitions if p.partition == partition), None)


def _leader_of(partitions: list[PartitionDescription], partition: int) -> int | None:
    return next((p.leader for p in partitions if p.partition == partition), None)


async def _wait(event: asyncio.Event, seconds: float) -> bool:
    """Sleep `seconds` or until `event` is set; True when it was set."""
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(max(0.0, seconds)):
            await event.wait()
    except TimeoutError:
        return False
    return True
