"""Broker sessions: who heartbeated when, and whose session ran out.

One deadline per broker (bounded by the number of registered brokers) and one
periodic check in the controller, never a timer per broker. The clock is injected so
tests can drive it; the controller uses `time.monotonic`.

A restarted controller gives every broker its replayed log calls unfenced a fresh
session (`touch_all`), so that its own downtime fences nobody; such a session says
nothing about the broker being alive. `heard_from` tells the brokers that registered
or heartbeated to THIS process within their session: only those get new replicas.

**A controller stall fences nobody.** A session measures how long the controller,
while running, heard nothing from a broker. When the controller itself does not run
(SIGSTOP, a frozen VM, a GC-like pause, a blocked event loop, the metadata writer
held by a slow fsync), the brokers' heartbeats wait unread in its sockets, and the
first liveness check after the stall would otherwise find every session run out and
fence every broker at once (issue 13: with a wiped leader restarting meanwhile, that
lost all acknowledged records of its partitions). The rule, in `observe`:

- The controller notes the time every `check_interval_s` (the liveness loop) and at
  every expiry decision (`expired`). Two notes more than `stall_threshold_s` apart
  mean the controller stalled in between.
- After a stall, every session that was still valid when the stall began gets a
  fresh session (deadline now + session timeout), as a controller restart gives
  (`touch_all`); the check that follows fences nobody, and the heartbeats queued
  during the stall are read long before the fresh session could run out. A broker
  not heard from during the gap is no longer `heard_from`: the stall says nothing
  about it.
- Bounded: a session gets such a fresh session at most once per contact (registration
  or heartbeat). A further stall before the broker is heard from again moves its
  deadline only by the stall minus one check interval, so every stall still spends
  at least one check interval of the session. A broker that died before or during
  the stalls sends nothing afterwards and is fenced at the latest once the controller
  has run a session timeout after the first stall, each later stall counting as one
  check interval: however often the controller stalls, within
  session_timeout / check_interval + 1 stalls.

Kafka's KRaft controller reaches the same end by other means: heartbeats update the
brokers' contact times as they arrive, outside the controller's event queue
(KAFKA-17793; here `broker_heartbeat` touches the session before waiting for the
writer), and a controller that stops answering loses its quorum leadership, and the
next active controller starts every broker with a fresh contact time (KAFKA-18138).
With a single controller there is no successor, so the stall is detected here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from collections.abc import Iterable
from dataclasses import dataclass

log = logging.getLogger(__name__)

Clock = Callable[[], float]


def check_interval_for(session_timeout_s: float) -> float:
    """How often the liveness loop runs: a few times per session, at most every 0.5 s."""
    return min(0.5, max(0.02, session_timeout_s / 8))


@dataclass(slots=True)
class _Session:
    # The epoch keeps a stale incarnation's heartbeat from extending its successor's.
    broker_epoch: int
    deadline: float
    # When this process last heard from the broker (registration or heartbeat); None
    # when the session was granted (controller restart or stall), not earned.
    last_contact: float | None
    # Renewed after a controller stall since the last contact (allowed once).
    renewed_after_stall: bool = False


class BrokerSessions:
    def __init__(self, session_timeout_s: float, clock: Clock = time.monotonic) -> None:
        self.session_timeout_s = session_timeout_s
        self.clock = clock
        self.check_interval_s = check_interval_for(session_timeout_s)
        # Notes further apart than this are a controller stall: twice the check
        # interval, and never less than a quarter of the session.
        self.stall_threshold_s = max(2 * self.check_interval_s, session_timeout_s / 4)
        self._sessions: dict[int, _Session] = {}
        self._observed_at = clock()  # created as the controller starts
        self.stalls = 0

    def touch(self, broker_id: int, broker_epoch: int) -> None:
        """The broker registered or heartbeated just now."""
        now = self.clock()
        self._sessions[broker_id] = _Session(broker_epoch, now + self.session_timeout_s, now)

    def touch_all(self, brokers: Iterable[tuple[int, int]]) -> None:
        """A fresh session for each (id, epoch): the controller just started, so a
        broker's silence so far says nothing about it (nor does it prove it alive)."""
        deadline = self.clock() + self.session_timeout_s
        for broker_id, broker_epoch in brokers:
            self._sessions[broker_id] = _Session(broker_epoch, deadline, None)

    def observe(self) -> float:
        """Note that the controller runs now. If it did not run for longer than
        `stall_threshold_s` since the previous note, apply the stall rule (module doc)
        and return the length of the stall; else return 0."""
        now = self.clock()
        began = self._observed_at
        self._observed_at = now
        if now - began <= self.stall_threshold_s:
            return 0.0
        stall = now - began
        unseen = stall - self.check_interval_s
        renewed: list[int] = []
        moved: list[int] = []
        for broker_id, session in self._sessions.items():
            if session.deadline <= began:
                continue  # had run out before the stall: its check was due
            if session.renewed_after_stall:  # and not heard from since
                session.deadline += unseen
                moved.append(broker_id)
                continue
            session.deadline = max(session.deadline, now + self.session_timeout_s)
            session.renewed_after_stall = True
            if session.last_contact is None or session.last_contact <= began:
                session.last_contact = None  # nothing heard meanwhile: proves nothing
            renewed.append(broker_id)
        self.stalls += 1
        log.warning(
            "the controller did not run for %.1f s (stalled: paused, blocked or starved; "
            "liveness checked every %.2f s); that time does not count against the brokers: "
            "fresh sessions for brokers %s%s, so nobody is fenced before the heartbeats that "
            "waited meanwhile are read",
            stall,
            self.check_interval_s,
            sorted(renewed),
            f", deadlines of brokers {sorted(moved)} (not heard from since an earlier stall) "
            f"moved by {unseen:.1f} s"
            if moved
            else "",
        )
        return stall

    def heard_from(self, broker_id: int, broker_epoch: int) -> bool:
        """This incarnation registered or heartbeated to this process, and its session
        has not run out since (nor been renewed by a restart or a stall)."""
        session = self._sessions.get(broker_id)
        return (
            session is not None
            and session.broker_epoch == broker_epoch
            and session.last_contact is not None
            and session.deadline > self.clock()
        )

    def forget(self, broker_id: int) -> None:
        self._sessions.pop(broker_id, None)

    def has_valid_session(self, broker_id: int, broker_epoch: int) -> bool:
        session = self._sessions.get(broker_id)
        return (
            session is not None
            and session.broker_epoch == broker_epoch
            and session.deadline > self.clock()
        )

    def expired(self, candidates: Iterable[tuple[int, int]]) -> list[int]:
        """Which of the (id, epoch) pairs (the unfenced brokers) have no valid session.
        Notes the time first: a decision right after a stall sees the stall."""
        self.observe()
        now = self.clock()
        out = []
        for broker_id, broker_epoch in candidates:
            session = self._sessions.get(broker_id)
            if session is None or session.broker_epoch != broker_epoch or session.deadline <= now:
                out.append(broker_id)
        return sorted(out)
