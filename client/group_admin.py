"""Consumer groups for operators (kafka-consumer-groups' jobs, AsyncAdmin's methods):
list the groups of every broker's coordinator, describe a group (state, generation,
members with their assignments decoded from Kafka's consumer protocol), its committed
offsets with their leader epochs and each partition's lag, reset them, delete it.

A group is served by its coordinator (FindCoordinator); ListGroups goes to every
broker, each answering for the groups it coordinates. Offsets are reset with an
OffsetCommit from outside the group, which the coordinator takes only while the group
has no members (Kafka's rule: stop the consumers first).
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Mapping
from dataclasses import dataclass

from client.answer_matching import result_for_each
from client.cluster import ClusterClient
from client.consumer.committed_offsets import commit_topics
from client.errors import error_for
from client.offsets import list_offsets
from client.types import OffsetAndMetadata
from client.types import TopicPartition
from protocol.api import LATEST_TIMESTAMP
from protocol.errors import DecodeError
from protocol.errors import ErrorCode
from protocol.kafka.consumer_protocol import decode_assignment
from protocol.messages import DeleteGroupsRequest
from protocol.messages import DeleteGroupsResponse
from protocol.messages import DescribeGroupsRequest
from protocol.messages import DescribeGroupsResponse
from protocol.messages import FindCoordinatorRequest
from protocol.messages import FindCoordinatorResponse
from protocol.messages import ListGroupsRequest
from protocol.messages import ListGroupsResponse
from protocol.messages import Message
from protocol.messages import OffsetCommitRequest
from protocol.messages import OffsetCommitResponse
from protocol.messages import OffsetFetchRequest
from protocol.messages import OffsetFetchResponse


@dataclass(frozen=True)
class GroupListing:
    group_id: str
    state: str  # Empty, PreparingRebalance, CompletingRebalance, Stable
    protocol_type: str
    coordinator: int


@dataclass(frozen=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    host: str
    assignment: frozenset[TopicPartition]


@dataclass(frozen=True)
class GroupDescription:
    group_id: str
    state: str
    generation: int
    protocol_type: str
    protocol: str  # the assignor chosen
    coordinator: int
    members: tuple[MemberDescription, ...]


@dataclass(frozen=True)
class PartitionLag:
    partition: TopicPartition
    committed: OffsetAndMetadata | None
    log_end_offset: int  # the high watermark
    lag: int | None  # None without a commit
    owner: str | None  # the member it is assigned to


class GroupAdmin:
    """AsyncAdmin's consumer-group operations."""

    _cluster: ClusterClient
    _request_timeout_ms: int

    async def _coordinator_of(self, group_id: str) -> int:
        found = await self._cluster.send_any(FindCoordinatorRequest(key=group_id))
        assert isinstance(found, FindCoordinatorResponse)
        if found.error_code != ErrorCode.NONE:
            raise error_for(found.error_code, f"group {group_id}: {found.error_message or ''}")
        return found.node_id

    async def _to_coordinator(self, group_id: str, request: Message) -> tuple[int, Message]:
        node = await self._coordinator_of(group_id)
        answer = await self._cluster.send(node, request, timeout_ms=self._request_timeout_ms)
        assert answer is not None
        return node, answer

    async def list_groups(self) -> list[GroupListing]:
        """Every group of every broker's coordinator."""
        self._check()  # type: ignore[attr-defined]
        await self._cluster.refresh_metadata()
        listings = []
        for node in sorted(self._cluster.metadata.brokers):
            answer = await self._cluster.send(
                node, ListGroupsRequest(), timeout_ms=self._request_timeout_ms
            )
            assert isinstance(answer, ListGroupsResponse)
            if answer.error_code != ErrorCode.NONE:
                raise error_for(answer.error_code, f"ListGroups at broker {node}")
            listings += [
                GroupListing(g.group_id, g.group_state, g.protocol_type, node)
                for g in answer.groups
            ]
        return sorted(listings, key=lambda g: g.group_id)

    async def describe_group(self, group_id: str) -> GroupDescription:
        """State, generation, chosen assignor and members of a group ("Dead" with no
        members when the coordinator has never heard of it)."""
        self._check()  # type: ignore[attr-defined]
        node, answer = await self._to_coordinator(
            group_id, DescribeGroupsRequest(groups=[group_id])
        )
        assert isinstance(answer, DescribeGroupsResponse)
        (g,) = result_for_each(
            [group_id], answer.groups, lambda d: d.group_id, what="group", request="DescribeGroups"
        )
        if g.error_code != ErrorCode.NONE:
            raise error_for(g.error_code, f"describing group {group_id}")
        return GroupDescription(
            group_id=g.group_id,
            state=g.group_state,
            generation=g.generation_id,
            protocol_type=g.protocol_type,
            protocol=g.protocol_data,
            coordinator=node,
            members=tuple(
                MemberDescription(
                    m.member_id,
                    m.group_instance_id,
                    m.client_id,
                    m.client_host,
                    _assigned(m.member_assignment, g.protocol_type),
                )
                for m in g.members
            ),
        )

    async def list_group_offsets(self, group_id: str) -> dict[TopicPartition, OffsetAndMetadata]:
        """Every offset the group committed, with its leader epoch."""
        self._check()  # type: ignore[attr-defined]
        _, answer = await self._to_coordinator(group_id, OffsetFetchRequest(group_id=group_id))
        assert isinstance(answer, OffsetFetchResponse)
        if answer.error_code != ErrorCode.NONE:
            raise error_for(answer.error_code, f"committed offsets of group {group_id}")
        return {
            TopicPartition(t.name, p.partition_index): OffsetAndMetadata(
                p.committed_offset, p.metadata or "", p.committed_leader_epoch
            )
            for t in answer.topics
            for p in t.partitions
            if p.committed_offset >= 0
        }

    async def group_lag(self, group_id: str, topics: Iterable[str] = ()) -> list[PartitionLag]:
        """Per partition of the group's commits and assignments (and of `topics`): the
        committed offset and epoch, the log end (high watermark), the lag, the owner."""
        description = await self.describe_group(group_id)
        committed = await self.list_group_offsets(group_id)
        owners = {tp: m.member_id for m in description.members for tp in m.assignment}
        partitions = set(committed) | set(owners)
        if topics:
            await self._cluster.refresh_metadata(topics)
            for topic in topics:
                for p in self._cluster.metadata.partitions_for_topic(topic) or ():
                    partitions.add(TopicPartition(topic, p))
        ends, errors = await list_offsets(
            self._cluster, dict.fromkeys(partitions, LATEST_TIMESTAMP), isolation_level=0
        )
        out = []
        for tp in sorted(partitions):
            end = ends[tp].offset if tp in ends else -1
            c = committed.get(tp)
            lag = max(0, end - c.offset) if c is not None and tp in ends else None
            out.append(PartitionLag(tp, c, end, lag, owners.get(tp)))
        if errors and not ends:
            raise next(iter(errors.values()))
        return out

    async def alter_group_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, OffsetAndMetadata]
    ) -> None:
        """Commit `offsets` for the group from outside it: refused (UNKNOWN_MEMBER_ID or
        REBALANCE_IN_PROGRESS) while the group has members."""
        self._check()  # type: ignore[attr-defined]
        request = OffsetCommitRequest(group_id=group_id, topics=commit_topics(offsets))
        _, answer = await self._to_coordinator(group_id, request)
        assert isinstance(answer, OffsetCommitResponse)
        for t in answer.topics:
            for p in t.partitions:
                if p.error_code != ErrorCode.NONE:
                    hint = (
                        ": the group has members; stop its consumers first"
                        if p.error_code
                        in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.REBALANCE_IN_PROGRESS)
                        else ""
                    )
                    raise error_for(p.error_code, f"resetting {t.name}-{p.partition_index}{hint}")

    async def delete_groups(self, group_ids: Iterable[str]) -> None:
        """Delete empty groups with their committed offsets (NON_EMPTY_GROUP while a
        group has members, GROUP_ID_NOT_FOUND for one the coordinator does not know)."""
        self._check()  # type: ignore[attr-defined]
        for group_id in group_ids:
            _, answer = await self._to_coordinator(
                group_id, DeleteGroupsRequest(groups_names=[group_id])
            )
            assert isinstance(answer, DeleteGroupsResponse)
            for result in result_for_each(
                [group_id],
                answer.results,
                lambda r: r.group_id,
                what="group",
                request="DeleteGroups",
            ):
                if result.error_code != ErrorCode.NONE:
                    raise error_for(result.error_code, f"deleting group {result.group_id}")


def _assigned(data: bytes, protocol_type: str) -> frozenset[TopicPartition]:
    """A consumer's assignment, decoded; other protocol types' are opaque."""
    if protocol_type != "consumer" or not data:
        return frozenset()
    try:
        assignment = decode_assignment(bytes(data))
    except DecodeError:
        return frozenset()
    return frozenset(
        TopicPartition(tp.topic, p) for tp in assignment.assigned_partitions for p in tp.partitions
    )


__all__ = [
    "GroupAdmin",
    "GroupDescription",
    "GroupListing",
    "MemberDescription",
    "PartitionLag",
]
