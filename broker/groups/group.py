"""One consumer group's membership state, as Kafka's classic GroupMetadata: its state,
generation, chosen protocol, leader and members. No I/O and no timers here
(broker/groups/membership.py drives the protocol); the rules that only read or change
this state are here, each in one place.

States and transitions (Kafka's names):

    Empty --join--> PreparingRebalance --all joined / rebalance timeout--> CompletingRebalance
    CompletingRebalance --leader's SyncGroup persisted--> Stable
    Stable / CompletingRebalance --join, leave, session expiry--> PreparingRebalance
    PreparingRebalance --nobody rejoined--> Empty (the generation still advances)
    any --deleted, or the coordinator moved--> Dead
"""

from __future__ import annotations

import asyncio
import enum
from collections import Counter
from dataclasses import dataclass
from dataclasses import field

from protocol.messages import JoinGroupResponse
from protocol.messages import SyncGroupResponse


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]  # (assignor name, subscription), by preference
    assignment: bytes = b""
    # The member's JoinGroup / SyncGroup waiting for the rebalance to get that far.
    awaiting_join: asyncio.Future[JoinGroupResponse] | None = None
    awaiting_sync: asyncio.Future[SyncGroupResponse] | None = None
    session_deadline: float = 0.0  # loop time; heartbeats, commits and joins push it

    def metadata(self, protocol: str) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        raise AssertionError(f"member {self.member_id} does not support {protocol!r}")

    def vote(self, candidates: set[str]) -> str:
        """Its most preferred protocol among those every member supports."""
        for name, _ in self.protocols:
            if name in candidates:
                return name
        raise AssertionError(f"member {self.member_id} supports none of {sorted(candidates)}")

    @property
    def kept_alive(self) -> bool:
        """A member waiting in a JoinGroup or SyncGroup is not expected to heartbeat."""
        return self.awaiting_join is not None or self.awaiting_sync is not None


@dataclass
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)  # in join order
    # Member ids handed out by MEMBER_ID_REQUIRED (JoinGroup v4+), not joined yet:
    # member id -> the loop time by which it must join with it.
    pending: dict[str, float] = field(default_factory=dict)
    # Static membership (KIP-345): group.instance.id -> the member id that holds it.
    static: dict[str, str] = field(default_factory=dict)
    state_timestamp_ms: int = 0
    # The join phase's timer (initial delay or rebalance timeout) and sessions' timer.
    join_timer: asyncio.TimerHandle | None = None
    initial_delay_deadline: float | None = None  # set while the first join is delayed

    def transition(self, to: GroupState, now_ms: int) -> None:
        allowed = _TRANSITIONS[self.state]
        assert to in allowed, f"group {self.group_id}: {self.state.value} -> {to.value}"
        self.state = to
        self.state_timestamp_ms = now_ms

    def supports(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        """Whether a member with these protocols can join: the same protocol type, and
        one protocol in common with every member (Kafka's supportsProtocols). The first
        member must name a protocol type: a group stored with none is read back as one
        without a type, which its own members' next JoinGroups do not match."""
        if not protocols:
            return False
        if not self.members:
            return bool(protocol_type)
        if protocol_type != self.protocol_type:
            return False
        names = {name for name, _ in protocols}
        return bool(names & self.candidate_protocols())

    def candidate_protocols(self) -> set[str]:
        """The protocols every member supports."""
        sets = [{name for name, _ in m.protocols} for m in self.members.values()]
        return set.intersection(*sets) if sets else set()

    def select_protocol(self) -> str:
        """The protocol for the next generation: every member votes for its most
        preferred candidate, the most votes win (ties: the first member's order)."""
        candidates = self.candidate_protocols()
        assert candidates, f"group {self.group_id}: no protocol common to all members"
        votes = Counter(m.vote(candidates) for m in self.members.values())
        best = max(votes.values())
        first = next(iter(self.members.values()))
        return next(name for name, _ in first.protocols if votes.get(name) == best)

    def all_joined(self) -> bool:
        """Every member rejoined and no handed-out member id is still to come."""
        return not self.pending and all(m.awaiting_join is not None for m in self.members.values())

    def fenced(self, instance_id: str | None, member_id: str) -> bool:
        """A request naming a static member id that another member id now holds (Kafka's
        isStaticMemberFenced). An instance id no member holds fences nothing: its
        member was removed (session expired, left, a rebalance went on without it),
        and the request is refused as from an unknown member, so that the client joins
        again rather than give up on a fencing that clients take as fatal."""
        if instance_id is None:
            return False
        holder = self.static.get(instance_id)
        return holder is not None and holder != member_id

    def replace_static(self, old: Member, new_id: str) -> Member:
        """The static member `old` comes back as `new_id` (KIP-345): the same place in
        the group, the same assignment; the old id is fenced from now on."""
        assert old.group_instance_id is not None, "only a static member is replaced"
        previous = old.member_id
        self.members = {new_id if v is old else k: v for k, v in self.members.items()}
        old.member_id = new_id
        self.static[old.group_instance_id] = new_id
        if self.leader == previous:
            self.leader = new_id
        return old

    def max_rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)


_TRANSITIONS: dict[GroupState, set[GroupState]] = {
    GroupState.EMPTY: {GroupState.PREPARING_REBALANCE, GroupState.DEAD},
    GroupState.PREPARING_REBALANCE: {
        GroupState.COMPLETING_REBALANCE,
        GroupState.EMPTY,
        GroupState.DEAD,
    },
    GroupState.COMPLETING_REBALANCE: {
        GroupState.STABLE,
        GroupState.PREPARING_REBALANCE,
        GroupState.DEAD,
    },
    GroupState.STABLE: {GroupState.PREPARING_REBALANCE, GroupState.DEAD},
    GroupState.DEAD: set(),
}
