"""What each request of the broker needs to be allowed (issue 18), as Kafka's KafkaApis
checks it, in one table: `guards()` maps every API the broker serves to the check that
runs before its handler (broker/handlers.py), on both listeners' protocols alike. The
broker refuses to start with a served API missing from the table, so a new API cannot
be served unchecked.

- Produce: Write on each topic (the others answer TOPIC_AUTHORIZATION_FAILED);
- Fetch: a consumer's, Read on each topic; a replica's, ClusterAction on the cluster,
  from the principal the replica's broker registered with;
- ListOffsets: Describe on each topic;
- Fetch or ListOffsets with a replica id other than a consumer's (-1), a replica's
  view past the high watermark (the debugging replica -2): ClusterAction as well;
- OffsetsForLeaderEpoch: Describe on each topic; a replica's, as its Fetch;
- Metadata: Describe on a topic to see it: hidden from a list of all topics, and
  TOPIC_AUTHORIZATION_FAILED when named (whether it exists or not);
- InitProducerId: IdempotentWrite on the cluster, or Write on any topic (KIP-679);
- CreateTopics: Create on the cluster or on the topic; DeleteTopics: Delete on it;
- FindCoordinator: Describe on the group;
- JoinGroup, SyncGroup, Heartbeat, LeaveGroup: Read on the group;
- OffsetCommit: Read on the group, and Read on each topic;
- OffsetFetch: Describe on the group; topics without Describe left out or refused;
- DescribeGroups: Describe on each group; DeleteGroups: Delete on each group;
- ListGroups: Describe on the cluster lists all, else the groups with Describe;
- ElectLeaders, AlterUserScramCredentials, CreateAcls, DeleteAcls, FaultControl:
  Alter on the cluster;
- DescribeUserScramCredentials, DescribeAcls, DescribeLogDirs, DescribeReplicaLog:
  Describe on the cluster;
- DescribeClientQuotas: DescribeConfigs on the cluster; AlterClientQuotas:
  AlterConfigs on the cluster;
- ApiVersions, DescribeCluster, SaslHandshake, SaslAuthenticate: nothing.

With the authorizer off no guard is installed at all.
"""

from __future__ import annotations

from collections.abc import Awaitable
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from broker.metadata_image import MetadataImage
from protocol.api import CONSUMER_REPLICA_ID
from protocol.api import ApiKey
from protocol.api import api_name
from protocol.connection import NATIVE
from protocol.errors import ErrorCode
from protocol.messages import API_BY_REQUEST_TYPE
from protocol.messages import AclCreationResult
from protocol.messages import AlterUserScramCredentialsRequest
from protocol.messages import AlterUserScramCredentialsResponse
from protocol.messages import AlterUserScramCredentialsResult
from protocol.messages import CreatableTopicResult
from protocol.messages import CreateAclsRequest
from protocol.messages import CreateAclsResponse
from protocol.messages import CreateTopicsRequest
from protocol.messages import CreateTopicsResponse
from protocol.messages import DeletableGroupResult
from protocol.messages import DeletableTopicResult
from protocol.messages import DeleteAclsFilterResult
from protocol.messages import DeleteAclsRequest
from protocol.messages import DeleteAclsResponse
from protocol.messages import DeleteGroupsRequest
from protocol.messages import DeleteGroupsResponse
from protocol.messages import DeleteTopicsRequest
from protocol.messages import DeleteTopicsResponse
from protocol.messages import DescribedGroup
from protocol.messages import DescribeGroupsRequest
from protocol.messages import DescribeGroupsResponse
from protocol.messages import ElectLeadersRequest
from protocol.messages import ElectLeadersResponse
from protocol.messages import ElectLeadersResult
from protocol.messages import EpochEndOffsetResult
from protocol.messages import FetchPartitionResponse
from protocol.messages import FetchRequest
from protocol.messages import FetchResponse
from protocol.messages import FetchTopicResponse
from protocol.messages import FindCoordinatorRequest
from protocol.messages import InitProducerIdRequest
from protocol.messages import ListGroupsResponse
from protocol.messages import ListOffsetsPartitionResponse
from protocol.messages import ListOffsetsRequest
from protocol.messages import ListOffsetsResponse
from protocol.messages import ListOffsetsTopicResponse
from protocol.messages import Message
from protocol.messages import MetadataRequest
from protocol.messages import MetadataResponse
from protocol.messages import MetadataTopic
from protocol.messages import OffsetCommitPartitionResponse
from protocol.messages import OffsetCommitRequest
from protocol.messages import OffsetCommitResponse
from protocol.messages import OffsetCommitTopicResponse
from protocol.messages import OffsetFetchPartitionResponse
from protocol.messages import OffsetFetchRequest
from protocol.messages import OffsetFetchResponse
from protocol.messages import OffsetFetchTopicResponse
from protocol.messages import OffsetForLeaderEpochRequest
from protocol.messages import OffsetForLeaderEpochResponse
from protocol.messages import OffsetForLeaderTopicResult
from protocol.messages import ProducePartitionResponse
from protocol.messages import ProduceRequest
from protocol.messages import ProduceResponse
from protocol.messages import ProduceTopicResponse
from runtime.access import RequestAccess
from runtime.acl import AclOperation
from runtime.acl import NotAuthorizedError
from runtime.acl import ResourceType
from runtime.server import Handler
from runtime.server import RequestContext

Guard = Callable[[RequestContext, Any, Handler], Awaitable[Message]]

TOPIC_DENIED = int(ErrorCode.TOPIC_AUTHORIZATION_FAILED)
GROUP_DENIED = int(ErrorCode.GROUP_AUTHORIZATION_FAILED)
READ, WRITE, DESCRIBE = AclOperation.READ, AclOperation.WRITE, AclOperation.DESCRIBE
CLUSTER_ACTION = AclOperation.CLUSTER_ACTION
TOPIC, GROUP = ResourceType.TOPIC, ResourceType.GROUP


@dataclass(frozen=True)
class TopicShape:
    """How a topic-keyed API lists topics and partitions, in its request and its answer
    (field names, Kafka's differ from API to API), so one piece of code can answer the
    refused part of any of them."""

    topics: str  # the request's list of topics
    name: str  # a topic's name
    partitions: str  # a topic's partitions
    index: str  # a partition's index
    answer: type[Message]
    answers: str  # the answer's list of topics
    topic_answer: type[Message]
    topic_answer_name: str
    partition_answer: type[Message]
    partition_answer_index: str

    def refusals(self, refused: list[Any], code: int) -> list[Message]:
        return [
            self.topic_answer(
                **{
                    self.topic_answer_name: getattr(t, self.name),
                    "partitions": [
                        self.partition_answer(
                            **{self.partition_answer_index: self._index(p), "error_code": code}
                        )
                        for p in getattr(t, self.partitions)
                    ],
                }
            )
            for t in refused
        ]

    def _index(self, partition: Any) -> int:
        return partition if isinstance(partition, int) else getattr(partition, self.index)


TOPIC_SHAPES: dict[type[Message], TopicShape] = {
    ProduceRequest: TopicShape(
        "topics",
        "name",
        "partitions",
        "index",
        ProduceResponse,
        "topics",
        ProduceTopicResponse,
        "name",
        ProducePartitionResponse,
        "index",
    ),
    FetchRequest: TopicShape(
        "topics",
        "topic",
        "partitions",
        "partition",
        FetchResponse,
        "responses",
        FetchTopicResponse,
        "topic",
        FetchPartitionResponse,
        "partition_index",
    ),
    ListOffsetsRequest: TopicShape(
        "topics",
        "name",
        "partitions",
        "partition_index",
        ListOffsetsResponse,
        "topics",
        ListOffsetsTopicResponse,
        "name",
        ListOffsetsPartitionResponse,
        "partition_index",
    ),
    OffsetForLeaderEpochRequest: TopicShape(
        "topics",
        "topic",
        "partitions",
        "partition",
        OffsetForLeaderEpochResponse,
        "topics",
        OffsetForLeaderTopicResult,
        "topic",
        EpochEndOffsetResult,
        "partition",
    ),
    OffsetCommitRequest: TopicShape(
        "topics",
        "name",
        "partitions",
        "partition_index",
        OffsetCommitResponse,
        "topics",
        OffsetCommitTopicResponse,
        "name",
        OffsetCommitPartitionResponse,
        "partition_index",
    ),
    OffsetFetchRequest: TopicShape(
        "topics",
        "name",
        "partition_indexes",
        "",
        OffsetFetchResponse,
        "topics",
        OffsetFetchTopicResponse,
        "name",
        OffsetFetchPartitionResponse,
        "partition_index",
    ),
}


def refusal_body(req: Message, code: ErrorCode, message: str) -> Message:
    """A whole-request refusal as the API's own answer: Kafka's protocol has no
    request-level error, so the code goes where the API puts its errors."""
    response = API_BY_REQUEST_TYPE[type(req)].response
    fields = response.__struct_fields__
    if "error_code" in fields:
        said = {"error_message": message} if "error_message" in fields else {}
        return response(error_code=int(code), **said)
    error = {"error_code": int(code), "error_message": message}
    if isinstance(req, ElectLeadersRequest):
        return ElectLeadersResponse(
            results=[
                ElectLeadersResult(topic=p.topic, partition=p.partition, **error)
                for p in req.partitions
            ]
        )
    if isinstance(req, AlterUserScramCredentialsRequest):
        users = dict.fromkeys(c.name for c in [*req.deletions, *req.upsertions])
        return AlterUserScramCredentialsResponse(
            results=[AlterUserScramCredentialsResult(user=u, **error) for u in users]
        )
    if isinstance(req, CreateAclsRequest):
        return CreateAclsResponse(results=[AclCreationResult(**error) for _ in req.creations])
    if isinstance(req, DeleteAclsRequest):
        return DeleteAclsResponse(
            filter_results=[DeleteAclsFilterResult(**error) for _ in req.filters]
        )
    shape = TOPIC_SHAPES.get(type(req))
    if shape is not None:
        answer = shape.answer()
        getattr(answer, shape.answers).extend(shape.refusals(getattr(req, shape.topics), int(code)))
        return answer
    raise AssertionError(f"no refusal answer for {type(req).__name__}")


class BrokerRequestAccess:
    """The broker's guards over its RequestAccess (runtime/access.py)."""

    def __init__(self, access: RequestAccess, image: MetadataImage) -> None:
        self.access = access
        self.image = image

    def wrap(self, table: dict[int, Handler]) -> dict[int, Handler]:
        """`table` with every handler behind its guard (unchanged when off)."""
        if not self.access.enabled:
            return table
        guards = self.guards()
        unguarded = sorted(api_name(k) for k in table if k not in guards)
        if unguarded:
            raise AssertionError(f"APIs served without an authorization rule: {unguarded}")
        return {key: self._guarded(guards[key], handler) for key, handler in table.items()}

    @staticmethod
    def _guarded(guard: Guard | None, handler: Handler) -> Handler:
        if guard is None:
            return handler

        async def serve(ctx: RequestContext, req: Message) -> Message:
            try:
                return await guard(ctx, req, handler)
            except NotAuthorizedError as exc:
                if ctx.protocol == NATIVE.name:
                    raise  # the native protocol's request-level error carries the message
                return refusal_body(req, exc.code, str(exc))

        return serve

    def guards(self) -> dict[int, Guard | None]:
        """API key -> its guard (None: open to every principal)."""
        alter = self._cluster_guard(AclOperation.ALTER)
        describe = self._cluster_guard(AclOperation.DESCRIBE)
        group_read = self._group_guard(READ)
        table: dict[ApiKey, Guard | None] = {
            ApiKey.API_VERSIONS: None,
            ApiKey.DESCRIBE_CLUSTER: None,
            ApiKey.SASL_HANDSHAKE: None,
            ApiKey.SASL_AUTHENTICATE: None,
            ApiKey.METADATA: self.metadata,
            ApiKey.PRODUCE: self.produce,
            ApiKey.FETCH: self.fetch,
            ApiKey.LIST_OFFSETS: self.list_offsets,
            ApiKey.OFFSET_FOR_LEADER_EPOCH: self.offsets_for_leader_epoch,
            ApiKey.INIT_PRODUCER_ID: self.init_producer_id,
            ApiKey.CREATE_TOPICS: self.create_topics,
            ApiKey.DELETE_TOPICS: self.delete_topics,
            ApiKey.FIND_COORDINATOR: self.find_coordinator,
            ApiKey.JOIN_GROUP: group_read,
            ApiKey.SYNC_GROUP: group_read,
            ApiKey.HEARTBEAT: group_read,
            ApiKey.LEAVE_GROUP: group_read,
            ApiKey.OFFSET_COMMIT: self.offset_commit,
            ApiKey.OFFSET_FETCH: self.offset_fetch,
            ApiKey.DESCRIBE_GROUPS: self.describe_groups,
            ApiKey.LIST_GROUPS: self.list_groups,
            ApiKey.DELETE_GROUPS: self.delete_groups,
            ApiKey.ELECT_LEADERS: alter,
            ApiKey.ALTER_USER_SCRAM_CREDENTIALS: alter,
            ApiKey.CREATE_ACLS: alter,
            ApiKey.DELETE_ACLS: alter,
            ApiKey.FAULT_CONTROL: alter,
            ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: describe,
            ApiKey.DESCRIBE_ACLS: describe,
            ApiKey.DESCRIBE_LOG_DIRS: describe,
            ApiKey.DESCRIBE_REPLICA_LOG: describe,
            # Quotas are configs in Kafka: DescribeConfigs / AlterConfigs on the cluster.
            ApiKey.DESCRIBE_CLIENT_QUOTAS: self._cluster_guard(AclOperation.DESCRIBE_CONFIGS),
            ApiKey.ALTER_CLIENT_QUOTAS: self._cluster_guard(AclOperation.ALTER_CONFIGS),
        }
        return {int(k): v for k, v in table.items()}

    # ------------------------------------------------------------------ whole requests

    def _cluster_guard(self, operation: AclOperation) -> Guard:
        async def guard(ctx: RequestContext, req: Message, inner: Handler) -> Message:
            self.access.require_cluster(ctx, type(req).__name__.removesuffix("Request"), operation)
            return await inner(ctx, req)

        return guard

    def _group_guard(self, operation: AclOperation) -> Guard:
        async def guard(ctx: RequestContext, req: Any, inner: Handler) -> Message:
            self._require_group(ctx, operation, req.group_id)
            return await inner(ctx, req)

        return guard

    def _require_group(self, ctx: RequestContext, operation: AclOperation, group: str) -> None:
        if not self.access.allowed(ctx, operation, GROUP, group):
            raise NotAuthorizedError(
                ErrorCode.GROUP_AUTHORIZATION_FAILED,
                f"{ctx.principal} may not use group {group!r}: it needs "
                f"{operation.name.capitalize()} on it (minibroker acl add)",
            )

    def _require_replica(self, ctx: RequestContext, replica_id: int, api: str) -> None:
        """A replica's request: from a server (ClusterAction), and from the principal
        that registered broker `replica_id` (a broker cannot pose as another)."""
        self.access.require_cluster(ctx, api, AclOperation.CLUSTER_ACTION)
        broker = self.image.brokers.get(replica_id)
        registered = None if broker is None else broker.principal
        if registered is not None and registered != ctx.principal:
            raise NotAuthorizedError(
                ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                f"{ctx.principal} sent {api} as replica {replica_id}, which registered as "
                f"{registered}",
            )

    async def _by_name(
        self,
        ctx: RequestContext,
        req: Any,
        inner: Handler,
        operation: AclOperation,
        kind: ResourceType,
        field: str,
        empty: Message,
        answers: str,
        refusal: Callable[[Any], Message],
        name: Callable[[Any], str] = lambda item: item,
    ) -> Message:
        """Serve the items of `req`'s list `field` the principal may `operation` (nothing
        allowed: `empty`, at once); add `refusal(item)` for each of the others to the
        answer's list `answers`."""
        kept, refused = self.access.split(ctx, operation, kind, getattr(req, field), name)
        if not refused:
            return await inner(ctx, req)
        resp = await inner(ctx, msgspec.structs.replace(req, **{field: kept})) if kept else empty
        getattr(resp, answers).extend(refusal(item) for item in refused)
        return resp

    # ------------------------------------------------------------------ topics

    async def produce(self, ctx: RequestContext, req: ProduceRequest, inner: Handler) -> Message:
        return await self._per_topic(ctx, req, inner, WRITE)

    async def fetch(self, ctx: RequestContext, req: FetchRequest, inner: Handler) -> Message:
        if req.replica_id >= 0:
            self._require_replica(ctx, req.replica_id, "Fetch")
            return await inner(ctx, req)
        self._require_consumer_view(ctx, req.replica_id, "Fetch")
        return await self._per_topic(ctx, req, inner, READ)

    async def list_offsets(
        self, ctx: RequestContext, req: ListOffsetsRequest, inner: Handler
    ) -> Message:
        self._require_consumer_view(ctx, req.replica_id, "ListOffsets")
        return await self._per_topic(ctx, req, inner, DESCRIBE)

    def _require_consumer_view(self, ctx: RequestContext, replica_id: int, api: str) -> None:
        """Any replica id but a consumer's (-1) sees past the high watermark (the
        debugging replica -2 reads uncommitted records, from followers too): a
        server's view, ClusterAction."""
        if replica_id != CONSUMER_REPLICA_ID:
            self.access.require_cluster(
                ctx, f"{api} as replica {replica_id} (past the high watermark)", CLUSTER_ACTION
            )

    async def offsets_for_leader_epoch(
        self, ctx: RequestContext, req: OffsetForLeaderEpochRequest, inner: Handler
    ) -> Message:
        if req.replica_id >= 0:
            self._require_replica(ctx, req.replica_id, "OffsetsForLeaderEpoch")
            return await inner(ctx, req)
        return await self._per_topic(ctx, req, inner, DESCRIBE)

    async def _per_topic(
        self,
        ctx: RequestContext,
        req: Any,
        inner: Handler,
        operation: AclOperation,
        *,
        refused_code: int = TOPIC_DENIED,
        everything_refused: bool = False,
    ) -> Message:
        """Serve the topics of `req` the principal may `operation`; the others (all of
        them with `everything_refused`) are answered `refused_code` per partition."""
        shape = TOPIC_SHAPES[type(req)]
        topics = getattr(req, shape.topics)
        if everything_refused:
            kept, refused = [], topics
        else:
            kept, refused = self.access.split(
                ctx, operation, TOPIC, topics, lambda t: getattr(t, shape.name)
            )
        if not refused:
            return await inner(ctx, req)
        resp = (
            await inner(ctx, msgspec.structs.replace(req, **{shape.topics: kept}))
            if kept
            else shape.answer()
        )
        getattr(resp, shape.answers).extend(shape.refusals(refused, refused_code))
        return resp

    async def metadata(self, ctx: RequestContext, req: MetadataRequest, inner: Handler) -> Message:
        resp = await inner(ctx, req)
        assert isinstance(resp, MetadataResponse)
        shown = []
        for topic in resp.topics:
            if self.access.allowed(ctx, DESCRIBE, TOPIC, topic.name, quiet=req.topics is None):
                shown.append(topic)
            elif req.topics is not None:
                # Named but not describable: refused whether it exists or not (its
                # existence is not given away).
                shown.append(MetadataTopic(name=topic.name, error_code=TOPIC_DENIED))
        resp.topics = shown
        return resp

    async def init_producer_id(
        self, ctx: RequestContext, req: InitProducerIdRequest, inner: Handler
    ) -> Message:
        if not self.access.cluster(ctx, AclOperation.IDEMPOTENT_WRITE, quiet=True) and not any(
            self.access.allowed(ctx, WRITE, TOPIC, name, quiet=True)
            for name in self.image.topics_by_name
        ):
            raise NotAuthorizedError(
                ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                f"{ctx.principal} may not get a producer id: it needs IdempotentWrite on the "
                "cluster or Write on a topic",
            )
        return await inner(ctx, req)

    async def create_topics(
        self, ctx: RequestContext, req: CreateTopicsRequest, inner: Handler
    ) -> Message:
        if self.access.cluster(ctx, AclOperation.CREATE, quiet=True):
            return await inner(ctx, req)
        return await self._by_name(
            ctx,
            req,
            inner,
            AclOperation.CREATE,
            TOPIC,
            "topics",
            CreateTopicsResponse(),
            "topics",
            lambda t: CreatableTopicResult(
                name=t.name,
                error_code=TOPIC_DENIED,
                error_message=f"{ctx.principal} may not Create topic {t.name!r}",
            ),
            name=lambda t: t.name,
        )

    async def delete_topics(
        self, ctx: RequestContext, req: DeleteTopicsRequest, inner: Handler
    ) -> Message:
        return await self._by_name(
            ctx,
            req,
            inner,
            AclOperation.DELETE,
            TOPIC,
            "topic_names",
            DeleteTopicsResponse(),
            "responses",
            lambda name: DeletableTopicResult(
                name=name,
                error_code=TOPIC_DENIED,
                error_message=f"{ctx.principal} may not Delete topic {name!r}",
            ),
        )

    # ------------------------------------------------------------------ groups

    async def find_coordinator(
        self, ctx: RequestContext, req: FindCoordinatorRequest, inner: Handler
    ) -> Message:
        if req.key_type == 0:
            self._require_group(ctx, DESCRIBE, req.key)
        return await inner(ctx, req)

    async def offset_commit(
        self, ctx: RequestContext, req: OffsetCommitRequest, inner: Handler
    ) -> Message:
        if not self.access.allowed(ctx, READ, GROUP, req.group_id):
            return await self._per_topic(
                ctx, req, inner, READ, refused_code=GROUP_DENIED, everything_refused=True
            )
        return await self._per_topic(ctx, req, inner, READ)

    async def offset_fetch(
        self, ctx: RequestContext, req: OffsetFetchRequest, inner: Handler
    ) -> Message:
        if not self.access.allowed(ctx, DESCRIBE, GROUP, req.group_id):
            return OffsetFetchResponse(error_code=GROUP_DENIED)
        if req.topics is None:
            resp = await inner(ctx, req)
            assert isinstance(resp, OffsetFetchResponse)
            resp.topics = [
                t
                for t in resp.topics
                if self.access.allowed(ctx, DESCRIBE, TOPIC, t.name, quiet=True)
            ]
            return resp
        return await self._per_topic(ctx, req, inner, DESCRIBE)

    async def describe_groups(
        self, ctx: RequestContext, req: DescribeGroupsRequest, inner: Handler
    ) -> Message:
        return await self._by_name(
            ctx,
            req,
            inner,
            DESCRIBE,
            GROUP,
            "groups",
            DescribeGroupsResponse(),
            "groups",
            lambda g: DescribedGroup(group_id=g, error_code=GROUP_DENIED),
        )

    async def list_groups(self, ctx: RequestContext, req: Message, inner: Handler) -> Message:
        resp = await inner(ctx, req)
        assert isinstance(resp, ListGroupsResponse)
        if not self.access.cluster(ctx, DESCRIBE, quiet=True):
            resp.groups = [
                g
                for g in resp.groups
                if self.access.allowed(ctx, DESCRIBE, GROUP, g.group_id, quiet=True)
            ]
        return resp

    async def delete_groups(
        self, ctx: RequestContext, req: DeleteGroupsRequest, inner: Handler
    ) -> Message:
        return await self._by_name(
            ctx,
            req,
            inner,
            AclOperation.DELETE,
            GROUP,
            "groups_names",
            DeleteGroupsResponse(),
            "results",
            lambda g: DeletableGroupResult(group_id=g, error_code=GROUP_DENIED),
        )
