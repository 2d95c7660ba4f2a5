"""Where minibroker answered differently from Apache Kafka, on real processes, over
the native listener and the Kafka one (each test failed before its fix):

- Topics whose names differ only by '.' against '_' (`a.b`, `a_b`) could coexist;
  Kafka refuses the second (Topic.hasCollision, ReplicationControlManager): their
  metric names would be the same. Now INVALID_TOPIC_EXCEPTION naming the existing
  topic, from the controller, whichever listener the CreateTopics came in on.
- A partition named twice in one ListOffsets was answered twice; Kafka answers each
  INVALID_REQUEST (ListOffsetsRequest.duplicatePartitions) and serves the rest.
- A partition named twice in one Produce had both record sets appended. Kafka keys
  the record sets by partition and keeps the last, the earlier one dropped without
  an answer of its own; here each is INVALID_REQUEST and nothing is written to that
  partition, the rest of the request is (no success for what was not appended).
- A leader's SyncGroup with assignments for member ids not in the group: handled as
  Kafka's classic coordinator does already (those ids ignored, neither stored nor
  described; members left out get an empty assignment), but without Kafka's warning
  naming the members left out, the one trace of a leader whose assignor misnames
  members. Now logged.
"""

from __future__ import annotations

import asyncio

import pytest
from cluster import Cluster
from cluster import TestClient
from test_kafka_listener import kafka_request

from protocol.errors import ErrorCode
from protocol.kafka.apis import CREATE_TOPICS
from protocol.kafka.apis import LIST_OFFSETS
from protocol.kafka.apis import PRODUCE
from protocol.kafka.apis import SYNC_GROUP
from protocol.messages import CreatableTopic
from protocol.messages import CreatableTopicResult
from protocol.messages import CreateTopicsRequest
from protocol.messages import CreateTopicsResponse
from protocol.messages import DeleteTopicsRequest
from protocol.messages import DescribeGroupsRequest
from protocol.messages import DescribeGroupsResponse
from protocol.messages import JoinGroupRequest
from protocol.messages import JoinGroupRequestProtocol
from protocol.messages import ListOffsetsPartition
from protocol.messages import ListOffsetsRequest
from protocol.messages import ListOffsetsResponse
from protocol.messages import ListOffsetsTopic
from protocol.messages import Message
from protocol.messages import ProducePartition
from protocol.messages import ProduceRequest
from protocol.messages import ProduceResponse
from protocol.messages import ProduceTopic
from protocol.messages import SyncGroupRequest
from protocol.messages import SyncGroupRequestAssignment
from protocol.messages import SyncGroupResponse
from tests.unit.protocol.record_faults import raw_batch
from tests.unit.protocol.record_faults import record

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


TOPIC = "twice"
LATEST = -1


def create_request(*names: str, partitions: int = 1) -> CreateTopicsRequest:
    return CreateTopicsRequest(
        topics=[
            CreatableTopic(name=n, num_partitions=partitions, replication_factor=1) for n in names
        ]
    )


def list_offsets(*asked: tuple[int, int]) -> ListOffsetsRequest:
    """ListOffsets of TOPIC for each (partition, timestamp) asked, in that order."""
    partitions = [ListOffsetsPartition(partition_index=p, timestamp=ts) for p, ts in asked]
    return ListOffsetsRequest(topics=[ListOffsetsTopic(name=TOPIC, partitions=partitions)])


def offsets_answered(resp: Message) -> list[tuple[int, str, int]]:
    assert isinstance(resp, ListOffsetsResponse)
    return [
        (p.partition_index, ErrorCode(p.error_code).name, p.offset)
        for t in resp.topics
        for p in t.partitions
    ]


def produce_answered(resp: Message) -> list[tuple[int, str, int]]:
    assert isinstance(resp, ProduceResponse)
    return [
        (p.index, ErrorCode(p.error_code).name, p.base_offset)
        for t in resp.topics
        for p in t.partitions
    ]


async def two_led_partitions(client: TestClient) -> None:
    """TOPIC with partitions 0 and 1, once this broker leads both."""
    await client.call(create_request(TOPIC, partitions=2))
    for _ in range(100):
        answered = offsets_answered(await client.call(list_offsets((0, LATEST), (1, LATEST))))
        if all(code == "NONE" for _, code, _ in answered):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"partitions not led: {answered}")


def answers(resp: CreateTopicsResponse) -> dict[str, tuple[str, str | None]]:
    def named(r: CreatableTopicResult) -> tuple[str, str | None]:
        return ErrorCode(r.error_code).name, r.error_message

    return {r.name: named(r) for r in resp.topics}


async def test_topic_names_that_collide_on_dot_and_underscore_are_refused(
    cluster: Cluster,
) -> None:
    cluster.start_controller()
    broker = cluster.start_broker(1, kafka=True)
    async with TestClient(*broker.address) as client:
        assert answers(await client.call(create_request("a.b")))["a.b"][0] == "NONE"
        native = answers(await client.call(create_request("a_b", "c.d", "c_d")))
        kafka = await kafka_request(broker.kafka_address, CREATE_TOPICS, 4, create_request("a_b"))
        assert isinstance(kafka, CreateTopicsResponse)
        # The name freed by a deletion can be taken by its colliding twin.
        await client.call(DeleteTopicsRequest(topic_names=["a.b"]))
        after_delete = answers(await client.call(create_request("a_b")))
    code, message = native["a_b"]
    assert code == "INVALID_TOPIC_EXCEPTION" and "'a.b'" in str(message), native
    # An earlier entry of the same request counts as existing.
    assert native["c.d"][0] == "NONE"
    assert native["c_d"][0] == "INVALID_TOPIC_EXCEPTION" and "'c.d'" in str(native["c_d"][1])
    code, message = answers(kafka)["a_b"]
    assert code == "INVALID_TOPIC_EXCEPTION" and "'a.b'" in str(message), answers(kafka)
    assert after_delete["a_b"][0] == "NONE", after_delete


async def test_a_partition_twice_in_one_list_offsets_is_invalid_and_the_rest_served(
    cluster: Cluster,
) -> None:
    cluster.start_controller()
    broker = cluster.start_broker(1, kafka=True)
    asked = list_offsets((0, LATEST), (1, LATEST), (0, -2))
    async with TestClient(*broker.address) as client:
        await two_led_partitions(client)
        native = offsets_answered(await client.call(asked))
    kafka = offsets_answered(await kafka_request(broker.kafka_address, LIST_OFFSETS, 5, asked))
    expected = [(0, "INVALID_REQUEST", -1), (1, "NONE", 0), (0, "INVALID_REQUEST", -1)]
    assert native == expected, native
    assert kafka == expected, kafka


async def test_a_partition_twice_in_one_produce_is_refused_and_the_rest_written(
    cluster: Cluster,
) -> None:
    cluster.start_controller()
    broker = cluster.start_broker(1, kafka=True)

    def batch(value: bytes) -> ProducePartition:
        return ProducePartition(index=0, records=raw_batch(record(0, value), 1))

    one = ProduceTopic(name=TOPIC, partitions=[batch(b"first"), batch(b"second")])
    other = ProducePartition(index=1, records=raw_batch(record(0, b"p1"), 1))
    # Twice in one topic entry, and in two entries of the same topic.
    within = ProduceRequest(topics=[ProduceTopic(name=TOPIC, partitions=[*one.partitions, other])])
    across = ProduceRequest(
        topics=[
            ProduceTopic(name=TOPIC, partitions=[one.partitions[0]]),
            ProduceTopic(name=TOPIC, partitions=[one.partitions[1], other]),
        ]
    )
    async with TestClient(*broker.address) as client:
        await two_led_partitions(client)
        native = produce_answered(await client.call(within))
        kafka = produce_answered(await kafka_request(broker.kafka_address, PRODUCE, 8, across))
        ends = offsets_answered(await client.call(list_offsets((0, LATEST), (1, LATEST))))
    assert native == [(0, "INVALID_REQUEST", -1), (0, "INVALID_REQUEST", -1), (1, "NONE", 0)]
    assert kafka == [(0, "INVALID_REQUEST", -1), (0, "INVALID_REQUEST", -1), (1, "NONE", 1)]
    assert ends == [(0, "NONE", 0), (1, "NONE", 2)], "only partition 1 was written"


async def joined_alone(client: TestClient, group: str) -> tuple[str, int]:
    """(member id, generation) of one member that formed `group` alone (its leader)."""
    join = JoinGroupRequest(
        group_id=group,
        session_timeout_ms=10_000,
        rebalance_timeout_ms=10_000,
        member_id="",
        protocol_type="consumer",
        protocols=[JoinGroupRequestProtocol(name="range", metadata=b"subscription")],
    )
    for _ in range(100):  # until the coordinator (__consumer_offsets) is ready
        first = await client.call(join)
        if first.error_code == ErrorCode.MEMBER_ID_REQUIRED:
            break
        await asyncio.sleep(0.1)
    join.member_id = first.member_id
    formed = await client.call(join)
    assert (formed.error_code, formed.leader) == (0, first.member_id), formed
    return first.member_id, formed.generation_id


def sync_request(group: str, member: str, generation: int, plan: dict[str, bytes]) -> Message:
    return SyncGroupRequest(
        group_id=group,
        generation_id=generation,
        member_id=member,
        assignments=[
            SyncGroupRequestAssignment(member_id=m, assignment=a) for m, a in plan.items()
        ],
    )


async def test_a_leaders_assignment_for_ids_not_in_the_group_is_ignored_as_by_kafka(
    cluster: Cluster,
) -> None:
    cluster.start_controller()
    broker = cluster.start_broker(1, "--group-initial-rebalance-delay-ms", "0", kafka=True)
    async with TestClient(*broker.address) as client:
        # Only a stranger assigned, over the Kafka listener: the leader gets nothing.
        left_out, generation = await joined_alone(client, "strangers-only")
        plan = {"stranger": b"theirs"}
        kafka = await kafka_request(
            broker.kafka_address,
            SYNC_GROUP,
            3,
            sync_request("strangers-only", left_out, generation, plan),
        )
        # The leader and a stranger assigned, natively: the stranger's is dropped.
        leader, generation = await joined_alone(client, "with-stranger")
        plan = {leader: b"mine", "stranger": b"theirs"}
        native = await client.call(sync_request("with-stranger", leader, generation, plan))
        described = await client.call(
            DescribeGroupsRequest(groups=["strangers-only", "with-stranger"])
        )
    assert isinstance(kafka, SyncGroupResponse) and isinstance(native, SyncGroupResponse)
    assert (kafka.error_code, kafka.assignment) == (0, b"")
    assert (native.error_code, native.assignment) == (0, b"mine")
    assert isinstance(described, DescribeGroupsResponse)
    members = {
        g.group_id: (g.group_state, [(m.member_id, m.member_assignment) for m in g.members])
        for g in described.groups
    }
    assert members == {
        "strangers-only": ("Stable", [(left_out, b"")]),
        "with-stranger": ("Stable", [(leader, b"mine")]),
    }
    warnings = [line for line in broker.log_text().splitlines() if "empty assignments" in line]
    assert len(warnings) == 1 and "strangers-only" in warnings[0] and left_out in warnings[0], (
        warnings
    )
