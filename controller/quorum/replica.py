"""One voter of the controller quorum (KIP-595, Kafka's KafkaRaftClient), sans-I/O.

Bytes, sockets, files and clocks stay with the driver; this class is fed events and
says what to send:

- `tick(now)`: timers (a follower that has not heard from its leader for the fetch
  timeout stands for election; a leader that has not heard from a majority for it
  resigns: check-quorum);
- `handle_request(src, request, now) -> response` for Vote, BeginQuorumEpoch,
  EndQuorumEpoch, QuorumFetch and FetchSnapshot;
- `handle_response(dst, request, response, now)` and `request_failed(dst, request, now)`
  for the requests it asked to send, which it puts in `outbox` as (node, request);
- `append(records, now)` on the leader, `flushed(point, now)` when the driver made the
  log durable, `compact(snapshot)` when the application took a snapshot, `resign(now)`
  on graceful shutdown.

The election (one vote per epoch, persisted before it is granted; a vote only for a
log at least as up to date; a pre-vote first, KIP-996, so that a voter cut off from
the others cannot raise the epoch and depose a healthy leader when it returns) and the
replication (followers fetch with their last fetched epoch, a diverging one truncates
to the largest common epoch by the brokers' rule, runtime/epoch_lineage.py; an entry
is committed once a majority has it durably and the leader has committed one of its
own epoch) follow Raft as KRaft runs it.

`save_state` must make the quorum state durable before it returns: the vote it
records is then answered. Every decision on what is committed is asserted (kept under
python -O): the high watermark never goes back and never passes a durable majority.
"""

from __future__ import annotations

import enum
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from controller.quorum.quorum_log import QuorumLog
from controller.quorum.quorum_log import Snapshot
from protocol.errors import ErrorCode
from protocol.invariants import InvariantError
from protocol.messages.client_apis import Message
from protocol.messages.quorum_apis import BeginQuorumEpochRequest
from protocol.messages.quorum_apis import BeginQuorumEpochResponse
from protocol.messages.quorum_apis import EndQuorumEpochRequest
from protocol.messages.quorum_apis import EndQuorumEpochResponse
from protocol.messages.quorum_apis import FetchSnapshotRequest
from protocol.messages.quorum_apis import FetchSnapshotResponse
from protocol.messages.quorum_apis import MetadataEntry
from protocol.messages.quorum_apis import QuorumFetchRequest
from protocol.messages.quorum_apis import QuorumFetchResponse
from protocol.messages.quorum_apis import SnapshotId
from protocol.messages.quorum_apis import VoteRequest
from protocol.messages.quorum_apis import VoteResponse
from protocol.messages.quorum_apis import as_change
from protocol.metadata_records import LeaderChangeRecord
from runtime.epoch_lineage import OUT_OF_RANGE
from runtime.epoch_lineage import UNDEFINED_EPOCH
from runtime.epoch_lineage import diverging_epoch
from runtime.epoch_lineage import offset_truncation_state

log = logging.getLogger(__name__)

# `voted_for` of an epoch in which a voter that lost its quorum state may have voted
# before: no candidate matches it, so it votes for none in that epoch.
FORGOTTEN_VOTE = -2


class QuorumState(msgspec.Struct, frozen=True, kw_only=True):
    """What a voter must never forget (controller/quorum/quorum_state.py keeps it on
    disk): its epoch, whom it voted for in it, the leader it knows in it, and whether
    its log ever held durable entries (set before the first is reported or counted,
    so that a voter whose log is later lost knows it: voting_rights.py)."""

    epoch: int = 0
    voted_for: int = -1
    leader_id: int = -1
    held_entries: bool = False
    # It started without the right to vote (voting_rights.py) and has not caught up
    # yet: kept across restarts, so that a restart does not give the vote back.
    catching_up: bool = False


class Role(enum.Enum):
    UNATTACHED = "unattached"  # knows an epoch, no leader in it (yet)
    FOLLOWER = "follower"
    PROSPECTIVE = "prospective"  # asking for pre-votes
    CANDIDATE = "candidate"  # asking for votes, in an epoch of its own
    LEADER = "leader"


@dataclass(frozen=True)
class QuorumSettings:
    # Kafka's controller.quorum.fetch.timeout.ms (Kafka: 2 s; here 1 s, for a failover
    # within 2 s): a follower that has not fetched from its leader for this long
    # stands for election; a leader not fetched from by a majority for this long
    # resigns. A healthy leader answers a fetch within the long poll (0.4 s).
    fetch_timeout_ms: float = 1_000
    # controller.quorum.election.timeout.ms (Kafka: 1 s): an election round lasts a
    # random time between this and twice this.
    election_timeout_ms: float = 500
    # controller.quorum.election.backoff.max.ms (Kafka: 1 s): a lost round waits up
    # to this long.
    election_backoff_max_ms: float = 500
    fetch_max_entries: int = 10_000
    # A follower's next fetch after an empty answer. 0 for the real driver, whose
    # leader long-polls; the simulation, whose answers come at once, sets a pause.
    idle_fetch_backoff_ms: float = 0
    # The leader re-sends BeginQuorumEpoch this often to voters that have not fetched.
    begin_epoch_resend_ms: float = 500


@dataclass
class VoterProgress:
    """What the leader knows of one voter."""

    end_offset: int = -1  # durable on the voter (its fetch offset)
    last_fetch_ms: float = float("-inf")


class QuorumReplica:
    def __init__(
        self,
        node_id: int,
        voters: tuple[int, ...],
        *,
        cluster_id: str,
        log: QuorumLog,
        state: QuorumState,
        save_state: Callable[[QuorumState], None],
        settings: QuorumSettings,
        rng: random.Random,
        now: float,
        may_vote: bool = True,
    ) -> None:
        if node_id not in voters or len(set(voters)) != len(voters):
            raise ValueError(f"node {node_id} must be one of the distinct voters {voters}")
        self.node_id = node_id
        self.voters = tuple(sorted(voters))
        self.majority = len(self.voters) // 2 + 1
        self.cluster_id = cluster_id
        self.log = log
        self.settings = settings
        self._save = save_state
        self._rng = rng
        self.state = state
        self.high_watermark = log.start_offset  # the snapshot is committed
        # False for a voter that lost its disk: it neither votes nor stands until it has
        # caught up with a leader (it may have voted before, in epochs it forgot).
        self.may_vote = may_vote
        if not may_vote and not state.catching_up:
            self.state = msgspec.structs.replace(state, catching_up=True)
            self._save(self.state)  # durable before the voter answers anyone
        self._catch_up_target: int | None = None
        self.outbox: list[tuple[int, Message]] = []
        self.role = Role.UNATTACHED
        self._deadline = now
        self._granted: set[int] = set()
        self._progress: dict[int, VoterProgress] = {}
        self._fetching = False  # a follower's fetch (or snapshot fetch) is in flight
        self._next_fetch_ms = now
        # When we last heard from which leader (not merely of it): only a leader heard
        # from within the fetch timeout is named as alive to others.
        self._last_leader_contact: tuple[int, float] = (-1, float("-inf"))
        self._begin_sent_ms: dict[int, float] = {}
        if state.leader_id == node_id:
            # We led this epoch before a restart: we cannot know what we acknowledged
            # as leader, so we do not lead it again; a new election decides.
            self._become_unattached(now)
        elif state.leader_id >= 0:
            self._become_follower(state.leader_id, now)
        else:
            self._become_unattached(now)
        if log.flushed_end > 0:
            self._note_held_entries()  # a state written before the mark existed
        if len(self.voters) == 1:
            self._deadline = now  # a quorum of one elects itself at its first tick
            # ... and everything on its disk was committed (it was the only copy that
            # had to be durable).
            self.high_watermark = log.end_offset

    # ------------------------------------------------------------------ views

    @property
    def epoch(self) -> int:
        return self.state.epoch

    @property
    def leader_id(self) -> int:
        return self.state.leader_id

    @property
    def is_leader(self) -> bool:
        return self.role is Role.LEADER

    def progress(self) -> dict[int, VoterProgress]:
        """The leader's view of each voter (for DescribeQuorum)."""
        return dict(self._progress)

    # ------------------------------------------------------------------ state changes

    def _persist(self, epoch: int, voted_for: int, leader_id: int) -> None:
        new = msgspec.structs.replace(
            self.state, epoch=epoch, voted_for=voted_for, leader_id=leader_id
        )
        if new.epoch < self.state.epoch:
            raise InvariantError(f"quorum epoch going back: {self.state} -> {new}")
        if new != self.state:
            self._save(new)  # durable before anything depends on it
            self.state = new

    def allow_voting(self, floor_epoch: int, now: float) -> None:
        """Let a voter that started without the right to vote (voting_rights.py) vote
        again, in epochs above `floor_epoch`: it may have voted in that one and
        forgotten it, so that epoch is persisted with a vote given to nobody it knows."""
        if floor_epoch > self.epoch:
            self._persist(floor_epoch, FORGOTTEN_VOTE, -1)
            self._become_unattached(now)
        self._may_vote_again()

    def _may_vote_again(self) -> None:
        if self.state.catching_up:
            new = msgspec.structs.replace(self.state, catching_up=False)
            self._save(new)  # durable before it votes
            self.state = new
        self.may_vote = True

    def _note_held_entries(self, held: bool = True) -> None:
        """Record, durably, that the log holds durable entries, before a fetch reports
        them or the leader counts them: a voter that loses its log but not its quorum
        state then knows it may have acknowledged committed entries (voting_rights.py).
        `held` False when a truncation cut the log back to nothing (what it held
        diverged from the leader's, so none of it was committed)."""
        if held != self.state.held_entries:
            new = msgspec.structs.replace(self.state, held_entries=held)
            self._save(new)
            self.state = new

    def _election_timeout(self) -> float:
        t = self.settings.election_timeout_ms
        return t + self._rng.random() * t

    def _become_unattached(self, now: float, *, delay_ms: float | None = None) -> None:
        self.role = Role.UNATTACHED
        self._progress.clear()
        self._fetching = False
        self._deadline = now + (self._election_timeout() if delay_ms is None else delay_ms)

    def _become_follower(self, leader_id: int, now: float) -> None:
        if leader_id == self.node_id:
            raise InvariantError(f"node {leader_id} following itself in epoch {self.epoch}")
        was = (self.role, self.leader_id)
        self.role = Role.FOLLOWER
        self._progress.clear()
        self._deadline = now + self.settings.fetch_timeout_ms
        self._fetching = False
        self._next_fetch_ms = now
        if was != (Role.FOLLOWER, leader_id):
            log.info("quorum: following leader %d in epoch %d", leader_id, self.epoch)

    def _observe_epoch(self, epoch: int, leader_id: int, now: float) -> bool:
        """A message says the quorum is at `epoch` (with `leader_id`, -1 if unknown):
        move there if it is newer, or learn the leader of our epoch. False when the
        message is from an older epoch (the caller answers with ours)."""
        if epoch < self.epoch:
            return False
        if epoch > self.epoch:
            self._persist(epoch, -1, leader_id)
            if leader_id >= 0 and leader_id != self.node_id:
                self._become_follower(leader_id, now)
            else:
                self._become_unattached(now)
            return True
        if leader_id < 0 or leader_id == self.node_id or self.role is Role.LEADER:
            return True
        if self.leader_id < 0:
            self._persist(epoch, self.state.voted_for, leader_id)
        if self.leader_id == leader_id and self.role is not Role.FOLLOWER:
            # e.g. a follower that stood for election while its leader was alive: the
            # voters' answers name the leader, it follows it again.
            self._become_follower(leader_id, now)
        return True

    # ------------------------------------------------------------------ timers

    def tick(self, now: float) -> None:
        if self.role is Role.LEADER:
            self._check_quorum(now)
            if self.role is Role.LEADER:
                self._resend_begin_epoch(now)
            return
        if self.role is Role.FOLLOWER:
            if now >= self._deadline:
                log.info(
                    "quorum: no fetch answer from leader %d for %.0f ms; standing for election",
                    self.leader_id,
                    self.settings.fetch_timeout_ms,
                )
                self._stand(now)
            else:
                self._maybe_fetch(now)
            return
        if now >= self._deadline:
            if self.role is Role.CANDIDATE:
                # Lost (or split) the election: pre-vote again after a random backoff.
                backoff = self._rng.random() * self.settings.election_backoff_max_ms
                self._become_unattached(now, delay_ms=backoff)
            else:
                self._stand(now)

    def _stand(self, now: float) -> None:
        """Ask for pre-votes (KIP-996). A voter that may not stand asks all the same:
        the answers name the leader, which is how a restarted voter finds it."""
        self.role = Role.PROSPECTIVE
        self._progress.clear()
        self._fetching = False
        self._granted = {self.node_id}
        self._deadline = now + self._election_timeout()
        self._ask_votes(pre_vote=True)
        self._maybe_win(now)

    def _ask_votes(self, *, pre_vote: bool) -> None:
        epoch = self.epoch + 1 if pre_vote else self.epoch
        for voter in self.voters:
            if voter != self.node_id:
                self.outbox.append(
                    (
                        voter,
                        VoteRequest(
                            cluster_id=self.cluster_id,
                            candidate_id=self.node_id,
                            candidate_epoch=epoch,
                            last_offset_epoch=self.log.last_epoch,
                            last_offset=self.log.end_offset,
                            pre_vote=pre_vote,
                        ),
                    )
                )

    def _maybe_win(self, now: float) -> None:
        if len(self._granted) < self.majority or not self.may_vote:
            return
        if self.role is Role.PROSPECTIVE:
            self._persist(self.epoch + 1, self.node_id, -1)
            self.role = Role.CANDIDATE
            self._granted = {self.node_id}
            self._deadline = now + self._election_timeout()
            log.info("quorum: candidate in epoch %d", self.epoch)
            self._ask_votes(pre_vote=False)
            self._maybe_win(now)
        elif self.role is Role.CANDIDATE:
            self._become_leader(now)

    def _become_leader(self, now: float) -> None:
        self._persist(self.epoch, self.node_id, self.node_id)
        self.role = Role.LEADER
        self._progress = {v: VoterProgress() for v in self.voters if v != self.node_id}
        for p in self._progress.values():
            p.last_fetch_ms = now  # check-quorum counts from the election
        self._begin_sent_ms = {}
        # The first entry of every epoch: committing it commits what came before.
        change = LeaderChangeRecord(
            leader_id=self.node_id, leader_epoch=self.epoch, voters=list(self.voters)
        )
        self.log.append(
            [MetadataEntry(offset=self.log.end_offset, epoch=self.epoch, record=change)]
        )
        log.info(
            "quorum: leader in epoch %d (log end %d, high watermark %d)",
            self.epoch,
            self.log.end_offset,
            self.high_watermark,
        )
        self._resend_begin_epoch(now)
        self._advance_high_watermark()

    def _resend_begin_epoch(self, now: float) -> None:
        for voter, p in self._progress.items():
            if p.end_offset >= 0:
                continue  # it fetched from us in this epoch
            sent = self._begin_sent_ms.get(voter)
            if sent is None or now - sent >= self.settings.begin_epoch_resend_ms:
                self._begin_sent_ms[voter] = now
                self.outbox.append(
                    (
                        voter,
                        BeginQuorumEpochRequest(
                            cluster_id=self.cluster_id,
                            leader_id=self.node_id,
                            leader_epoch=self.epoch,
                        ),
                    )
                )

    def _check_quorum(self, now: float) -> None:
        """A leader cut off from a majority resigns, so that clients and brokers go to
        the leader the others elect instead of waiting on this one."""
        horizon = now - self.settings.fetch_timeout_ms
        heard = 1 + sum(1 for p in self._progress.values() if p.last_fetch_ms >= horizon)
        if heard < self.majority:
            log.warning(
                "quorum: leader of epoch %d heard from %d of %d voters within %.0f ms; resigning",
                self.epoch,
                heard,
                len(self.voters),
                self.settings.fetch_timeout_ms,
            )
            self._become_unattached(now)

    # ------------------------------------------------------------------ leader API

    def append(self, records: list[Any], now: float) -> int:
        """Append `records` as the leader; the offset after the last of them (the
        high watermark that commits them all)."""
        if self.role is not Role.LEADER:
            raise InvariantError(f"append on a {self.role.value} (epoch {self.epoch})")
        start = self.log.end_offset
        self.log.append(
            as_change(
                [
                    MetadataEntry(offset=start + i, epoch=self.epoch, record=r)
                    for i, r in enumerate(records)
                ]
            )
        )
        return self.log.end_offset

    def flushed(self, point: tuple[int, int], now: float) -> None:
        self.log.flushed(point)
        if self.log.flushed_end > 0:
            self._note_held_entries()
        if self.role is Role.LEADER:
            self._advance_high_watermark()
        else:
            self._maybe_fetch(now)

    def _advance_high_watermark(self) -> None:
        ends = sorted(
            [self.log.flushed_end, *(p.end_offset for p in self._progress.values())],
            reverse=True,
        )
        majority_end = ends[self.majority - 1]
        if majority_end <= self.high_watermark:
            return
        # Raft's rule: only an entry of our own epoch commits by counting replicas.
        if self.log.epoch_at(majority_end - 1) != self.epoch:
            return
        self._set_high_watermark(majority_end)

    def _set_high_watermark(self, hw: int) -> None:
        if hw < self.high_watermark:
            raise InvariantError(f"high watermark going back: {self.high_watermark} -> {hw}")
        if hw > self.log.end_offset:
            raise InvariantError(f"high watermark {hw} past the log end {self.log.end_offset}")
        self.high_watermark = hw

    def compact(self, snapshot: Snapshot) -> None:
        """The application applied everything below `snapshot.end_offset` (committed)
        and saved it: drop the entries it covers."""
        if snapshot.end_offset > self.high_watermark:
            raise InvariantError(
                f"snapshot at {snapshot.end_offset} past the high watermark {self.high_watermark}"
            )
        self.log.compact(snapshot)

    def resign(self, now: float) -> None:
        """Graceful shutdown of the leader: tell the voters to elect a successor now,
        the most caught up first (KRaft's EndQuorumEpoch)."""
        if self.role is not Role.LEADER:
            return
        successors = sorted(self._progress, key=lambda v: -self._progress[v].end_offset)
        for voter in successors:
            self.outbox.append(
                (
                    voter,
                    EndQuorumEpochRequest(
                        cluster_id=self.cluster_id,
                        leader_id=self.node_id,
                        leader_epoch=self.epoch,
                        preferred_successors=successors,
                    ),
                )
            )
        self._become_unattached(now, delay_ms=float("inf"))

    # ------------------------------------------------------------------ follower fetch

    def _maybe_fetch(self, now: float) -> None:
        if (
            self.role is not Role.FOLLOWER
            or self._fetching
            or now < self._next_fetch_ms
            # Only what is durable is reported: the leader counts our fetch offset.
            or self.log.flushed_end < self.log.end_offset
        ):
            return
        self._fetching = True
        self.outbox.append(
            (
                self.leader_id,
                QuorumFetchRequest(
                    cluster_id=self.cluster_id,
                    replica_id=self.node_id,
                    current_leader_epoch=self.epoch,
                    fetch_offset=self.log.end_offset,
                    last_fetched_epoch=self.log.last_epoch,
                    max_entries=self.settings.fetch_max_entries,
                ),
            )
        )

    # ------------------------------------------------------------------ requests

    def handle_request(self, src: int, request: Message, now: float) -> Message:
        if getattr(request, "cluster_id", self.cluster_id) != self.cluster_id:
            code = int(ErrorCode.INCONSISTENT_CLUSTER_ID)
            return _error_response(request, code, self)
        if isinstance(request, VoteRequest):
            return self._on_vote(request, now)
        if isinstance(request, BeginQuorumEpochRequest):
            return self._on_begin_epoch(request, now)
        if isinstance(request, EndQuorumEpochRequest):
            return self._on_end_epoch(request, now)
        if isinstance(request, QuorumFetchRequest):
            return self._on_fetch(request, now)
        if isinstance(request, FetchSnapshotRequest):
            return self._on_fetch_snapshot(request, now)
        raise TypeError(f"not a quorum request: {type(request).__name__}")

    def _log_up_to_date(self, last_epoch: int, end_offset: int) -> bool:
        return (last_epoch, end_offset) >= (self.log.last_epoch, self.log.end_offset)

    def _live_leader(self, now: float) -> int:
        """The leader we know to be alive (ourselves, or the one we heard from within
        the fetch timeout), -1 if none: what our answers name, so that a voter that
        asks is not sent back to a leader that is gone (the persisted leader of our
        epoch may be dead, or be us before a restart)."""
        if self.role is Role.LEADER:
            return self.node_id
        leader, when = self._last_leader_contact
        if (
            self.role is Role.FOLLOWER
            and leader == self.leader_id
            and now - when < self.settings.fetch_timeout_ms
        ):
            return self.leader_id
        return -1

    def _heard_from_leader(self, now: float) -> None:
        self._last_leader_contact = (self.leader_id, now)
        self._deadline = now + self.settings.fetch_timeout_ms

    def _on_vote(self, req: VoteRequest, now: float) -> VoteResponse:
        def answer(granted: bool, code: ErrorCode = ErrorCode.NONE) -> VoteResponse:
            return VoteResponse(
                error_code=int(code),
                voter_id=self.node_id,
                leader_id=self._live_leader(now),
                leader_epoch=self.epoch,
                vote_granted=granted,
            )

        if req.candidate_id not in self.voters:
            return answer(False, ErrorCode.INCONSISTENT_VOTER_SET)
        if not self.may_vote:
            return answer(False)
        up_to_date = self._log_up_to_date(req.last_offset_epoch, req.last_offset)
        if req.pre_vote:
            # Changes nothing here: would a real vote win, and is there no leader?
            granted = req.candidate_epoch > self.epoch and up_to_date and self._live_leader(now) < 0
            return answer(granted)
        if req.candidate_epoch < self.epoch:
            return answer(False)
        if req.candidate_epoch > self.epoch:
            self._persist(req.candidate_epoch, -1, -1)
            self._become_unattached(now)
        if self.leader_id >= 0 or self.state.voted_for not in (-1, req.candidate_id):
            return answer(False)
        if not up_to_date:
            return answer(False)
        self._persist(self.epoch, req.candidate_id, -1)  # durable before it is granted
        self._become_unattached(now)  # give the candidate its election time
        return answer(True)

    def _on_begin_epoch(self, req: BeginQuorumEpochRequest, now: float) -> Message:
        if req.leader_id not in self.voters:
            return BeginQuorumEpochResponse(
                error_code=int(ErrorCode.INCONSISTENT_VOTER_SET),
                leader_id=self._live_leader(now),
                leader_epoch=self.epoch,
            )
        if req.leader_epoch == self.epoch and self.leader_id not in (-1, req.leader_id):
            log.error(
                "quorum: node %d claims to lead epoch %d, led by %d",
                req.leader_id,
                req.leader_epoch,
                self.leader_id,
            )
        elif self._observe_epoch(req.leader_epoch, req.leader_id, now):
            if self.leader_id == req.leader_id:
                self._heard_from_leader(now)  # the leader itself told us
            return BeginQuorumEpochResponse(
                leader_id=self._live_leader(now), leader_epoch=self.epoch
            )
        return BeginQuorumEpochResponse(
            error_code=int(ErrorCode.FENCED_LEADER_EPOCH),
            leader_id=self._live_leader(now),
            leader_epoch=self.epoch,
        )

    def _on_end_epoch(self, req: EndQuorumEpochRequest, now: float) -> Message:
        if req.leader_epoch < self.epoch:
            return EndQuorumEpochResponse(
                error_code=int(ErrorCode.FENCED_LEADER_EPOCH),
                leader_id=self._live_leader(now),
                leader_epoch=self.epoch,
            )
        self._observe_epoch(req.leader_epoch, -1, now)
        if self.role is Role.FOLLOWER and self.leader_id == req.leader_id:
            # Stand at once, the preferred successors first (each one further down the
            # list waits one more backoff).
            rank = (
                req.preferred_successors.index(self.node_id)
                if self.node_id in req.preferred_successors
                else len(req.preferred_successors)
            )
            self._become_unattached(now, delay_ms=rank * self.settings.election_backoff_max_ms)
        return EndQuorumEpochResponse(leader_id=self._live_leader(now), leader_epoch=self.epoch)

    def _fetch_error(self, code: ErrorCode, now: float) -> QuorumFetchResponse:
        return QuorumFetchResponse(
            error_code=int(code),
            leader_id=self._live_leader(now),
            leader_epoch=self.epoch,
            high_watermark=self.high_watermark,
        )

    def _on_fetch(self, req: QuorumFetchRequest, now: float) -> QuorumFetchResponse:
        if req.replica_id not in self.voters or req.replica_id == self.node_id:
            return self._fetch_error(ErrorCode.INCONSISTENT_VOTER_SET, now)
        if req.current_leader_epoch < self.epoch:
            return self._fetch_error(ErrorCode.FENCED_LEADER_EPOCH, now)
        if req.current_leader_epoch > self.epoch:
            return self._fetch_error(ErrorCode.UNKNOWN_LEADER_EPOCH, now)
        if self.role is not Role.LEADER:
            return self._fetch_error(ErrorCode.NOT_LEADER_OR_FOLLOWER, now)
        progress = self._progress[req.replica_id]
        progress.last_fetch_ms = now
        answer = QuorumFetchResponse(
            leader_id=self.node_id,
            leader_epoch=self.epoch,
            high_watermark=self.high_watermark,
            log_start_offset=self.log.start_offset,
        )
        start = self.log.start_offset
        if req.fetch_offset < start or (
            req.fetch_offset == start
            and start > 0
            and req.last_fetched_epoch != self.log.snapshot.epoch
        ):
            answer.snapshot_id = self.log.snapshot.id
            return answer
        div = diverging_epoch(
            self.log.lineage, start, self.log.end_offset, req.last_fetched_epoch, req.fetch_offset
        )
        if div is OUT_OF_RANGE:
            # An epoch we cannot place: a voter's log from a lineage we never had.
            div = type(div)(UNDEFINED_EPOCH, start)
        if div is not None:
            answer.diverging_epoch, answer.diverging_end_offset = div
            return answer
        # The voter holds (durably) everything below its fetch offset, as we do.
        if req.fetch_offset < progress.end_offset:
            log.info(
                "quorum: voter %d is back at offset %d (had %d): it lost entries",
                req.replica_id,
                req.fetch_offset,
                progress.end_offset,
            )
        progress.end_offset = req.fetch_offset
        self._advance_high_watermark()
        answer.high_watermark = self.high_watermark
        # Whole changes only: a voter's log, and so the high watermark, never ends
        # inside one.
        answer.entries = self.log.read(req.fetch_offset, max(1, min(req.max_entries, 10_000)))
        return answer

    def _on_fetch_snapshot(self, req: FetchSnapshotRequest, now: float) -> FetchSnapshotResponse:
        if req.current_leader_epoch != self.epoch or self.role is not Role.LEADER:
            code = (
                ErrorCode.FENCED_LEADER_EPOCH
                if req.current_leader_epoch < self.epoch
                else ErrorCode.NOT_LEADER_OR_FOLLOWER
            )
            return FetchSnapshotResponse(
                error_code=int(code), leader_id=self._live_leader(now), leader_epoch=self.epoch
            )
        snap = self.log.snapshot
        if (req.snapshot_id.end_offset, req.snapshot_id.epoch) != (snap.end_offset, snap.epoch):
            return FetchSnapshotResponse(
                error_code=int(ErrorCode.SNAPSHOT_NOT_FOUND),
                leader_id=self.node_id,
                leader_epoch=self.epoch,
            )
        return FetchSnapshotResponse(
            leader_id=self.node_id,
            leader_epoch=self.epoch,
            snapshot_id=snap.id,
            records=list(snap.records),
        )

    # ------------------------------------------------------------------ responses

    def request_failed(self, dst: int, request: Message, now: float) -> None:
        """No answer (timeout, connection refused or lost)."""
        fetch = isinstance(request, (QuorumFetchRequest, FetchSnapshotRequest))
        if fetch and self.role is Role.FOLLOWER and dst == self.leader_id:
            self._fetching = False
            self._next_fetch_ms = now + self.settings.idle_fetch_backoff_ms

    def answer_problem(self, request: Message, response: Message) -> str | None:
        """Why a peer's answer to `request` cannot be true (None: it can). The driver
        drops such an answer as if none had come: a peer that is not a voter of this
        quorum, or a buggy one, must not stall or crash this one."""
        leader = getattr(response, "leader_id", -1)
        if leader != -1 and leader not in self.voters:
            return f"it names controller {leader} as leader, not a voter ({sorted(self.voters)})"
        if getattr(response, "error_code", 0) != 0:
            return None
        if isinstance(response, QuorumFetchResponse) and isinstance(request, QuorumFetchRequest):
            return self._fetch_answer_problem(request, response)
        if isinstance(response, FetchSnapshotResponse) and response.snapshot_id is not None:
            sid = response.snapshot_id
            if sid.end_offset < 0 or sid.epoch > response.leader_epoch:
                return (
                    f"snapshot at offset {sid.end_offset} of epoch {sid.epoch} from a leader of "
                    f"epoch {response.leader_epoch}"
                )
        return None

    def _fetch_answer_problem(
        self, req: QuorumFetchRequest, resp: QuorumFetchResponse
    ) -> str | None:
        parts = [resp.entries != [], resp.snapshot_id is not None, self._diverges(resp)]
        if sum(parts) > 1:
            return "it sends entries, a snapshot or a divergence together (at most one)"
        expected, epoch = req.fetch_offset, req.last_fetched_epoch
        for e in resp.entries:
            if e.offset != expected:
                return f"entry at offset {e.offset} where {expected} continues the log"
            if not epoch <= e.epoch <= resp.leader_epoch:
                return (
                    f"entry at offset {e.offset} of epoch {e.epoch}, outside {epoch}.."
                    f"{resp.leader_epoch} (after the last fetched epoch, up to the leader's)"
                )
            expected, epoch = expected + 1, e.epoch
        if self._diverges(resp) and req.fetch_offset == self.log.end_offset:
            offset = self._divergence_offset(req, resp)
            if offset < self.high_watermark:
                return (
                    f"diverging epoch {resp.diverging_epoch} at {resp.diverging_end_offset} "
                    f"would truncate committed entries (to {offset}, high watermark "
                    f"{self.high_watermark})"
                )
        return None

    @staticmethod
    def _diverges(resp: QuorumFetchResponse) -> bool:
        return resp.diverging_epoch >= 0 or resp.diverging_end_offset >= 0

    def _divergence_offset(self, req: QuorumFetchRequest, resp: QuorumFetchResponse) -> int:
        """Where the brokers' rule (runtime/epoch_lineage.py) cuts our log."""
        leo = self.log.end_offset
        return offset_truncation_state(
            resp.diverging_epoch,
            resp.diverging_end_offset,
            follower_end_offset_for=lambda e: self.log.lineage.end_offset_for(e, leo),
            follower_leo=leo,
            fetch_offset=req.fetch_offset,
        ).offset

    def handle_response(self, dst: int, request: Message, response: Message, now: float) -> None:
        if isinstance(response, VoteResponse) and isinstance(request, VoteRequest):
            self._on_vote_response(dst, request, response, now)
        elif isinstance(response, QuorumFetchResponse) and isinstance(request, QuorumFetchRequest):
            self._on_fetch_response(dst, request, response, now)
        elif isinstance(response, FetchSnapshotResponse) and isinstance(
            request, FetchSnapshotRequest
        ):
            self._on_snapshot_response(dst, request, response, now)
        elif (
            isinstance(response, (BeginQuorumEpochResponse, EndQuorumEpochResponse))
            and response.leader_epoch > self.epoch
        ):
            self._observe_epoch(response.leader_epoch, response.leader_id, now)

    def _on_vote_response(
        self, voter: int, req: VoteRequest, resp: VoteResponse, now: float
    ) -> None:
        if resp.leader_epoch > self.epoch and not (req.pre_vote and resp.vote_granted):
            self._observe_epoch(resp.leader_epoch, resp.leader_id, now)
            return
        expected = Role.PROSPECTIVE if req.pre_vote else Role.CANDIDATE
        round_epoch = self.epoch + 1 if req.pre_vote else self.epoch
        if self.role is not expected or req.candidate_epoch != round_epoch:
            return  # an answer to an earlier round
        if resp.vote_granted:
            self._granted.add(voter)
            self._maybe_win(now)
        elif resp.leader_id >= 0 and resp.leader_epoch == self.epoch and req.pre_vote:
            # The voter has a live leader in our epoch: follow it too.
            self._observe_epoch(resp.leader_epoch, resp.leader_id, now)

    def _on_fetch_response(
        self, leader: int, req: QuorumFetchRequest, resp: QuorumFetchResponse, now: float
    ) -> None:
        if self.role is not Role.FOLLOWER or leader != self.leader_id:
            return
        self._fetching = False
        code = ErrorCode.of(resp.error_code)
        if code != ErrorCode.NONE:
            if resp.leader_epoch > self.epoch or (
                resp.leader_epoch == self.epoch and resp.leader_id >= 0
            ):
                self._observe_epoch(resp.leader_epoch, resp.leader_id, now)
            self._next_fetch_ms = now + self.settings.idle_fetch_backoff_ms
            return
        if req.current_leader_epoch != self.epoch or req.fetch_offset != self.log.end_offset:
            return  # stale: our log changed since
        self._heard_from_leader(now)
        if resp.snapshot_id is not None:
            self._fetching = True
            self.outbox.append(
                (
                    leader,
                    FetchSnapshotRequest(
                        cluster_id=self.cluster_id,
                        replica_id=self.node_id,
                        current_leader_epoch=self.epoch,
                        snapshot_id=resp.snapshot_id,
                    ),
                )
            )
            return
        if self._diverges(resp):
            offset = self._divergence_offset(req, resp)
            self._truncate(offset, f"diverging epoch {resp.diverging_epoch} from {leader}")
            self._maybe_fetch(now)
            return
        if resp.entries:
            self.log.append(resp.entries)
        self._learn_high_watermark(resp.high_watermark)
        if not resp.entries:
            self._next_fetch_ms = now + self.settings.idle_fetch_backoff_ms
        self._maybe_fetch(now)

    def _truncate(self, offset: int, why: str) -> None:
        if offset < self.high_watermark:
            raise InvariantError(
                f"quorum: truncating to {offset} below the high watermark {self.high_watermark} "
                f"({why}): a committed entry would be lost"
            )
        if offset < self.log.end_offset:
            log.info(
                "quorum: truncating the metadata log from %d to %d (%s)",
                self.log.end_offset,
                offset,
                why,
            )
            self.log.truncate_to(offset)
            if self.log.end_offset == 0:
                self._note_held_entries(held=False)

    def _learn_high_watermark(self, leader_hw: int) -> None:
        hw = min(leader_hw, self.log.end_offset)
        if hw > self.high_watermark:
            self._set_high_watermark(hw)
        if not self.may_vote:
            if self._catch_up_target is None:
                self._catch_up_target = leader_hw
            if self.high_watermark >= self._catch_up_target:
                log.info(
                    "quorum: caught up to offset %d after losing the log; voting again",
                    self._catch_up_target,
                )
                self._may_vote_again()

    def _on_snapshot_response(
        self, leader: int, req: FetchSnapshotRequest, resp: FetchSnapshotResponse, now: float
    ) -> None:
        if self.role is not Role.FOLLOWER or leader != self.leader_id:
            return
        self._fetching = False
        code = ErrorCode.of(resp.error_code)
        if code != ErrorCode.NONE or resp.snapshot_id is None:
            if resp.leader_epoch > self.epoch:
                self._observe_epoch(resp.leader_epoch, resp.leader_id, now)
            self._next_fetch_ms = now + self.settings.idle_fetch_backoff_ms
            return
        sid: SnapshotId = resp.snapshot_id
        if sid.end_offset < self.high_watermark:
            return  # we are past it already
        log.info(
            "quorum: installing snapshot at offset %d (epoch %d) from leader %d",
            sid.end_offset,
            sid.epoch,
            leader,
        )
        self.log.install(Snapshot(sid.end_offset, sid.epoch, tuple(resp.records)))
        self._set_high_watermark(sid.end_offset)
        self._maybe_fetch(now)


def _error_response(request: Message, code: int, replica: QuorumReplica) -> Message:
    common = {"error_code": code, "leader_epoch": replica.epoch, "leader_id": replica.leader_id}
    response_type = {
        VoteRequest: VoteResponse,
        BeginQuorumEpochRequest: BeginQuorumEpochResponse,
        EndQuorumEpochRequest: EndQuorumEpochResponse,
        QuorumFetchRequest: QuorumFetchResponse,
        FetchSnapshotRequest: FetchSnapshotResponse,
    }[type(request)]
    return response_type(**common)
