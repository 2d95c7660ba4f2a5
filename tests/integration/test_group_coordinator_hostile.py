"""The group coordinator attacked from outside, as a hostile or broken client would, on
real processes over raw frames (each test failed before its fix):

- Committed offsets outlived their topic: after a DeleteTopics, OffsetFetch still
  answered them, and a topic created again under the name inherited them, so a group
  resumed the new topic at the old topic's offsets and skipped its first records.
  Kafka's coordinator removes the offsets of deleted partitions (onPartitionsDeleted,
  tombstones in __consumer_offsets); so does minibroker's now, and a restart keeps
  them removed.
- DescribeGroups failed (UNKNOWN_SERVER_ERROR, an AssertionError's traceback in the
  broker's log) while a member that had rejoined with other protocols waited for the
  rest of the group: the answer looked up each member's subscription for the last
  generation's protocol, which that member no longer had. Kafka's coordinator shows the
  protocol, subscriptions and assignments of a Stable group only; so does minibroker's
  now (`minibroker group describe` and Kafka's tools read it).
- A group whose metadata record (its members' subscriptions and assignments) is larger
  than `__consumer_offsets`' max.message.bytes cannot complete a generation: its
  SyncGroup was answered INVALID_COMMIT_OFFSET_SIZE, an OffsetCommit error that says
  nothing to a SyncGroup, with the cause in an INFO line. Kafka's coordinator answers
  UNKNOWN_SERVER_ERROR and logs the cause as an error; so does minibroker's now (a
  WARNING naming the group, its members and their bytes).
- A member's JoinGroup sent again while its first still waited (a client retrying
  on another connection, or pipelining on the same one) took over the wait: the
  first was never answered, and on the same connection every later answer queued
  behind it, the connection wedged for good. The same for SyncGroup. Now both
  requests get the answer, and one whose connection closes does not take the other's
  wait with it.
- A JoinGroup with an empty protocol type formed a group, whose record stored no
  type; read back by a restarted coordinator, the group's own members could not join
  again (INCONSISTENT_GROUP_PROTOCOL against a type they had never sent). Kafka
  refuses an empty protocol type for a group's first member (supportsProtocols); so
  does minibroker now, on both listeners.
- DeleteGroups kept the group in memory while its tombstones were written, so a
  member could join it meanwhile: its SyncGroup was answered GROUP_ID_NOT_FOUND once
  the deletion landed, though its generation's record followed the tombstones in the
  log (a restarted coordinator would bring back a member nobody ran); and offsets
  committed meanwhile were answered by OffsetFetch for a group that ListGroups,
  DescribeGroups and DeleteGroups no longer knew. As Kafka's coordinator, the group
  now leaves memory first: what comes meanwhile makes a new group, as the log has it.
"""

from __future__ import annotations

import asyncio
import re
import time

import pytest
from cluster import Cluster
from cluster import TestClient
from test_kafka_differences import create_request
from test_kafka_listener import kafka_request

from protocol.api import ApiKey
from protocol.errors import ErrorCode
from protocol.kafka.apis import JOIN_GROUP
from protocol.kafka.apis import OFFSET_FETCH
from protocol.kafka.membership_apis import DESCRIBE_GROUPS
from protocol.messages import DeleteGroupsRequest
from protocol.messages import DeleteGroupsResponse
from protocol.messages import DeleteTopicsRequest
from protocol.messages import DescribeGroupsRequest
from protocol.messages import DescribeGroupsResponse
from protocol.messages import FaultControlRequest
from protocol.messages import FaultRule
from protocol.messages import FindCoordinatorRequest
from protocol.messages import FindCoordinatorResponse
from protocol.messages import JoinGroupRequest
from protocol.messages import JoinGroupRequestProtocol
from protocol.messages import JoinGroupResponse
from protocol.messages import ListGroupsRequest
from protocol.messages import ListGroupsResponse
from protocol.messages import OffsetCommitPartition
from protocol.messages import OffsetCommitRequest
from protocol.messages import OffsetCommitResponse
from protocol.messages import OffsetCommitTopic
from protocol.messages import OffsetFetchRequest
from protocol.messages import OffsetFetchResponse
from protocol.messages import OffsetFetchTopic
from protocol.messages import SyncGroupRequest
from protocol.messages import SyncGroupRequestAssignment
from protocol.messages import SyncGroupResponse

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

WAIT_S = 20.0


def commit_request(group: str, topic: str, offsets: dict[int, int]) -> OffsetCommitRequest:
    """A commit from outside any group (generation -1, no member id)."""
    partitions = [
        OffsetCommitPartition(partition_index=p, committed_offset=o) for p, o in offsets.items()
    ]
    return OffsetCommitRequest(
        group_id=group,
        generation_id=-1,
        member_id="",
        topics=[OffsetCommitTopic(name=topic, partitions=partitions)],
    )


async def commit(client: TestClient, group: str, topic: str, offsets: dict[int, int]) -> None:
    """Commit, retrying while the coordinator is still being set up."""
    deadline = time.monotonic() + WAIT_S
    while True:
        resp = await client.call(commit_request(group, topic, offsets))
        assert isinstance(resp, OffsetCommitResponse)
        codes = {ErrorCode(p.error_code).name for t in resp.topics for p in t.partitions}
        if codes == {"NONE"}:
            return
        assert time.monotonic() < deadline, f"commit to {group} not accepted: {codes}"
        await asyncio.sleep(0.1)


def fetch_request(group: str, topic: str, partitions: int = 2) -> OffsetFetchRequest:
    return OffsetFetchRequest(
        group_id=group,
        topics=[OffsetFetchTopic(name=topic, partition_indexes=list(range(partitions)))],
    )


def offsets_of(resp: object) -> dict[int, int]:
    assert isinstance(resp, OffsetFetchResponse)
    assert resp.error_code == 0, ErrorCode(resp.error_code).name
    return {p.partition_index: p.committed_offset for t in resp.topics for p in t.partitions}


async def fetched(client: TestClient, group: str, topic: str) -> dict[int, int]:
    """The group's committed offsets of the topic, once the coordinator answers."""
    deadline = time.monotonic() + WAIT_S
    while True:
        resp = await client.call(fetch_request(group, topic))
        assert isinstance(resp, OffsetFetchResponse)
        if resp.error_code == 0:
            return offsets_of(resp)
        assert time.monotonic() < deadline, ErrorCode(resp.error_code).name
        await asyncio.sleep(0.1)


async def test_committed_offsets_of_a_deleted_topic_are_removed_with_it(
    cluster: Cluster,
) -> None:
    cluster.start_controller()
    broker = cluster.start_broker(1, kafka=True)
    async with TestClient(*broker.address) as client:
        await client.call(create_request("doomed", "kept", partitions=2))
        await commit(client, "readers", "doomed", {0: 5, 1: 7})
        await commit(client, "others", "doomed", {0: 3})
        await commit(client, "readers", "kept", {0: 11})
        assert await fetched(client, "readers", "doomed") == {0: 5, 1: 7}
        await client.call(DeleteTopicsRequest(topic_names=["doomed"]))
        deadline = time.monotonic() + WAIT_S
        while (after := await fetched(client, "readers", "doomed")) != {0: -1, 1: -1}:
            assert time.monotonic() < deadline, f"offsets of the deleted topic remain: {after}"
            await asyncio.sleep(0.1)
        assert await fetched(client, "others", "doomed") == {0: -1, 1: -1}
        # The same name again: a new topic, with no committed offsets.
        await client.call(create_request("doomed", partitions=2))
        assert await fetched(client, "readers", "doomed") == {0: -1, 1: -1}
    kafka = await kafka_request(
        broker.kafka_address, OFFSET_FETCH, 5, fetch_request("readers", "doomed")
    )
    assert offsets_of(kafka) == {0: -1, 1: -1}
    # The removal is in __consumer_offsets: a restarted coordinator loads it so.
    assert broker.terminate() == 0
    broker = cluster.start_broker(1)
    async with TestClient(*broker.address) as client:
        assert await fetched(client, "readers", "doomed") == {0: -1, 1: -1}
        assert await fetched(client, "others", "doomed") == {0: -1, 1: -1}
        assert await fetched(client, "readers", "kept") == {0: 11, 1: -1}
    removed = re.findall(
        r"removed (\d+) committed offsets of deleted topics \['doomed'\]",
        broker.log_text(since_start=False),
    )
    assert sum(int(n) for n in removed) == 3, removed


def join_request(
    group: str, member_id: str, *protocols: str, subscription: bytes = b""
) -> JoinGroupRequest:
    """A JoinGroup whose subscription for each protocol is the protocol's name (and
    `subscription` after it)."""
    return JoinGroupRequest(
        group_id=group,
        session_timeout_ms=30_000,
        rebalance_timeout_ms=30_000,
        member_id=member_id,
        protocols=[
            JoinGroupRequestProtocol(name=p, metadata=p.encode() + subscription) for p in protocols
        ],
    )


async def member_id_of(client: TestClient, group: str, *protocols: str) -> str:
    """The member id a first JoinGroup is given (MEMBER_ID_REQUIRED), once the
    coordinator answers."""
    deadline = time.monotonic() + WAIT_S
    while True:
        resp = await client.call(join_request(group, "", *protocols))
        assert isinstance(resp, JoinGroupResponse)
        if resp.error_code == ErrorCode.MEMBER_ID_REQUIRED:
            return resp.member_id
        assert time.monotonic() < deadline, ErrorCode(resp.error_code).name
        await asyncio.sleep(0.1)


async def rebalance(group: str, *joins: tuple[TestClient, str, tuple[str, ...]]) -> str:
    """Every (client, member id, protocols) joins and syncs: the generation's protocol."""
    answers = await asyncio.gather(
        *(c.call(join_request(group, m, *protocols)) for c, m, protocols in joins)
    )
    assert all(isinstance(a, JoinGroupResponse) and a.error_code == 0 for a in answers), answers
    generation = answers[0].generation_id  # type: ignore[attr-defined]
    syncs = await asyncio.gather(
        *(
            c.call(SyncGroupRequest(group_id=group, generation_id=generation, member_id=m))
            for c, m, _ in joins
        )
    )
    assert all(isinstance(s, SyncGroupResponse) and s.error_code == 0 for s in syncs), syncs
    return answers[0].protocol_name  # type: ignore[attr-defined,no-any-return]


def described(resp: object) -> tuple[int, str, str, list[bytes]]:
    assert isinstance(resp, DescribeGroupsResponse)
    (g,) = resp.groups
    return g.error_code, g.group_state, g.protocol_data, [m.member_metadata for m in g.members]


async def test_a_group_is_described_while_a_member_rejoins_with_other_protocols(
    cluster: Cluster,
) -> None:
    cluster.start_controller()
    broker = cluster.start_broker(1, "--group-initial-rebalance-delay-ms", "0", kafka=True)
    both = ("range", "roundrobin")
    async with (
        TestClient(*broker.address) as a,
        TestClient(*broker.address) as b,
        TestClient(*broker.address) as tool,
    ):
        first = await member_id_of(a, "switching", *both)
        assert await rebalance("switching", (a, first, both)) == "range"
        second = await member_id_of(b, "switching", *both)
        assert await rebalance("switching", (a, first, both), (b, second, both)) == "range"
        stable = described(await tool.call(DescribeGroupsRequest(groups=["switching"])))
        assert stable == (0, "Stable", "range", [b"range", b"range"])
        # The first member rejoins with roundrobin only and waits for the second.
        rejoin = a.send(join_request("switching", first, "roundrobin"))
        deadline = time.monotonic() + WAIT_S
        while (state := described(await tool.call(DescribeGroupsRequest(groups=["switching"]))))[
            1
        ] != "PreparingRebalance":
            assert time.monotonic() < deadline, state
            await asyncio.sleep(0.05)
        native = described(await tool.call(DescribeGroupsRequest(groups=["switching"])))
        kafka = described(
            await kafka_request(
                broker.kafka_address,
                DESCRIBE_GROUPS,
                4,
                DescribeGroupsRequest(groups=["switching"]),
            )
        )
        # The second member follows: the next generation uses roundrobin.
        answers = await asyncio.gather(
            a.receive(rejoin), b.call(join_request("switching", second, *both))
        )
        assert [getattr(r, "body", r).protocol_name for r in answers] == ["roundrobin"] * 2
    assert native == kafka == (0, "PreparingRebalance", "", [b"", b""]), (native, kafka)
    assert "AssertionError" not in broker.log_text()


async def test_a_group_record_too_large_to_store_is_unknown_server_error_with_a_warning(
    cluster: Cluster,
) -> None:
    cluster.start_controller()
    broker = cluster.start_broker(1, "--group-initial-rebalance-delay-ms", "0")
    async with TestClient(*broker.address) as client:
        member = await member_id_of(client, "bloated", "range")
        request = join_request("bloated", member, "range")
        request.protocols[0].metadata = b"s" * (2 << 20)  # 2 MiB: over the 1 MiB default
        joined = await client.call(request, timeout=30)
        assert isinstance(joined, JoinGroupResponse) and joined.error_code == 0
        synced = await client.call(
            SyncGroupRequest(
                group_id="bloated", generation_id=joined.generation_id, member_id=member
            ),
            timeout=30,
        )
    assert isinstance(synced, SyncGroupResponse)
    assert ErrorCode(synced.error_code).name == "UNKNOWN_SERVER_ERROR"
    warnings = [
        line
        for line in broker.log_text().splitlines()
        if "WARNING" in line and "bloated" in line and "could not be written" in line
    ]
    assert len(warnings) == 1 and "1 members, 2097152 bytes" in warnings[0], warnings
    assert re.search(r"WARNING .*MESSAGE_TOO_LARGE .*max\.message\.bytes", broker.log_text())


async def test_a_join_or_sync_sent_again_while_the_first_waits_answers_both(
    cluster: Cluster,
) -> None:
    cluster.start_controller()
    broker = cluster.start_broker(1, "--group-initial-rebalance-delay-ms", "0")
    addr = broker.address
    async with TestClient(*addr) as a, TestClient(*addr) as b, TestClient(*addr) as again:
        leader = await member_id_of(a, "retried", "range")
        assert await rebalance("retried", (a, leader, ("range",))) == "range"
        follower = await member_id_of(b, "retried", "range")
        await rebalance("retried", (a, leader, ("range",)), (b, follower, ("range",)))
        # The leader rejoins with a new subscription (a rebalance that waits for the
        # follower): on its own connection, again on another, and once more on one
        # that closes while it waits.
        first = a.send(join_request("retried", leader, "range", subscription=b"v2"))
        retry = again.send(join_request("retried", leader, "range", subscription=b"v2"))
        async with TestClient(*addr) as dropped:
            dropped.send(join_request("retried", leader, "range", subscription=b"v2"))
            await asyncio.sleep(0.3)
        joined = await asyncio.gather(
            b.call(join_request("retried", follower, "range")),
            a.receive(first),
            again.receive(retry),
        )
        generations = [getattr(r, "body", r).generation_id for r in joined]
        assert generations == [3, 3, 3], joined
        # The follower's SyncGroup twice on one connection, then the leader's.
        syncs = [
            b.send(SyncGroupRequest(group_id="retried", generation_id=3, member_id=follower))
            for _ in range(2)
        ]
        await asyncio.sleep(0.3)
        plan = [
            SyncGroupRequestAssignment(member_id=leader, assignment=b"l"),
            SyncGroupRequestAssignment(member_id=follower, assignment=b"f"),
        ]
        led = await a.call(
            SyncGroupRequest(
                group_id="retried", generation_id=3, member_id=leader, assignments=plan
            )
        )
        followed = [(await b.receive(c)).body for c in syncs]
    assert isinstance(led, SyncGroupResponse) and led.assignment == b"l"
    assert [getattr(f, "assignment", f) for f in followed] == [b"f", b"f"], followed


async def test_a_join_without_a_protocol_type_is_refused_as_by_kafka(cluster: Cluster) -> None:
    cluster.start_controller()
    broker = cluster.start_broker(1, kafka=True)
    async with TestClient(*broker.address) as client:
        await member_id_of(client, "typed", "range")  # the coordinator is up
        untyped = join_request("untyped", "", "range")
        untyped.protocol_type = ""
        native = await client.call(untyped)
    kafka = await kafka_request(broker.kafka_address, JOIN_GROUP, 5, untyped)
    assert isinstance(native, JoinGroupResponse) and isinstance(kafka, JoinGroupResponse)
    codes = [ErrorCode(r.error_code).name for r in (native, kafka)]
    assert codes == ["INCONSISTENT_GROUP_PROTOCOL"] * 2, codes


async def coordinator_of(group: str, address: tuple[str, int]) -> tuple[str, int]:
    deadline = time.monotonic() + WAIT_S
    while True:
        async with TestClient(*address) as client:
            resp = await client.call(FindCoordinatorRequest(key=group))
        assert isinstance(resp, FindCoordinatorResponse)
        if resp.error_code == 0:
            return resp.host, resp.port
        assert time.monotonic() < deadline, ErrorCode(resp.error_code).name
        await asyncio.sleep(0.1)


async def test_what_comes_while_a_group_is_deleted_makes_a_new_group(cluster: Cluster) -> None:
    cluster.start_controller()
    flags = ("--enable-test-faults", "--group-initial-rebalance-delay-ms", "0")
    cluster.start_brokers((1, 2), *flags)
    async with TestClient(*cluster.brokers[1].address) as client:
        await client.call(create_request("read", partitions=2))
    coordinator = await coordinator_of("doomed", cluster.brokers[1].address)
    async with (
        TestClient(*coordinator) as admin,
        TestClient(*coordinator) as member,
        TestClient(*coordinator) as committer,
    ):
        await commit(committer, "doomed", "read", {0: 5})  # an Empty group with an offset
        # The follower's fetches held: the tombstones wait for the high watermark.
        hold = FaultRule(api_key=int(ApiKey.FETCH), action="hold")
        await admin.call(FaultControlRequest(add_rules=[hold]))
        await asyncio.sleep(0.5)  # a fetch already in the leader's purgatory answers
        deleting = admin.send(DeleteGroupsRequest(groups_names=["doomed"]))
        await asyncio.sleep(0.3)
        committing = committer.send(commit_request("doomed", "read", {1: 9}))
        member_id = await member_id_of(member, "doomed", "range")
        joined = await member.call(join_request("doomed", member_id, "range"))
        assert isinstance(joined, JoinGroupResponse) and joined.error_code == 0, joined
        syncing = member.send(
            SyncGroupRequest(
                group_id="doomed", generation_id=joined.generation_id, member_id=member_id
            )
        )
        await asyncio.sleep(0.3)
        async with TestClient(*coordinator) as faults:
            await faults.call(FaultControlRequest(clear=True))
        deleted = (await admin.receive(deleting, timeout=20)).body
        committed = (await committer.receive(committing, timeout=20)).body
        synced = (await member.receive(syncing, timeout=20)).body
        listed = await admin.call(ListGroupsRequest())
        described = await admin.call(DescribeGroupsRequest(groups=["doomed"]))
        offsets = offsets_of(await admin.call(fetch_request("doomed", "read")))
    assert isinstance(deleted, DeleteGroupsResponse) and deleted.results[0].error_code == 0
    assert isinstance(committed, OffsetCommitResponse)
    assert committed.topics[0].partitions[0].error_code == 0
    assert isinstance(synced, SyncGroupResponse)
    assert ErrorCode(synced.error_code).name == "NONE"
    assert isinstance(listed, ListGroupsResponse) and isinstance(described, DescribeGroupsResponse)
    # The new group: the member that joined it and the offset committed to it, not the
    # deleted group's offset of partition 0.
    assert [(g.group_id, g.group_state) for g in listed.groups] == [("doomed", "Stable")]
    assert [m.member_id for m in described.groups[0].members] == [member_id]
    assert offsets == {0: -1, 1: 9}
