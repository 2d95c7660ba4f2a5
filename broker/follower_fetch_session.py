"""The follower's side of an incremental fetch session (KIP-227; Kafka's
FetchSessionHandler). The leader's side, and the request shapes, are in
broker/fetch_sessions.py.

The follower keeps what the leader holds of each partition (the position it last
stated), so that a request names only the partitions whose position changed and the
ones that leave the session. A full request (epoch 0) opens a session; an answer with
session id 0 means the leader keeps none (a leader that predates sessions, or one
whose cache is full): every request stays full. Any doubt about what the leader
holds (a failed or timed-out request, FETCH_SESSION_ID_NOT_FOUND,
INVALID_FETCH_SESSION_EPOCH) starts over with a full request that also closes the
old session.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker.fetch_sessions import INITIAL_EPOCH
from broker.fetch_sessions import NO_SESSION
from broker.fetch_sessions import next_epoch
from broker.metadata_image import TopicPartition
from protocol.invariants import invariant
from protocol.messages import FetchPartition
from protocol.messages import FetchTopic
from protocol.messages import ForgottenTopic


@dataclass(frozen=True, slots=True)
class SessionRequest:
    """The session part of one Fetch: its id and epoch, the partitions to state and
    the ones to forget."""

    session_id: int
    session_epoch: int
    topics: list[FetchTopic]
    forgotten: list[ForgottenTopic]

    @property
    def full(self) -> bool:
        return self.session_epoch == INITIAL_EPOCH


def _by_topic(parts: dict[TopicPartition, FetchPartition]) -> list[FetchTopic]:
    topics: dict[str, list[FetchPartition]] = {}
    for (topic, _), fp in parts.items():
        topics.setdefault(topic, []).append(fp)
    return [FetchTopic(topic=t, partitions=ps) for t, ps in topics.items()]


class FollowerFetchSession:
    """One fetcher's session with one leader. The fetcher keeps `wanted` current with
    `set` and `drop` as its partitions move (nothing is looked at per request but the
    partitions that changed)."""

    def __init__(self) -> None:
        self.session_id = NO_SESSION
        self.epoch = INITIAL_EPOCH
        self.wanted: dict[TopicPartition, FetchPartition] = {}  # what it should hold
        # The positions of the last answered request: what the leader read from (and,
        # in a session, what it holds).
        self.sent: dict[TopicPartition, FetchPartition] = {}
        self._changed: dict[TopicPartition, None] = {}  # in `wanted` since the last request
        self._in_flight: dict[TopicPartition, FetchPartition | None] | None = None
        self._in_flight_full = False

    @property
    def incremental(self) -> bool:
        return self.session_id != NO_SESSION and self.epoch != INITIAL_EPOCH

    def set(self, tp: TopicPartition, position: FetchPartition) -> None:
        self.wanted[tp] = position
        self._changed[tp] = None

    def drop(self, tp: TopicPartition) -> None:
        if self.wanted.pop(tp, None) is not None or tp in self.sent:
            self._changed[tp] = None

    def request(self) -> SessionRequest:
        """The next request: every wanted partition when full, else what changed."""
        changed, self._changed = self._changed, {}
        if not self.incremental:
            # Full: names everything; carries the old id so the leader closes it.
            self._in_flight, self._in_flight_full = dict(self.wanted), True
            return SessionRequest(self.session_id, INITIAL_EPOCH, _by_topic(self.wanted), [])
        sent = self.sent
        delta: dict[TopicPartition, FetchPartition | None] = {}
        for tp in changed:
            position = self.wanted.get(tp)
            if position is None:
                if tp in sent:
                    delta[tp] = None
            elif sent.get(tp) != position:
                delta[tp] = position
        self._in_flight, self._in_flight_full = delta, False
        stated = {tp: fp for tp, fp in delta.items() if fp is not None}
        gone: dict[str, list[int]] = {}
        for tp, position in delta.items():
            if position is None:
                gone.setdefault(tp[0], []).append(tp[1])
        return SessionRequest(
            self.session_id,
            self.epoch,
            _by_topic(stated),
            [ForgottenTopic(topic=t, partitions=ps) for t, ps in gone.items()],
        )

    def answered(self, session_id: int) -> dict[TopicPartition, FetchPartition]:
        """The leader answered the last request (no top-level error) with `session_id`;
        returns the positions it read from."""
        delta, self._in_flight = self._in_flight, None
        invariant(delta is not None, "a fetch answer without a request in flight")
        assert delta is not None
        if self._in_flight_full:
            self.sent = {tp: fp for tp, fp in delta.items() if fp is not None}
        else:
            for tp, position in delta.items():
                if position is None:
                    self.sent.pop(tp, None)
                else:
                    self.sent[tp] = position
        if session_id == NO_SESSION:
            # No session kept: the next request is full again (and may open one).
            self.session_id, self.epoch = NO_SESSION, INITIAL_EPOCH
        elif self.incremental and session_id != self.session_id:
            self.reset()  # not the session we continued: start over rather than guess
        else:
            self.session_id = session_id
            self.epoch = next_epoch(self.epoch)
        return self.sent

    def unsend(self, tp: TopicPartition) -> None:
        """The leader answered `tp` with an error: it may not hold it (a partition it
        does not know is not kept in the session), so it is stated again whenever it
        is wanted next, even at the same position."""
        self.sent.pop(tp, None)

    def reset(self) -> None:
        """What the leader holds is unknown: the next request is full (it names every
        wanted partition), closing the current session."""
        self._in_flight = None
        self._changed = {}
        self.epoch = INITIAL_EPOCH
