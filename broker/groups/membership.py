"""The classic rebalance protocol, as Kafka's GroupCoordinator runs it for one broker's
groups: JoinGroup (long-polled until the generation forms), SyncGroup (the leader's
assignment handed to every member), Heartbeat, LeaveGroup, session expiry, and the
generation and member checks of OffsetCommit.

The coordinator (broker/group_coordinator.py) finds the group's shard of
__consumer_offsets, then calls in here with that shard's groups; writing a group's
metadata record is its `persist` callback. Every wait is bounded: a JoinGroup by the
group's rebalance timeout (members that did not rejoin by then are removed), a SyncGroup
by the leader's (a rebalance that moves on answers it REBALANCE_IN_PROGRESS), a member
id handed out by MEMBER_ID_REQUIRED by the session timeout, and a group's size by
group.max.size.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from broker.groups.group import Group
from broker.groups.group import GroupState
from broker.groups.group import Member
from protocol.errors import ErrorCode
from protocol.messages import DescribedGroup
from protocol.messages import DescribedGroupMember
from protocol.messages import HeartbeatRequest
from protocol.messages import HeartbeatResponse
from protocol.messages import JoinGroupRequest
from protocol.messages import JoinGroupResponse
from protocol.messages import JoinGroupResponseMember
from protocol.messages import LeaveGroupRequest
from protocol.messages import LeaveGroupResponse
from protocol.messages import SyncGroupRequest
from protocol.messages import SyncGroupResponse
from runtime.server import RequestContext

_GENERATION_MAX = 2**31 - 1  # the wire field is an int32
T = TypeVar("T")
log = logging.getLogger(__name__)

# What writes a group's metadata record (with the assignments of the generation being
# completed, or None to keep the members' current ones): the write's error, NONE once
# it is committed.
Persist = Callable[[Group, "dict[str, bytes] | None"], Awaitable[ErrorCode]]


@dataclass(frozen=True)
class MembershipSettings:
    min_session_timeout_ms: int = 6_000  # Kafka's group.min.session.timeout.ms
    max_session_timeout_ms: int = 1_800_000  # group.max.session.timeout.ms
    initial_rebalance_delay_ms: int = 3_000  # group.initial.rebalance.delay.ms
    max_size: int = 1_000  # group.max.size (Kafka: unbounded)


class Membership:
    def __init__(
        self,
        settings: MembershipSettings,
        persist: Persist,
        now_ms: Callable[[], int],
    ) -> None:
        self.settings = settings
        self.persist = persist
        self.now_ms = now_ms
        self._background: set[asyncio.Task[ErrorCode]] = set()

    @staticmethod
    def _time() -> float:
        return asyncio.get_running_loop().time()

    # ------------------------------------------------------------------ JoinGroup

    async def join(
        self, groups: dict[str, Group], ctx: RequestContext, req: JoinGroupRequest
    ) -> JoinGroupResponse:
        s = self.settings
        if not s.min_session_timeout_ms <= req.session_timeout_ms <= s.max_session_timeout_ms:
            return _join_error(ErrorCode.INVALID_SESSION_TIMEOUT, req.member_id)
        protocols = [(p.name, bytes(p.metadata)) for p in req.protocols]
        group = groups.get(req.group_id)
        if group is None:
            if req.member_id:
                return _join_error(ErrorCode.UNKNOWN_MEMBER_ID, req.member_id)
            group = Group(req.group_id)
            group.state_timestamp_ms = self.now_ms()
        if group.state is GroupState.DEAD:
            return _join_error(ErrorCode.COORDINATOR_NOT_AVAILABLE, req.member_id)
        if not group.supports(req.protocol_type, protocols):
            return _join_error(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, req.member_id)
        # Only a join that passed the checks creates a group (a refused one leaves
        # nothing behind); one that never forms a generation is forgotten again by
        # forget_unformed once its member ids expire.
        groups.setdefault(req.group_id, group)
        if not req.member_id and req.group_instance_id is not None:
            return await self._join_static(group, ctx, req, protocols)
        if req.member_id and group.fenced(req.group_instance_id, req.member_id):
            return _join_error(ErrorCode.FENCED_INSTANCE_ID, req.member_id)
        if not req.member_id:
            if len(group.members) + len(group.pending) >= self.settings.max_size:
                return _join_error(ErrorCode.GROUP_MAX_SIZE_REACHED, "")
            member_id = f"{ctx.client_id or 'member'}-{uuid.uuid4()}"
            # Kafka's JoinGroup v4+ (and the native listener): the member first learns
            # its id and joins again with it, so a join retried after a lost answer
            # does not add a second member.
            if ctx.protocol != "kafka" or ctx.api_version >= 4:
                group.pending[member_id] = self._time() + req.session_timeout_ms / 1000
                return _join_error(ErrorCode.MEMBER_ID_REQUIRED, member_id)
            return await self._add_member(group, self._member(member_id, ctx, req, protocols))
        if group.pending.pop(req.member_id, None) is not None:
            return await self._add_member(group, self._member(req.member_id, ctx, req, protocols))
        return await self._rejoin(group, req.member_id, req, protocols)

    async def _join_static(
        self,
        group: Group,
        ctx: RequestContext,
        req: JoinGroupRequest,
        protocols: list[tuple[str, bytes]],
    ) -> JoinGroupResponse:
        """KIP-345: a member with a group.instance.id joins without MEMBER_ID_REQUIRED;
        one that comes back (a restart) takes its old place under a new member id, the
        old id fenced, and in a Stable group with the same protocols no rebalance
        happens: it gets its previous assignment back."""
        instance = req.group_instance_id
        assert instance is not None
        new_id = f"{instance}-{uuid.uuid4()}"
        current = group.static.get(instance)
        member = group.members.get(current) if current is not None else None
        if member is None:
            if len(group.members) + len(group.pending) >= self.settings.max_size:
                return _join_error(ErrorCode.GROUP_MAX_SIZE_REACHED, "")
            group.static[instance] = new_id
            return await self._add_member(group, self._member(new_id, ctx, req, protocols))
        _answer_waiters(member, ErrorCode.FENCED_INSTANCE_ID)
        log.info(
            "group %s: static member %s is back as %s (was %s)",
            group.group_id,
            instance,
            new_id,
            member.member_id,
        )
        # Its subscription bytes differ after a restart (it owns nothing yet): what
        # matters is that it still supports the generation's protocol, as Kafka checks.
        keeps = group.protocol_name in {name for name, _ in protocols}
        group.replace_static(member, new_id)
        member.client_id, member.client_host = ctx.client_id or "", ctx.peer
        if group.state is GroupState.STABLE and keeps:
            member.protocols = protocols
            self._heard_from(member)
            self._persist_in_background(group)  # the new id, for a coordinator that loads it
            return self._join_answer(group, member)
        return await self._rejoin(group, new_id, req, protocols)

    async def _rejoin(
        self,
        group: Group,
        member_id: str,
        req: JoinGroupRequest,
        protocols: list[tuple[str, bytes]],
    ) -> JoinGroupResponse:
        """A JoinGroup from a member of the group."""
        member = group.members.get(member_id)
        if member is None:
            return _join_error(ErrorCode.UNKNOWN_MEMBER_ID, member_id)
        unchanged = member.protocols == protocols
        if group.state is GroupState.COMPLETING_REBALANCE and unchanged:
            # Its JoinGroup answer was lost: the same generation again.
            return self._join_answer(group, member)
        if group.state is GroupState.STABLE and unchanged and member.member_id != group.leader:
            return self._join_answer(group, member)
        member.protocols = protocols
        member.rebalance_timeout_ms = _rebalance_timeout(req)
        member.session_timeout_ms = req.session_timeout_ms
        future = self._await_join(member)
        if group.state is GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(group)
        else:
            self._prepare_rebalance(group, f"member {member.member_id} rejoined")
        return await _answer(future)

    def _member(
        self,
        member_id: str,
        ctx: RequestContext,
        req: JoinGroupRequest,
        protocols: list[tuple[str, bytes]],
    ) -> Member:
        return Member(
            member_id=member_id,
            group_instance_id=req.group_instance_id,
            client_id=ctx.client_id or "",
            client_host=ctx.peer,
            rebalance_timeout_ms=_rebalance_timeout(req),
            session_timeout_ms=req.session_timeout_ms,
            protocol_type=req.protocol_type,
            protocols=protocols,
        )

    async def _add_member(self, group: Group, member: Member) -> JoinGroupResponse:
        group.members[member.member_id] = member
        if group.protocol_type is None or len(group.members) == 1:
            group.protocol_type = member.protocol_type
        future = self._await_join(member)
        log.info(
            "group %s: member %s joined (%d members)",
            group.group_id,
            member.member_id,
            len(group.members),
        )
        if group.state is GroupState.PREPARING_REBALANCE:
            if group.initial_delay_deadline is not None:
                self._extend_initial_delay(group)
            else:
                self._maybe_complete_join(group)
        else:
            self._prepare_rebalance(group, f"member {member.member_id} joined")
        return await _answer(future)

    @staticmethod
    def _await_join(member: Member) -> asyncio.Future[JoinGroupResponse]:
        """What the member's JoinGroup waits for: the one its earlier JoinGroup still
        waits for, if any (a retry on another connection), so that both are answered."""
        future = member.awaiting_join
        if future is None or future.done():
            future = member.awaiting_join = asyncio.get_running_loop().create_future()
        return future

    # ------------------------------------------------------------------ the join phase

    def _prepare_rebalance(self, group: Group, reason: str) -> None:
        if group.state is GroupState.COMPLETING_REBALANCE:
            self._answer_syncs(group, SyncGroupResponse(error_code=ErrorCode.REBALANCE_IN_PROGRESS))
        was_empty = group.state is GroupState.EMPTY
        group.transition(GroupState.PREPARING_REBALANCE, self.now_ms())
        log.info(
            "group %s: rebalancing from generation %d: %s", group.group_id, group.generation, reason
        )
        self._cancel_timer(group)
        now = self._time()
        timeout = group.max_rebalance_timeout_ms() / 1000
        delay = self.settings.initial_rebalance_delay_ms / 1000
        if was_empty and delay > 0:
            # Kafka's InitialDelayedJoin: wait for more of a starting group's members
            # (each new one extends the wait), at most the rebalance timeout.
            group.initial_delay_deadline = now + timeout
            self._schedule(group, min(now + delay, group.initial_delay_deadline))
            return
        self._schedule(group, now + timeout)
        self._maybe_complete_join(group)

    def _extend_initial_delay(self, group: Group) -> None:
        assert group.initial_delay_deadline is not None
        self._cancel_timer(group)
        delay = self.settings.initial_rebalance_delay_ms / 1000
        self._schedule(group, min(self._time() + delay, group.initial_delay_deadline))

    def _schedule(self, group: Group, when: float) -> None:
        group.join_timer = asyncio.get_running_loop().call_at(when, self._join_timer_fired, group)

    @staticmethod
    def _cancel_timer(group: Group) -> None:
        if group.join_timer is not None:
            group.join_timer.cancel()
            group.join_timer = None

    def _join_timer_fired(self, group: Group) -> None:
        group.join_timer = None
        if group.state is not GroupState.PREPARING_REBALANCE:
            return
        deadline = group.initial_delay_deadline
        if deadline is not None:
            group.initial_delay_deadline = None
            if not group.all_joined() and self._time() < deadline:
                self._schedule(group, deadline)  # the rest of the rebalance timeout
                return
        self._complete_join(group)

    def _maybe_complete_join(self, group: Group) -> None:
        if (
            group.state is GroupState.PREPARING_REBALANCE
            and group.initial_delay_deadline is None
            and group.all_joined()
        ):
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        """The next generation: members that did not rejoin are removed, a protocol
        and a leader chosen, every waiting JoinGroup answered."""
        self._cancel_timer(group)
        group.initial_delay_deadline = None
        for member in [m for m in group.members.values() if m.awaiting_join is None]:
            log.info(
                "group %s: member %s removed: it did not rejoin within the rebalance timeout",
                group.group_id,
                member.member_id,
            )
            self._drop_member(group, member, ErrorCode.UNKNOWN_MEMBER_ID)
        group.pending.clear()
        # An int32 on the wire: past the last one it starts over (a stored generation
        # near it, however it got there, must not make every later answer unencodable).
        group.generation = group.generation + 1 if group.generation < _GENERATION_MAX else 1
        if not group.members:
            group.protocol_name = group.leader = None
            group.transition(GroupState.EMPTY, self.now_ms())
            log.info("group %s: empty at generation %d", group.group_id, group.generation)
            self._persist_in_background(group)
            return
        group.protocol_name = group.select_protocol()
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.transition(GroupState.COMPLETING_REBALANCE, self.now_ms())
        log.info(
            "group %s: generation %d formed: %d members, protocol %s, leader %s",
            group.group_id,
            group.generation,
            len(group.members),
            group.protocol_name,
            group.leader,
        )
        now = self._time()
        for member in group.members.values():
            future, member.awaiting_join = member.awaiting_join, None
            member.session_deadline = now + member.session_timeout_ms / 1000
            if future is not None and not future.done():
                future.set_result(self._join_answer(group, member))
        # The assignment must come within the rebalance timeout (Kafka's pending-sync
        # bound): a leader that never sends it, while heartbeating, cannot hold the
        # generation and its members' SyncGroups forever.
        group.join_timer = asyncio.get_running_loop().call_at(
            now + group.max_rebalance_timeout_ms() / 1000,
            self._sync_timer_fired,
            group,
            group.generation,
        )

    def _sync_timer_fired(self, group: Group, generation: int) -> None:
        group.join_timer = None
        if group.state is not GroupState.COMPLETING_REBALANCE or group.generation != generation:
            return
        for member in [m for m in group.members.values() if m.awaiting_sync is None]:
            log.info(
                "group %s: member %s removed: no SyncGroup within the rebalance timeout",
                group.group_id,
                member.member_id,
            )
            self._drop_member(group, member, ErrorCode.UNKNOWN_MEMBER_ID)
        self._prepare_rebalance(group, "the generation's assignment did not come in time")

    def _join_answer(self, group: Group, member: Member) -> JoinGroupResponse:
        assert group.protocol_name is not None
        protocol = group.protocol_name
        members = (
            [
                JoinGroupResponseMember(
                    member_id=m.member_id,
                    group_instance_id=m.group_instance_id,
                    metadata=m.metadata(protocol),
                )
                for m in group.members.values()
            ]
            if member.member_id == group.leader
            else []
        )
        return JoinGroupResponse(
            generation_id=group.generation,
            protocol_name=protocol,
            leader=group.leader or "",
            member_id=member.member_id,
            members=members,
        )

    # ------------------------------------------------------------------ SyncGroup

    async def sync(self, group: Group | None, req: SyncGroupRequest) -> SyncGroupResponse:
        member, error = self._known(group, req.member_id, req.generation_id, req.group_instance_id)
        if member is None or group is None:
            return SyncGroupResponse(error_code=error)
        if group.state is GroupState.PREPARING_REBALANCE:
            return SyncGroupResponse(error_code=ErrorCode.REBALANCE_IN_PROGRESS)
        self._heard_from(member)
        if group.state is GroupState.STABLE:
            return SyncGroupResponse(assignment=member.assignment)
        assert group.state is GroupState.COMPLETING_REBALANCE, group.state
        future = member.awaiting_sync  # an earlier SyncGroup of its own still waiting
        if future is None or future.done():
            future = member.awaiting_sync = asyncio.get_running_loop().create_future()
        if member.member_id == group.leader:
            assignments = {a.member_id: bytes(a.assignment) for a in req.assignments}
            await self._complete_sync(group, assignments)
        return await _answer(future)

    async def _complete_sync(self, group: Group, assignments: dict[str, bytes]) -> None:
        """The leader's assignments stored and handed out. As Kafka's coordinator:
        ids not in the group are ignored (neither stored nor answered), and members
        the leader left out get an empty assignment, with a warning naming them (a
        leader's assignor that misnames members shows up here)."""
        generation = group.generation
        missing = [m for m in group.members if m not in assignments]
        if missing:
            log.warning(
                "group %s: empty assignments for members %s for generation %d: the "
                "leader's SyncGroup gave them none",
                group.group_id,
                missing,
                generation,
            )
        error = await self.persist(group, assignments)
        if group.state is not GroupState.COMPLETING_REBALANCE or group.generation != generation:
            return  # the rebalance moved on while the record was written
        if error != ErrorCode.NONE:
            log.warning(
                "group %s: cannot store generation %d: %s", group.group_id, generation, error.name
            )
            self._answer_syncs(group, SyncGroupResponse(error_code=error))
            self._prepare_rebalance(group, f"storing the assignment failed ({error.name})")
            return
        self._cancel_timer(group)  # the assignment came in time
        for member_id, member in group.members.items():
            member.assignment = assignments.get(member_id, b"")
        group.transition(GroupState.STABLE, self.now_ms())
        log.info("group %s: generation %d is stable", group.group_id, generation)
        for member in group.members.values():
            future, member.awaiting_sync = member.awaiting_sync, None
            self._heard_from(member)
            if future is not None and not future.done():
                future.set_result(SyncGroupResponse(assignment=member.assignment))

    @staticmethod
    def _answer_syncs(group: Group, answer: SyncGroupResponse) -> None:
        for member in group.members.values():
            future, member.awaiting_sync = member.awaiting_sync, None
            if future is not None and not future.done():
                future.set_result(answer)

    # ------------------------------------------------------------------ Heartbeat, leave

    def heartbeat(self, group: Group | None, req: HeartbeatRequest) -> HeartbeatResponse:
        member, error = self._known(group, req.member_id, req.generation_id, req.group_instance_id)
        if member is None or group is None:
            return HeartbeatResponse(error_code=error)
        self._heard_from(member)
        if group.state is GroupState.PREPARING_REBALANCE:
            return HeartbeatResponse(error_code=ErrorCode.REBALANCE_IN_PROGRESS)
        return HeartbeatResponse()

    def leave(self, group: Group | None, req: LeaveGroupRequest) -> LeaveGroupResponse:
        if group is None or group.state is GroupState.DEAD:
            return LeaveGroupResponse(error_code=ErrorCode.UNKNOWN_MEMBER_ID)
        if group.pending.pop(req.member_id, None) is not None:
            self._maybe_complete_join(group)
            return LeaveGroupResponse()
        member = group.members.get(req.member_id)
        if member is None:
            return LeaveGroupResponse(error_code=ErrorCode.UNKNOWN_MEMBER_ID)
        log.info("group %s: member %s left", group.group_id, member.member_id)
        self._remove_member(group, member)
        return LeaveGroupResponse()

    def expire_sessions(self, groups: dict[str, Group]) -> None:
        """Remove members whose session expired (no heartbeat, commit or join within
        their session timeout) and member ids handed out but never used."""
        now = self._time()
        for group in list(groups.values()):
            for member_id, deadline in list(group.pending.items()):
                if deadline < now:
                    del group.pending[member_id]
                    self._maybe_complete_join(group)
            for member in list(group.members.values()):
                if not member.kept_alive and member.session_deadline < now:
                    log.info(
                        "group %s: member %s removed: no heartbeat within its session "
                        "timeout of %d ms",
                        group.group_id,
                        member.member_id,
                        member.session_timeout_ms,
                    )
                    self._remove_member(group, member)

    @staticmethod
    def forget_unformed(groups: dict[str, Group], stored: Callable[[str], bool]) -> None:
        """Drop the groups that hold nothing: no member, no member id handed out, never
        a generation, nothing `stored` (committed offsets): what JoinGroups with new
        group ids that were never followed up leave, so that they cannot pile up."""
        for group_id, group in list(groups.items()):
            if (
                group.state is GroupState.EMPTY
                and group.generation == 0
                and not group.members
                and not group.pending
                and not stored(group_id)
            ):
                del groups[group_id]

    def _remove_member(self, group: Group, member: Member) -> None:
        self._drop_member(group, member, ErrorCode.UNKNOWN_MEMBER_ID)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, f"member {member.member_id} is gone")
        else:
            self._maybe_complete_join(group)

    @staticmethod
    def _drop_member(group: Group, member: Member, error: ErrorCode) -> None:
        del group.members[member.member_id]
        instance = member.group_instance_id
        if instance is not None and group.static.get(instance) == member.member_id:
            del group.static[instance]
        if group.leader == member.member_id:
            group.leader = next(iter(group.members), None)
        _answer_waiters(member, error)

    # ------------------------------------------------------------------ checks

    def _known(
        self, group: Group | None, member_id: str, generation: int, instance_id: str | None
    ) -> tuple[Member | None, ErrorCode]:
        """The member a SyncGroup or Heartbeat is from, or why it is refused."""
        if group is None or group.state is GroupState.EMPTY:
            return None, ErrorCode.UNKNOWN_MEMBER_ID
        if group.state is GroupState.DEAD:
            return None, ErrorCode.COORDINATOR_NOT_AVAILABLE
        if group.fenced(instance_id, member_id):
            return None, ErrorCode.FENCED_INSTANCE_ID
        member = group.members.get(member_id)
        if member is None:
            return None, ErrorCode.UNKNOWN_MEMBER_ID
        if generation != group.generation:
            return None, ErrorCode.ILLEGAL_GENERATION
        return member, ErrorCode.NONE

    def commit_allowed(
        self, group: Group | None, generation: int, member_id: str, instance_id: str | None = None
    ) -> ErrorCode:
        """Kafka's OffsetCommit checks: a consumer outside any group (generation -1, no
        member id) commits to a group without members; a member commits in its own
        generation only (a zombie left behind by a rebalance gets ILLEGAL_GENERATION),
        and not while the generation's assignment is being handed out."""
        if group is None:
            return ErrorCode.NONE if generation < 0 else ErrorCode.ILLEGAL_GENERATION
        if group.state is GroupState.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if group.fenced(instance_id, member_id):
            return ErrorCode.FENCED_INSTANCE_ID
        if generation < 0 and not member_id and group.state is GroupState.EMPTY:
            return ErrorCode.NONE
        if group.state is GroupState.COMPLETING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if generation != group.generation:
            return ErrorCode.ILLEGAL_GENERATION
        self._heard_from(member)
        return ErrorCode.NONE

    def _heard_from(self, member: Member) -> None:
        member.session_deadline = self._time() + member.session_timeout_ms / 1000

    # ------------------------------------------------------------------ lifecycle

    def _persist_in_background(self, group: Group) -> None:
        task = asyncio.get_running_loop().create_task(
            self.persist(group, None), name=f"store-group-{group.group_id}"
        )
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def unload(self, group: Group, error: ErrorCode) -> None:
        """The coordinator no longer owns the group: every waiting request is answered
        `error` (NOT_COORDINATOR: the members find the new coordinator and rejoin)."""
        self._cancel_timer(group)
        for member in list(group.members.values()):
            _answer_waiters(member, error)
        if group.state is not GroupState.DEAD:
            group.transition(GroupState.DEAD, self.now_ms())

    def loaded(self, group: Group) -> None:
        """A group read from the log: its members get a fresh session (the coordinator
        moved; heartbeats to the old one did not reach here)."""
        now = self._time()
        for member in group.members.values():
            member.session_deadline = now + member.session_timeout_ms / 1000
            if member.group_instance_id is not None:
                group.static[member.group_instance_id] = member.member_id


async def _answer(future: asyncio.Future[T]) -> T:
    """A request's wait for its answer. Two requests of one member may wait for the same
    answer (a JoinGroup or SyncGroup sent again on another connection while the first
    waits): one whose connection closes must not cancel the other's."""
    return await asyncio.shield(future)


def _answer_waiters(member: Member, error: ErrorCode) -> None:
    """The member's waiting JoinGroup and SyncGroup are answered `error`."""
    if member.awaiting_join is not None and not member.awaiting_join.done():
        member.awaiting_join.set_result(_join_error(error, member.member_id))
    if member.awaiting_sync is not None and not member.awaiting_sync.done():
        member.awaiting_sync.set_result(SyncGroupResponse(error_code=error))
    member.awaiting_join = member.awaiting_sync = None


def _rebalance_timeout(req: JoinGroupRequest) -> int:
    return req.rebalance_timeout_ms if req.rebalance_timeout_ms > 0 else req.session_timeout_ms


def _join_error(error: ErrorCode, member_id: str) -> JoinGroupResponse:
    return JoinGroupResponse(error_code=error, member_id=member_id)


def describe(group: Group) -> DescribedGroup:
    """DescribeGroups' view, as Kafka's GroupMetadata.summary: the protocol and the
    members' subscriptions and assignments only of a Stable group. In a rebalance a
    member may have rejoined with protocols without the last generation's (so no
    subscription of it to show), and the assignments are the last generation's."""
    protocol = group.protocol_name if group.state is GroupState.STABLE else None
    return DescribedGroup(
        group_id=group.group_id,
        group_state=group.state.value,
        protocol_type=group.protocol_type or "",
        protocol_data=protocol or "",
        generation_id=group.generation,
        members=[
            DescribedGroupMember(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                member_metadata=m.metadata(protocol) if protocol else b"",
                member_assignment=m.assignment if protocol else b"",
            )
            for m in group.members.values()
        ],
    )
