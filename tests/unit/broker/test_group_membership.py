"""The classic rebalance protocol on the coordinator (broker/groups/membership.py), with a
real ReplicaManager and a real `__consumer_offsets` log (one broker), short timeouts.
Each scenario names the invariant it protects:

- a generation forms only from members that joined it, with one leader who alone gets
  the members' subscriptions, and every member gets the leader's assignment for it;
- a member that does not rejoin within the rebalance timeout, or stops heartbeating
  for its session timeout, is removed and the others rebalance without it;
- a commit is accepted only from a member of the current generation (a zombie left
  behind is fenced), or from a consumer outside any group when the group has no members;
- a group survives its coordinator moving: reloaded from the log at its generation;
- only an empty group is deleted, with its committed offsets;
- JoinGroups that never form a group (refused, or a member id never used) leave nothing
  behind: a flood of new group ids cannot grow the coordinator's memory.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from broker.group_coordinator import OFFSETS_TOPIC
from broker.group_coordinator import GroupCoordinator
from broker.group_coordinator import partition_for
from protocol.errors import ErrorCode
from protocol.messages import DeleteGroupsRequest
from protocol.messages import DescribeGroupsRequest
from protocol.messages import HeartbeatRequest
from protocol.messages import JoinGroupRequest
from protocol.messages import JoinGroupRequestProtocol
from protocol.messages import JoinGroupResponse
from protocol.messages import LeaveGroupRequest
from protocol.messages import ListGroupsRequest
from protocol.messages import OffsetCommitPartition
from protocol.messages import OffsetCommitRequest
from protocol.messages import OffsetCommitTopic
from protocol.messages import OffsetFetchRequest
from protocol.messages import SyncGroupRequest
from protocol.messages import SyncGroupRequestAssignment
from runtime.server import RequestContext
from tests.unit.broker.broker_harness import Harness
from tests.unit.broker.test_group_coordinator import FakeController
from tests.unit.broker.test_group_coordinator import _register
from tests.unit.broker.test_group_coordinator import _until

GROUP = "g"
SESSION_MS = 400
REBALANCE_MS = 600


def ctx(client: str) -> RequestContext:
    return RequestContext(listener="PLAINTEXT", peer="10.0.0.1", client_id=client, api_version=0)


async def coordinator_of(h: Harness, **settings: Any) -> GroupCoordinator:
    await _register(h, 1, 2)
    await h.create_topic("t", 4)
    await h.create_topic(OFFSETS_TOPIC, 3)
    config = dataclasses.replace(
        h.config,
        group_min_session_timeout_ms=100,
        group_initial_rebalance_delay_ms=0,
        **settings,
    )
    c = GroupCoordinator(
        config=config, image=h.image, replica_manager=h.rm, controller=FakeController()
    )
    # Leadership was taken before the coordinator listened: hand it over as the broker does.
    for p in h.rm.partitions.values():
        c.on_leadership(p, True)
    index = partition_for(GROUP, 3)
    await _until(lambda: index in c._shards and c._shards[index].cache is not None)
    return c


def join_request(member_id: str, subscription: bytes = b"sub", **kw: Any) -> JoinGroupRequest:
    return JoinGroupRequest(
        group_id=kw.get("group", GROUP),
        session_timeout_ms=kw.get("session", SESSION_MS),
        rebalance_timeout_ms=kw.get("rebalance", REBALANCE_MS),
        member_id=member_id,
        group_instance_id=kw.get("instance"),
        protocol_type="consumer",
        protocols=kw.get(
            "protocols", [JoinGroupRequestProtocol(name="range", metadata=subscription)]
        ),
    )


async def new_member_id(c: GroupCoordinator, client: str) -> str:
    """A first JoinGroup: MEMBER_ID_REQUIRED with the id to join with."""
    first = await c.join_group(ctx(client), join_request(""))
    assert first.error_code == ErrorCode.MEMBER_ID_REQUIRED
    assert first.member_id.startswith(f"{client}-")
    return first.member_id


def join(c: GroupCoordinator, member_id: str, **kw: Any) -> asyncio.Task[JoinGroupResponse]:
    return asyncio.create_task(c.join_group(ctx(member_id), join_request(member_id, **kw)))


async def sync(
    c: GroupCoordinator,
    member_id: str,
    generation: int,
    plan: dict[str, bytes] | None = None,
) -> Any:
    return await c.sync_group(
        ctx(member_id),
        SyncGroupRequest(
            group_id=GROUP,
            generation_id=generation,
            member_id=member_id,
            assignments=[
                SyncGroupRequestAssignment(member_id=m, assignment=a)
                for m, a in (plan or {}).items()
            ],
        ),
    )


def heartbeat(c: GroupCoordinator, member_id: str, generation: int) -> Any:
    return c.heartbeat(
        ctx(member_id),
        HeartbeatRequest(group_id=GROUP, generation_id=generation, member_id=member_id),
    )


def commit(member_id: str, generation: int, offset: int) -> OffsetCommitRequest:
    return OffsetCommitRequest(
        group_id=GROUP,
        generation_id=generation,
        member_id=member_id,
        topics=[
            OffsetCommitTopic(
                name="t",
                partitions=[OffsetCommitPartition(partition_index=0, committed_offset=offset)],
            )
        ],
    )


async def committed(c: GroupCoordinator) -> int:
    resp = await c.offset_fetch(ctx("x"), OffsetFetchRequest(group_id=GROUP))
    return resp.topics[0].partitions[0].committed_offset if resp.topics else -1


async def state(c: GroupCoordinator) -> tuple[str, int, list[str]]:
    resp = await c.describe_groups(ctx("x"), DescribeGroupsRequest(groups=[GROUP]))
    g = resp.groups[0]
    return g.group_state, g.generation_id, sorted(m.member_id for m in g.members)


async def stable_pair(c: GroupCoordinator) -> tuple[str, str, int]:
    """Members a and b in a Stable generation, a the leader; (a, b, generation)."""
    a = await new_member_id(c, "a")
    a_join = await join(c, a)
    assert (a_join.generation_id, a_join.leader) == (1, a)
    b = await new_member_id(c, "b")
    b_join = join(c, b)
    await asyncio.sleep(0.05)
    assert (await heartbeat(c, a, 1)).error_code == ErrorCode.REBALANCE_IN_PROGRESS
    a_join, b_join = await asyncio.gather(join(c, a), b_join)
    generation = a_join.generation_id
    assert generation == b_join.generation_id == 2
    assert a_join.leader == b_join.leader == a
    plan = {a: b"to-a", b: b"to-b"}
    a_sync, b_sync = await asyncio.gather(sync(c, a, generation, plan), sync(c, b, generation))
    assert (a_sync.assignment, b_sync.assignment) == (b"to-a", b"to-b")
    return a, b, generation


async def test_a_generation_forms_from_the_members_that_joined_it(harness: Harness) -> None:
    c = await coordinator_of(harness)
    a = await new_member_id(c, "a")
    first = await join(c, a, subscription=b"a-sub")
    # The only member leads, and the leader alone is told the members' subscriptions.
    assert (first.error_code, first.generation_id, first.leader, first.protocol_name) == (
        0,
        1,
        a,
        "range",
    )
    assert [(m.member_id, m.metadata) for m in first.members] == [(a, b"a-sub")]
    assert (await state(c))[0] == "CompletingRebalance"
    assert (await sync(c, a, 1, {a: b"parts"})).assignment == b"parts"
    assert await state(c) == ("Stable", 1, [a])

    b = await new_member_id(c, "b")
    b_join = join(c, b, subscription=b"b-sub")
    await asyncio.sleep(0.05)
    a_join = join(c, a, subscription=b"a-sub")
    a_answer, b_answer = await asyncio.gather(a_join, b_join)
    assert a_answer.generation_id == b_answer.generation_id == 2
    assert {(m.member_id, m.metadata) for m in a_answer.members} == {(a, b"a-sub"), (b, b"b-sub")}
    assert b_answer.members == []  # a follower learns nothing of the others
    # A follower's SyncGroup waits for the leader's assignment.
    b_sync = asyncio.create_task(sync(c, b, 2))
    await asyncio.sleep(0.05)
    assert not b_sync.done()
    a_sync = await sync(c, a, 2, {a: b"p0", b: b"p1"})
    assert (a_sync.assignment, (await b_sync).assignment) == (b"p0", b"p1")
    assert await state(c) == ("Stable", 2, sorted([a, b]))
    c.close()


async def test_a_member_that_does_not_rejoin_in_time_is_left_out(harness: Harness) -> None:
    c = await coordinator_of(harness)
    a, b, generation = await stable_pair(c)
    newcomer = await new_member_id(c, "c")
    n_join = join(c, newcomer)
    a_join = join(c, a)  # b never rejoins
    a_answer, n_answer = await asyncio.gather(a_join, n_join)
    assert a_answer.generation_id == n_answer.generation_id == generation + 1
    assert {m.member_id for m in a_answer.members} == {a, newcomer}
    await asyncio.gather(
        sync(c, a, generation + 1, {a: b"x", newcomer: b"y"}), sync(c, newcomer, generation + 1)
    )
    # b is gone: its heartbeat, sync and commit are refused.
    assert (await heartbeat(c, b, generation)).error_code == ErrorCode.UNKNOWN_MEMBER_ID
    resp = await c.offset_commit(ctx(b), commit(b, generation, 5))
    assert resp.topics[0].partitions[0].error_code == ErrorCode.UNKNOWN_MEMBER_ID
    c.close()


async def test_a_silent_member_is_removed_after_its_session_timeout(harness: Harness) -> None:
    c = await coordinator_of(harness)
    a, _silent, generation = await stable_pair(c)
    answer = None
    for _ in range(20):
        answer = await heartbeat(c, a, generation)
        if answer.error_code != ErrorCode.NONE:
            break
        await asyncio.sleep(SESSION_MS / 1000 / 4)
    assert answer is not None and answer.error_code == ErrorCode.REBALANCE_IN_PROGRESS
    alone = await join(c, a)
    assert alone.generation_id == generation + 1
    assert [m.member_id for m in alone.members] == [a]
    c.close()


async def test_a_zombie_cannot_commit(harness: Harness) -> None:
    """Fencing: a member left behind by a rebalance (an old generation) or removed from
    the group cannot overwrite the commits of the partitions' new owners."""
    c = await coordinator_of(harness)
    a, b, generation = await stable_pair(c)
    ok = await c.offset_commit(ctx(a), commit(a, generation, 10))
    assert ok.topics[0].partitions[0].error_code == ErrorCode.NONE
    # The group moves on to the next generation (b leaves); a's old generation is stale.
    assert (
        await c.leave_group(ctx(b), LeaveGroupRequest(group_id=GROUP, member_id=b))
    ).error_code == 0
    rejoined = await join(c, a)
    assert rejoined.generation_id == generation + 1
    # While the new generation's assignment is handed out, no member commits.
    during = await c.offset_commit(ctx(a), commit(a, generation + 1, 11))
    assert during.topics[0].partitions[0].error_code == ErrorCode.REBALANCE_IN_PROGRESS
    await sync(c, a, generation + 1, {a: b"all"})
    stale = await c.offset_commit(ctx(a), commit(a, generation, 99))
    assert stale.topics[0].partitions[0].error_code == ErrorCode.ILLEGAL_GENERATION
    gone = await c.offset_commit(ctx(b), commit(b, generation + 1, 99))
    assert gone.topics[0].partitions[0].error_code == ErrorCode.UNKNOWN_MEMBER_ID
    outsider = await c.offset_commit(ctx("simple"), commit("", -1, 99))
    assert outsider.topics[0].partitions[0].error_code == ErrorCode.UNKNOWN_MEMBER_ID
    assert await committed(c) == 10  # no refused commit reached the log
    current = await c.offset_commit(ctx(a), commit(a, generation + 1, 12))
    assert current.topics[0].partitions[0].error_code == ErrorCode.NONE
    assert await committed(c) == 12
    c.close()


async def test_the_group_survives_its_coordinator_moving(harness: Harness) -> None:
    """The generation, its members and their assignments are in the log: a coordinator
    that takes over serves heartbeats of the same generation without a rebalance."""
    h = harness
    c = await coordinator_of(h)
    a, b, generation = await stable_pair(c)
    await c.offset_commit(ctx(a), commit(a, generation, 7))
    index = partition_for(GROUP, 3)
    await h.set_partition(OFFSETS_TOPIC, index, leader=2, leader_epoch=1, replicas=[1, 2])
    assert (await heartbeat(c, a, generation)).error_code == ErrorCode.NOT_COORDINATOR
    await h.set_partition(OFFSETS_TOPIC, index, leader=1, leader_epoch=2, replicas=[1], isr=[1])
    await _until(lambda: index in c._shards and c._shards[index].cache is not None)
    assert await state(c) == ("Stable", generation, sorted([a, b]))
    assert (await heartbeat(c, a, generation)).error_code == ErrorCode.NONE
    assert (await sync(c, b, generation)).assignment == b"to-b"
    assert await committed(c) == 7
    c.close()


async def test_only_an_empty_group_is_deleted_with_its_offsets(harness: Harness) -> None:
    c = await coordinator_of(harness)
    a, b, generation = await stable_pair(c)
    await c.offset_commit(ctx(a), commit(a, generation, 3))
    delete = DeleteGroupsRequest(groups_names=[GROUP, "never-seen"])
    results = (await c.delete_groups(ctx("admin"), delete)).results
    assert [r.error_code for r in results] == [
        ErrorCode.NON_EMPTY_GROUP,
        ErrorCode.GROUP_ID_NOT_FOUND,
    ]
    for member in (a, b):
        await c.leave_group(ctx(member), LeaveGroupRequest(group_id=GROUP, member_id=member))
    assert (await state(c))[0] == "Empty"
    listed = await c.list_groups(ctx("admin"), ListGroupsRequest())
    assert [(g.group_id, g.group_state) for g in listed.groups] == [(GROUP, "Empty")]
    results = (
        await c.delete_groups(ctx("admin"), DeleteGroupsRequest(groups_names=[GROUP]))
    ).results
    assert results[0].error_code == ErrorCode.NONE
    assert await committed(c) == -1
    assert (await c.list_groups(ctx("admin"), ListGroupsRequest())).groups == []
    c.close()


async def test_joins_that_cannot_be_served_are_refused(harness: Harness) -> None:
    c = await coordinator_of(harness, group_max_size=2)
    too_short = await c.join_group(ctx("x"), join_request("", session=50))
    assert too_short.error_code == ErrorCode.INVALID_SESSION_TIMEOUT
    a, _b, _ = await stable_pair(c)
    third = await c.join_group(ctx("c"), join_request(""))
    assert third.error_code == ErrorCode.GROUP_MAX_SIZE_REACHED
    other = [JoinGroupRequestProtocol(name="roundrobin", metadata=b"")]
    clash = await c.join_group(ctx("d"), join_request(a, protocols=other))
    assert clash.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    unknown = await c.join_group(ctx("e"), join_request("not-a-member"))
    assert unknown.error_code == ErrorCode.UNKNOWN_MEMBER_ID
    c.close()


async def test_joins_that_never_form_a_group_leave_nothing_behind(harness: Harness) -> None:
    """A client sending JoinGroups with ever new group ids (refused ones, and first
    joins whose member id it never uses) must not grow the coordinator: a refused join
    creates no group, an unused member id expires with its session timeout and its
    group, holding nothing, is forgotten. A group with committed offsets is kept."""
    c = await coordinator_of(harness)
    index = partition_for(GROUP, 3)
    ids = [g for g in (f"flood-{i}" for i in range(2_000)) if partition_for(g, 3) == index]
    groups = c._shards[index].groups
    for g in ids[:100]:  # no protocol in common with anything: refused
        refused = await c.join_group(ctx("x"), join_request("", group=g, protocols=[]))
        assert refused.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert groups.keys().isdisjoint(ids), "a refused JoinGroup created its group"
    for g in ids[100:]:  # a member id handed out, never used
        first = await c.join_group(ctx("x"), join_request("", group=g))
        assert first.error_code == ErrorCode.MEMBER_ID_REQUIRED
    listed = await c.list_groups(ctx("admin"), ListGroupsRequest())
    assert {g.group_id for g in listed.groups} >= set(ids[100:])
    simple = commit("", -1, 5)  # a consumer outside any group commits: offsets stored
    assert (await c.offset_commit(ctx("s"), simple)).topics[0].partitions[0].error_code == 0
    await _until(lambda: groups.keys().isdisjoint(ids), timeout=5 * SESSION_MS / 1000)
    listed = await c.list_groups(ctx("admin"), ListGroupsRequest())
    assert [(g.group_id, g.group_state) for g in listed.groups] == [(GROUP, "Empty")]
    assert await committed(c) == 5
    c.close()


async def test_a_static_member_restarts_without_a_rebalance(harness: Harness) -> None:
    """KIP-345: a member with a group.instance.id that comes back (a restart, a new
    member id) takes its old place and assignment in the same generation; the id it
    had before is fenced."""
    c = await coordinator_of(harness)
    first = await c.join_group(ctx("a"), join_request("", instance="inst-a"))
    a = first.member_id  # a static member needs no MEMBER_ID_REQUIRED round
    assert (first.error_code, first.generation_id) == (0, 1) and a.startswith("inst-a-")
    await sync(c, a, 1, {a: b"a-parts"})
    b = await new_member_id(c, "b")
    b_join = join(c, b)
    await asyncio.sleep(0.05)
    a_join = asyncio.create_task(c.join_group(ctx("a"), join_request(a, instance="inst-a")))
    a_answer, _ = await asyncio.gather(a_join, b_join)
    generation = a_answer.generation_id
    await asyncio.gather(sync(c, a, generation, {a: b"p0", b: b"p1"}), sync(c, b, generation))

    back = await c.join_group(ctx("a"), join_request("", instance="inst-a"))
    assert back.error_code == ErrorCode.NONE and back.generation_id == generation
    assert back.member_id != a and back.leader == back.member_id  # it led, it leads
    assert await state(c) == ("Stable", generation, sorted([back.member_id, b]))
    resumed = await c.sync_group(
        ctx("a"),
        SyncGroupRequest(
            group_id=GROUP,
            generation_id=generation,
            member_id=back.member_id,
            group_instance_id="inst-a",
        ),
    )
    assert resumed.assignment == b"p0"
    zombie = await c.heartbeat(
        ctx("a"),
        HeartbeatRequest(
            group_id=GROUP, generation_id=generation, member_id=a, group_instance_id="inst-a"
        ),
    )
    assert zombie.error_code == ErrorCode.FENCED_INSTANCE_ID
    assert (await heartbeat(c, b, generation)).error_code == ErrorCode.NONE  # no rebalance
    c.close()


async def test_a_leader_that_never_assigns_is_removed_after_the_rebalance_timeout(
    harness: Harness,
) -> None:
    """Every wait is bounded: a leader that joins and heartbeats but never sends its
    SyncGroup cannot hold the generation; the follower waiting in SyncGroup is told to
    rejoin, and the group goes on without the leader."""
    c = await coordinator_of(harness)
    a = await new_member_id(c, "a")
    a_join = join(c, a, rebalance=300)
    b = await new_member_id(c, "b")
    b_join = join(c, b, rebalance=300)
    a_answer, _ = await asyncio.gather(a_join, b_join)
    generation = a_answer.generation_id
    leader = a_answer.leader
    follower = b if leader == a else a
    waiting = asyncio.create_task(sync(c, follower, generation))
    answer = await asyncio.wait_for(waiting, 5)  # no assignment ever comes
    assert answer.error_code == ErrorCode.REBALANCE_IN_PROGRESS
    assert (await heartbeat(c, leader, generation)).error_code == ErrorCode.UNKNOWN_MEMBER_ID
    again = await join(c, follower)
    assert again.generation_id > generation and [m.member_id for m in again.members] == [follower]
    c.close()


async def test_the_generation_starts_over_after_the_last_int32(harness: Harness) -> None:
    """A group at generation 2**31 - 1 (a stored record said so): the next generation
    was 2**31, which no Kafka answer can encode (every JoinGroup then closed the
    connection with a struct.error traceback; found by a hostile-disk session). It
    starts over at 1."""
    c = await coordinator_of(harness)
    a, b, _ = await stable_pair(c)
    c._shards[partition_for(GROUP, 3)].groups[GROUP].generation = 2**31 - 1
    a_join, b_join = await asyncio.gather(join(c, a), join(c, b))
    assert a_join.generation_id == b_join.generation_id == 1
