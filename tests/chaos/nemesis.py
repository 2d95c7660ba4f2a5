"""The nemesis: faults on a seeded random schedule, bounded in count and time, healed.

Faults (names for --faults):

    kill             SIGKILL a random broker; restart it after a while
    kill-leader      SIGKILL the leader of a random partition (asked with Metadata)
    kill-controller  SIGKILL the controller; restart it after a while
    pause            SIGSTOP a random node (docker pause); resume it after a while
    partition        cut a random broker off the network (docker network disconnect);
                     connect it again after a while (docker backend only)
    wipe             SIGKILL a random broker, delete its data, start it (KIP-903)

One fault at a time: apply, hold for a random duration, recover, then a quiet
interval. The seed fixes the choices (fault, target, durations); what the cluster does
meanwhile is not deterministic. A fault the backend cannot inject is dropped from the
mix at the start, its reason logged and recorded (`info` with an error). `heal()`
runs at the end whatever happened (reconnect, resume, restart everything) and waits
until every node is up.

History: the nemesis is process "nemesis"; each action is an `invoke` then an `info`
with the target as `value` (and `error` when it failed).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass

from client import AsyncAdmin
from client.errors import MinibrokerError

from .backends import CONTROLLER, Backend, BackendError, Unsupported, broker_name
from .history import INFO, INVOKE, NEMESIS, History

log = logging.getLogger(__name__)

FAULTS = ("kill", "kill-leader", "kill-controller", "pause", "partition", "wipe")
# A fault and how it is undone.
_RECOVERY = {
    "kill": "start",
    "kill-leader": "start",
    "kill-controller": "start",
    "pause": "resume",
    "partition": "reconnect",
}


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
    # seconds of calm before each fault, and how long a fault lasts
    interval: tuple[float, float] = (2.0, 5.0)
    duration: tuple[float, float] = (2.0, 6.0)
    heal_timeout: float = 120.0


class Nemesis:
    def __init__(
        self, backend: Backend, history: History, config: NemesisConfig, bootstrap: str
    ) -> None:
        self.backend = backend
        self.history = history
        self.config = config
        self.bootstrap = bootstrap
        self.rng = random.Random(config.seed)
        self.applied = 0
        self.skipped: list[str] = []

    # -------------------------------------------------------------- schedule

    async def run(self, stop: asyncio.Event) -> None:
        """Inject faults until max_faults, time_limit or `stop`; always heal."""
        cfg = self.config
        deadline = time.monotonic() + cfg.time_limit
        faults = []
        for fault in cfg.faults:
            reason = self.backend.unsupported(fault)
            if reason is None:
                faults.append(fault)
                continue
            log.warning("nemesis: skipping %s: %s", fault, reason)
            self.skipped.append(fault)
            self._record(fault, None, error=f"unsupported: {reason}")
        attempts = 0
        try:
            while faults and attempts < cfg.max_faults:
                calm = self.rng.uniform(*cfg.interval)
                if time.monotonic() + calm >= deadline or await _wait(stop, calm):
                    break
                fault = self.rng.choice(faults)
                hold = self.rng.uniform(*cfg.duration)
                attempts += 1
                await self._one(fault, hold, stop, deadline)
        finally:
            await self.heal()

    async def _one(self, fault: str, hold: float, stop: asyncio.Event, deadline: float) -> None:
        target = await self._target(fault)
        if target is None:
            return
        op = self.history.record(NEMESIS, INVOKE, fault, value=target)
        try:
            if fault in ("kill", "kill-leader", "kill-controller"):
                await self.backend.kill(target)
            elif fault == "pause":
                await self.backend.pause(target)
            elif fault == "partition":
                await self.backend.isolate(target)
            elif fault == "wipe":
                await self.backend.wipe(target)
            else:
                raise AssertionError(fault)
        except (Unsupported, BackendError, OSError) as exc:
            log.warning("nemesis: %s %s failed: %s", fault, target, exc)
            self.history.record(NEMESIS, INFO, fault, value=target, error=str(exc)[:500])
            await self._recover(fault, target)
            return
        self.applied += 1
        log.info("nemesis: %s %s (op %d), holding %.1fs", fault, target, op.index, hold)
        self.history.record(NEMESIS, INFO, fault, value=target)
        if fault in _RECOVERY:
            # Recover early when the run is stopping or its time is up.
            await _wait(stop, max(0.0, min(hold, deadline - time.monotonic())))
            await self._recover(fault, target)

    async def _recover(self, fault: str, target: str) -> None:
        action = _RECOVERY.get(fault)
        if action is None:
            return
        self.history.record(NEMESIS, INVOKE, action, value=target)
        try:
            await getattr(self.backend, action)(target)
        except (BackendError, OSError) as exc:
            log.warning("nemesis: %s %s failed (heal retries it): %s", action, target, exc)
            self.history.record(NEMESIS, INFO, action, value=target, error=str(exc)[:500])
            return
        self.history.record(NEMESIS, INFO, action, value=target)

    async def _target(self, fault: str) -> str | None:
        brokers = [broker_name(i) for i in self.backend.broker_ids]
        if fault == "kill-controller":
            return CONTROLLER
        if fault == "pause":
            return self.rng.choice([CONTROLLER, *brokers])
        if fault == "kill-leader":
            partition = self.rng.randrange(self.config.partitions)
            leader = await self._leader_of(partition)
            if leader is None:
                fallback = self.rng.choice(brokers)
                log.info(
                    "nemesis: partition %d has no known leader; killing %s instead",
                    partition,
                    fallback,
                )
                return fallback
            return broker_name(leader)
        return self.rng.choice(brokers)

    async def _leader_of(self, partition: int) -> int | None:
        """The leader of `partition` per Metadata (None: unknown right now)."""
        try:
            async with asyncio.timeout(10):
                admin = AsyncAdmin(self.bootstrap, request_timeout_ms=5000, bootstrap_retries=2)
                try:
                    await admin.start()
                    (topic,) = await admin.describe_topics(
                        [self.config.topic], include_offsets=False
                    )
                finally:
                    await admin.close()
        except (MinibrokerError, TimeoutError, OSError) as exc:
            log.info("nemesis: cannot ask for the leader of partition %d: %s", partition, exc)
            return None
        for p in topic.partitions:
            if p.partition == partition and p.leader in self.backend.broker_ids:
                return p.leader
        return None

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
