"""Incremental fetch sessions on the leader (KIP-227), for followers.

Without a session a follower names every partition it follows from us in every Fetch,
and the leader answers every one of them, news or not: with thousands of idle
partitions that is most of an idle broker's CPU (the request and answer are encoded,
decoded and walked partition by partition twice a second per follower).

With a session the leader remembers, per follower, each partition's last stated fetch
position (`FetchPartition`) and what its last answer told about it (high watermark,
log start). The follower's requests then carry only the partitions whose position
changed, plus the ones leaving the session (`forgotten`); the leader answers only
the partitions with news: records, an error, a diverging epoch, a high watermark or
log start that moved (these last two do not end a wait: `urgent`). Which partitions
may have news is known without looking at the others: every change of a partition
here (append, high watermark, log start, role or epoch: `ReplicaManager._notify`)
marks it in each session holding it (`touch`), and a waiting session fetch wakes on
that mark, unless all that moved is the high watermark that a follower's own fetch
advanced (news that ends no wait: it goes out with the next answer).

Request shapes (session_id, session_epoch), as in Kafka:

- (0, -1): sessionless full fetch, what a peer that predates sessions sends;
- (0 or S, 0): full fetch that opens a new session (closing S, its own old one);
  the answer carries the new id, or 0 when no session could be made (the cache is
  full, or sessions are turned off with max.incremental.fetch.session.cache.slots 0);
- (S, -1): close S, then a sessionless full fetch;
- (S, n > 0): incremental; n must be the session's next epoch, else
  INVALID_FETCH_SESSION_EPOCH; an unknown S (or one of another follower) is
  FETCH_SESSION_ID_NOT_FOUND. Either way the follower opens a new session.

Bounds: at most `max_incremental_fetch_session_cache_slots` sessions; a follower has
one (its new session replaces its older one); when full, the least recently used
session idle for `min_incremental_fetch_session_eviction_ms` makes room, else the
fetch is served sessionless. A session holds at most the partitions this broker has
(a partition it does not know is answered once and not kept).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from collections.abc import Iterable
from dataclasses import dataclass

from broker.metadata_image import TopicPartition
from protocol.errors import ErrorCode
from protocol.invariants import invariant
from protocol.messages import FetchPartition
from protocol.messages import FetchPartitionResponse
from protocol.messages import FetchRequest

FINAL_EPOCH = -1  # no session: a sessionless full fetch (closes the one named)
INITIAL_EPOCH = 0  # a full fetch that opens a session
NO_SESSION = 0
MAX_SESSION_ID = 2**31 - 1


def next_epoch(epoch: int) -> int:
    """The epoch after `epoch`; past the int32 range it wraps to 1 (0 opens)."""
    return 1 if epoch >= MAX_SESSION_ID else epoch + 1


@dataclass(slots=True)
class SessionPartition:
    """One partition of a session: the follower's last stated position, and what the
    last answer told it."""

    fetch: FetchPartition
    sent_high_watermark: int = -1
    sent_log_start: int = -1


class FetchSession:
    """One follower's session: its partitions, and the ones that may have news."""

    def __init__(self, session_id: int, replica_id: int) -> None:
        self.id = session_id
        self.replica_id = replica_id
        self.next_epoch = 1
        self.partitions: dict[TopicPartition, SessionPartition] = {}
        # Marked by `touch` (and by the follower's own changes); ordered, so a
        # partition answered with records goes to the back (fairness under max_bytes).
        self.dirty: dict[TopicPartition, None] = {}
        self.wake = asyncio.Event()
        self.last_used = time.monotonic()
        self.last_request_ms = 0  # mono_ms() at the start of its latest fetch
        self.in_use = False  # a fetch of this session is being served

    def news(self, tp: TopicPartition, r: FetchPartitionResponse) -> bool:
        """Whether the answer `r` for `tp` tells the follower anything it was not told."""
        entry = self.partitions[tp]
        return bool(
            urgent(r)
            or r.high_watermark != entry.sent_high_watermark
            or r.log_start_offset != entry.sent_log_start
        )

    def sent(self, tp: TopicPartition, r: FetchPartitionResponse) -> None:
        """`r` went out: what it told about `tp` is no longer news."""
        entry = self.partitions.get(tp)
        if entry is not None:  # forgotten while the fetch waited
            entry.sent_high_watermark = r.high_watermark
            entry.sent_log_start = r.log_start_offset


def urgent(r: FetchPartitionResponse) -> bool:
    """News that answers a waiting fetch at once: records, an error or a diverging
    epoch. A high watermark or log start that moved waits for the next answer, as in
    Kafka, where a follower's fetch completes on bytes (min_bytes 1), not on those:
    answering at once would cost each acks=all write a second round trip per follower
    (the follower's fetch that moves the high watermark would come straight back)."""
    return bool(
        r.records
        or r.error_code
        or r.diverging_epoch.epoch >= 0
        or r.diverging_epoch.end_offset >= 0
    )


class FetchSessionCache:
    """The leader's sessions (one per follower), by id and by partition."""

    def __init__(
        self,
        *,
        max_slots: int,
        eviction_ms: int,
        still_caught_up: Callable[[int, TopicPartition, int], None] = lambda *_: None,
    ) -> None:
        """`still_caught_up(replica_id, tp, ms)`: the follower was at the LEO of `tp`
        at `ms` (the start of its session's latest fetch)."""
        self._still_caught_up = still_caught_up
        self.max_slots = max_slots
        self.eviction_s = eviction_ms / 1000
        self.sessions: dict[int, FetchSession] = {}
        self._by_replica: dict[int, FetchSession] = {}
        self._by_partition: dict[TopicPartition, dict[int, FetchSession]] = {}

    def __len__(self) -> int:
        return len(self.sessions)

    def touch(self, tp: TopicPartition, *, wake: bool = True) -> None:
        """Something about `tp` changed here: each session holding it looks again, at
        once (`wake`) or, for news that answers no waiting fetch (a high watermark that
        moved: not `urgent`), with its next pass: waking a waiting fetch for it was a
        pass over the session that found nothing to send, twice per acks=all write
        with RF 3 (the other follower's waiting fetch, and the fetch that moved it,
        which waits too).

        Kafka's leader reads every session partition on every fetch, and each read
        of a caught-up follower dates its last catch-up to that fetch; ours skips
        unmarked partitions, so their catch-up is dated here, when they change:
        unmarked means the follower was at our LEO and in the ISR at every fetch of
        its session since it was last looked at, the latest included."""
        holders = self._by_partition.get(tp)
        if holders:
            for session in holders.values():
                if tp not in session.dirty:
                    self._still_caught_up(session.replica_id, tp, session.last_request_ms)
                    session.dirty[tp] = None
                if wake:
                    session.wake.set()

    # ------------------------------------------------------------------ lookups

    def lookup(self, request: FetchRequest) -> FetchSession | ErrorCode:
        """The session an incremental request continues, or why it cannot."""
        session = self.sessions.get(request.session_id)
        if session is None or session.replica_id != request.replica_id:
            return ErrorCode.FETCH_SESSION_ID_NOT_FOUND
        if session.in_use or request.session_epoch != session.next_epoch:
            return ErrorCode.INVALID_FETCH_SESSION_EPOCH
        return session

    # ------------------------------------------------------------------ lifecycle

    def close(self, session_id: int, replica_id: int) -> None:
        """Close the follower's own session `session_id` (another's is left alone: the
        replica id of a request is only what it claims)."""
        session = self.sessions.get(session_id)
        if session is not None and session.replica_id == replica_id:
            self._remove(session)

    def open(self, replica_id: int) -> FetchSession | None:
        """A new, empty session for `replica_id` (replacing its older one), or None
        when there is no room."""
        old = self._by_replica.get(replica_id)
        if old is not None:
            self._remove(old)
        if len(self.sessions) >= self.max_slots and not self._evict_one():
            return None
        session_id = random.randint(1, MAX_SESSION_ID)
        while session_id in self.sessions:
            session_id = random.randint(1, MAX_SESSION_ID)
        session = FetchSession(session_id, replica_id)
        self.sessions[session_id] = session
        self._by_replica[replica_id] = session
        return session

    def _evict_one(self) -> bool:
        now = time.monotonic()
        idle = [
            s
            for s in self.sessions.values()
            if not s.in_use and now - s.last_used >= self.eviction_s
        ]
        if not idle:
            return False
        self._remove(min(idle, key=lambda s: s.last_used))
        return True

    def _remove(self, session: FetchSession) -> None:
        self.forget(session, list(session.partitions))
        del self.sessions[session.id]
        if self._by_replica.get(session.replica_id) is session:
            del self._by_replica[session.replica_id]
        session.wake.set()  # a fetch still waiting on it answers now

    def clear(self) -> None:
        for session in list(self.sessions.values()):
            self._remove(session)

    # ------------------------------------------------------------------ partitions

    def update(
        self,
        session: FetchSession,
        topics: Iterable[tuple[str, FetchPartition]],
        known: Callable[[TopicPartition], bool],
    ) -> list[tuple[str, FetchPartition]]:
        """The follower states these positions: remember them; each may have news. A
        partition that is not `known` here is not kept (a session holds at most this
        broker's partitions, whatever a peer names): it is returned, to be answered
        once (with its error), and the follower names it again after its backoff."""
        unknown: list[tuple[str, FetchPartition]] = []
        for topic, fp in topics:
            tp = (topic, fp.partition)
            if not known(tp):
                self.forget(session, (tp,))
                unknown.append((topic, fp))
                continue
            entry = session.partitions.get(tp)
            if entry is None:
                session.partitions[tp] = SessionPartition(fp)
                self._by_partition.setdefault(tp, {})[session.id] = session
            else:
                entry.fetch = fp
            session.dirty[tp] = None
        return unknown

    def forget(self, session: FetchSession, tps: Iterable[TopicPartition]) -> None:
        for tp in tps:
            if session.partitions.pop(tp, None) is None:
                continue
            session.dirty.pop(tp, None)
            holders = self._by_partition.get(tp)
            if holders is not None:
                holders.pop(session.id, None)
                if not holders:
                    del self._by_partition[tp]
        # O(1): a forget runs per unknown partition of a request, which a peer chooses.
        invariant(
            len(session.dirty) <= len(session.partitions),
            lambda: f"fetch session {session.id}: more partitions marked than it holds",
        )
