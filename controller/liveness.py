"""Broker sessions: who heartbeated when, and whose session ran out.

One deadline per broker (bounded by the number of registered brokers) and one
periodic check in the controller, never a timer per broker. The clock is injected so
tests can drive it; the controller uses `time.monotonic`.

A restarted controller gives every broker its replayed log calls unfenced a fresh
session (`touch_all`), so that its own downtime fences nobody; such a session says
nothing about the broker being alive. `heard_from` tells the brokers that registered
or heartbeated to THIS process within their session: only those get new replicas.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

Clock = Callable[[], float]


class BrokerSessions:
    def __init__(self, session_timeout_s: float, clock: Clock = time.monotonic) -> None:
        self.session_timeout_s = session_timeout_s
        self.clock = clock
        # broker id -> (broker epoch, deadline, heard from by this process). The epoch
        # keeps a stale incarnation's heartbeat from extending its successor's session.
        self._sessions: dict[int, tuple[int, float, bool]] = {}

    def touch(self, broker_id: int, broker_epoch: int) -> None:
        """The broker registered or heartbeated just now."""
        self._sessions[broker_id] = (broker_epoch, self.clock() + self.session_timeout_s, True)

    def touch_all(self, brokers: Iterable[tuple[int, int]]) -> None:
        """A fresh session for each (id, epoch): the controller just started, so a
        broker's silence so far says nothing about it (nor does it prove it alive)."""
        deadline = self.clock() + self.session_timeout_s
        for broker_id, broker_epoch in brokers:
            self._sessions[broker_id] = (broker_epoch, deadline, False)

    def heard_from(self, broker_id: int, broker_epoch: int) -> bool:
        """This incarnation registered or heartbeated to this process, and its session
        has not run out since."""
        session = self._sessions.get(broker_id)
        return (
            session is not None
            and session[0] == broker_epoch
            and session[2]
            and session[1] > self.clock()
        )

    def forget(self, broker_id: int) -> None:
        self._sessions.pop(broker_id, None)

    def has_valid_session(self, broker_id: int, broker_epoch: int) -> bool:
        session = self._sessions.get(broker_id)
        return session is not None and session[0] == broker_epoch and session[1] > self.clock()

    def expired(self, candidates: Iterable[tuple[int, int]]) -> list[int]:
        """Which of the (id, epoch) pairs (the unfenced brokers) have no valid session."""
        now = self.clock()
        out = []
        for broker_id, broker_epoch in candidates:
            session = self._sessions.get(broker_id)
            if session is None or session[0] != broker_epoch or session[1] <= now:
                out.append(broker_id)
        return sorted(out)
