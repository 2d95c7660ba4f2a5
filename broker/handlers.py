"""One function per API the broker serves. The table `Handlers.table()` is also the
served API set: anything else (the controller's APIs) is rejected by
ServerConnection with INVALID_REQUEST. InitProducerId hands out ids from a block the
controller allocates (broker/producer_ids.py). FaultControl
is in the table only when the broker runs with --enable-test-faults.

Metadata and DescribeCluster answer from this broker's own image, which may lag the
controller (KIP-232: clients keep their fresher view). CreateTopics and DeleteTopics
are forwarded to the controller unchanged; the answer is relayed once this broker's
image shows the change (bounded wait), so a client that creates a topic and then
produces through the same broker finds it.
"""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import time
from collections.abc import Callable

from broker.controller_channel import ControllerChannel
from broker.faults import NO_FAULTS
from broker.faults import Faults
from broker.group_coordinator import OFFSETS_TOPIC
from broker.group_coordinator import GroupCoordinator
from broker.metadata_image import MetadataImage
from broker.partition import Role
from broker.producer_ids import ProducerIdManager
from broker.producer_ids import ProducerIdUnavailableError
from broker.quota_apis import QuotaApis
from broker.replica_manager import ReplicaManager
from broker.storage.errors import StorageError
from protocol.api import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import API_SPECS
from protocol.messages import AclCreationResult
from protocol.messages import AclDescription
from protocol.messages import AclResource
from protocol.messages import AlterUserScramCredentialsRequest
from protocol.messages import AlterUserScramCredentialsResponse
from protocol.messages import AlterUserScramCredentialsResult
from protocol.messages import ApiVersionRange
from protocol.messages import ApiVersionsRequest
from protocol.messages import ApiVersionsResponse
from protocol.messages import CreatableTopicResult
from protocol.messages import CreateAclsRequest
from protocol.messages import CreateAclsResponse
from protocol.messages import CreateTopicsRequest
from protocol.messages import CreateTopicsResponse
from protocol.messages import CredentialInfo
from protocol.messages import DeletableTopicResult
from protocol.messages import DeleteAclsFilterResult
from protocol.messages import DeleteAclsRequest
from protocol.messages import DeleteAclsResponse
from protocol.messages import DeleteTopicsRequest
from protocol.messages import DeleteTopicsResponse
from protocol.messages import DescribeAclsRequest
from protocol.messages import DescribeAclsResponse
from protocol.messages import DescribeClusterRequest
from protocol.messages import DescribeClusterResponse
from protocol.messages import DescribeLogDirsPartition
from protocol.messages import DescribeLogDirsRequest
from protocol.messages import DescribeLogDirsResponse
from protocol.messages import DescribeLogDirsResult
from protocol.messages import DescribeLogDirsTopicResult
from protocol.messages import DescribeReplicaLogRequest
from protocol.messages import DescribeReplicaLogResponse
from protocol.messages import DescribeUserScramCredentialsRequest
from protocol.messages import DescribeUserScramCredentialsResponse
from protocol.messages import DescribeUserScramCredentialsResult
from protocol.messages import ElectLeadersRequest
from protocol.messages import ElectLeadersResponse
from protocol.messages import ElectLeadersResult
from protocol.messages import EpochStartOffset
from protocol.messages import FaultControlRequest
from protocol.messages import FaultControlResponse
from protocol.messages import FetchRequest
from protocol.messages import FetchResponse
from protocol.messages import InitProducerIdRequest
from protocol.messages import InitProducerIdResponse
from protocol.messages import ListOffsetsRequest
from protocol.messages import Message
from protocol.messages import MetadataRequest
from protocol.messages import MetadataResponse
from protocol.messages import OffsetForLeaderEpochRequest
from protocol.messages import ProduceRequest
from protocol.messages import ReplicaBatchInfo
from protocol.messages import StrayReplica
from runtime.acl import binding_of
from runtime.acl import filter_of
from runtime.metadata_answers import describe_cluster_response
from runtime.metadata_answers import metadata_response
from runtime.peer_rpc import RpcError
from runtime.peer_rpc import RpcErrorResponse
from runtime.server import Handler
from runtime.server import RequestContext
from runtime.server import sasl_out_of_turn

log = logging.getLogger(__name__)

# At most one log line per this many seconds for refused replica Fetches (bounded logs).
REFUSAL_LOG_INTERVAL_S = 10.0

_TOPIC_RE = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
# DescribeReplicaLog lists at most this many batches, whatever the request asks.
MAX_DESCRIBED_BATCHES = 100_000


def valid_topic_name(name: str) -> bool:
    return bool(_TOPIC_RE.match(name)) and name not in (".", "..")


def _missing_topic_error(name: str) -> ErrorCode:
    return (
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if valid_topic_name(name)
        else ErrorCode.INVALID_TOPIC_EXCEPTION
    )


class Handlers:
    def __init__(
        self,
        *,
        node_id: int,
        image: MetadataImage,
        replica_manager: ReplicaManager,
        controller: ControllerChannel,
        image_updated: asyncio.Condition,
        max_forward_wait_s: float = 30.0,
        faults: Faults = NO_FAULTS,
        coordinator: GroupCoordinator | None = None,
        inter_broker_listener: str | None = None,
        authorizer_enabled: bool = False,
    ) -> None:
        self.node_id = node_id
        # Where followers fetch from (the first listener): a replica's Fetch anywhere
        # else is refused. None: from any listener (tests that build Handlers bare).
        self.inter_broker_listener = inter_broker_listener
        # ACLs are managed only where they are checked (Kafka: SECURITY_DISABLED).
        self.authorizer_enabled = authorizer_enabled
        self._refusal_logged = 0.0
        self.image = image
        self.replicas = replica_manager
        self.controller = controller
        self.image_updated = image_updated
        self.max_forward_wait_s = max_forward_wait_s
        self.faults = faults
        self.producer_ids = ProducerIdManager(lambda: self.controller.allocate_producer_ids())
        self.coordinator = coordinator

    def table(self) -> dict[int, Handler]:
        quotas = QuotaApis(
            self.image,
            lambda body, timeout_s: self.controller.forward(body, timeout_s),
            self._forward_error,
            self._wait_for_image,
            self.max_forward_wait_s,
        )
        table: dict[int, Handler] = {
            ApiKey.API_VERSIONS: self.api_versions,
            ApiKey.METADATA: self.metadata,
            ApiKey.PRODUCE: self.produce,
            ApiKey.INIT_PRODUCER_ID: self.init_producer_id,
            ApiKey.FETCH: self.fetch,
            ApiKey.LIST_OFFSETS: self.list_offsets,
            ApiKey.OFFSET_FOR_LEADER_EPOCH: self.offsets_for_leader_epoch,
            ApiKey.CREATE_TOPICS: self.create_topics,
            ApiKey.DELETE_TOPICS: self.delete_topics,
            ApiKey.ELECT_LEADERS: self.elect_leaders,
            ApiKey.DESCRIBE_CLUSTER: self.describe_cluster,
            ApiKey.DESCRIBE_REPLICA_LOG: self.describe_replica_log,
            ApiKey.DESCRIBE_LOG_DIRS: self.describe_log_dirs,
            ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: self.describe_user_scram_credentials,
            # Listed in ApiVersions everywhere, as Kafka does; a SASL listener answers
            # them itself before a user is proven (runtime/server.py), so reaching a
            # handler means out of turn.
            ApiKey.SASL_HANDSHAKE: sasl_out_of_turn,
            ApiKey.SASL_AUTHENTICATE: sasl_out_of_turn,
            ApiKey.ALTER_USER_SCRAM_CREDENTIALS: self.alter_user_scram_credentials,
            ApiKey.DESCRIBE_ACLS: self.describe_acls,
            ApiKey.CREATE_ACLS: self.create_acls,
            ApiKey.DELETE_ACLS: self.delete_acls,
            ApiKey.DESCRIBE_CLIENT_QUOTAS: quotas.describe_client_quotas,
            ApiKey.ALTER_CLIENT_QUOTAS: quotas.alter_client_quotas,
        }
        if self.coordinator is not None:
            # Group coordinator (broker/group_coordinator.py).
            c = self.coordinator
            table[ApiKey.FIND_COORDINATOR] = c.find_coordinator
            table[ApiKey.OFFSET_COMMIT] = c.offset_commit
            table[ApiKey.OFFSET_FETCH] = c.offset_fetch
            table[ApiKey.JOIN_GROUP] = c.join_group
            table[ApiKey.SYNC_GROUP] = c.sync_group
            table[ApiKey.HEARTBEAT] = c.heartbeat
            table[ApiKey.LEAVE_GROUP] = c.leave_group
            table[ApiKey.DESCRIBE_GROUPS] = c.describe_groups
            table[ApiKey.LIST_GROUPS] = c.list_groups
            table[ApiKey.DELETE_GROUPS] = c.delete_groups
        if self.faults.enabled:
            table[ApiKey.FAULT_CONTROL] = self.fault_control
        return {int(k): v for k, v in table.items()}  # type: ignore[misc]

    # ------------------------------------------------------------------ cluster info

    async def api_versions(
        self, ctx: RequestContext, req: ApiVersionsRequest
    ) -> ApiVersionsResponse:
        keys = []
        for key in sorted(self.table()):
            spec = API_SPECS[key]
            keys.append(
                ApiVersionRange(
                    api_key=key, min_version=spec.min_version, max_version=spec.max_version
                )
            )
        return ApiVersionsResponse(api_keys=keys)

    def _controller_id(self) -> int:
        # Like a KRaft broker: clients send controller-bound requests to a live broker,
        # which forwards them. The lowest live id keeps the answer stable.
        live = self.image.live_brokers()
        return live[0].broker_id if live else self.node_id

    async def metadata(self, ctx: RequestContext, req: MetadataRequest) -> MetadataResponse:
        return metadata_response(
            self.image,
            req,
            cluster_id=self.image.cluster_id or self.controller.cluster_id,
            controller_id=self._controller_id(),
            listener=ctx.listener,
            missing_topic_error=_missing_topic_error,
            internal_topics=(OFFSETS_TOPIC,),
        )

    async def describe_cluster(
        self, ctx: RequestContext, req: DescribeClusterRequest
    ) -> DescribeClusterResponse:
        return describe_cluster_response(
            self.image,
            req,
            cluster_id=self.image.cluster_id or self.controller.cluster_id or "",
            controller_id=self._controller_id(),
            listener=ctx.listener,
        )

    # ------------------------------------------------------------------ data path

    async def produce(self, ctx: RequestContext, req: ProduceRequest) -> Message:
        return await self.replicas.produce(req)

    async def init_producer_id(
        self, ctx: RequestContext, req: InitProducerIdRequest
    ) -> InitProducerIdResponse:
        """Idempotent producers only (no transactions): a fresh id at epoch 0, or with
        the producer's id and epoch the next epoch of that id (KIP-360 bump)."""
        if req.transactional_id is not None:
            return InitProducerIdResponse(error_code=int(ErrorCode.INVALID_REQUEST))
        try:
            if req.producer_id == -1 and req.producer_epoch == -1:
                return InitProducerIdResponse(
                    producer_id=await self.producer_ids.next_id(), producer_epoch=0
                )
            producer_id, epoch = await self.producer_ids.bump(req.producer_id, req.producer_epoch)
        except ValueError as exc:
            log.warning("InitProducerId refused: %s", exc)
            return InitProducerIdResponse(error_code=int(ErrorCode.INVALID_REQUEST))
        except ProducerIdUnavailableError as exc:
            log.warning("InitProducerId: %s", exc)
            return InitProducerIdResponse(error_code=int(exc.error_code))
        return InitProducerIdResponse(producer_id=producer_id, producer_epoch=epoch)

    async def fetch(self, ctx: RequestContext, req: FetchRequest) -> Message:
        listener = self.inter_broker_listener
        if req.replica_id >= 0 and listener is not None and ctx.listener != listener:
            # A follower's Fetch moves the high watermark: honoured only where brokers
            # replicate, never from a client's listener (issue 18: a client posing as a
            # follower got an acks=all write acknowledged that no follower had).
            now = time.monotonic()
            if now - self._refusal_logged >= REFUSAL_LOG_INTERVAL_S:
                self._refusal_logged = now
                log.warning(
                    "refused a Fetch as replica %d from %s on listener %s (%s): followers "
                    "fetch on %s",
                    req.replica_id,
                    ctx.peer,
                    ctx.listener,
                    ctx.principal,
                    listener,
                )
            return FetchResponse(error_code=int(ErrorCode.CLUSTER_AUTHORIZATION_FAILED))
        return await self.replicas.fetch(req)

    async def list_offsets(self, ctx: RequestContext, req: ListOffsetsRequest) -> Message:
        return self.replicas.list_offsets(req)

    async def offsets_for_leader_epoch(
        self, ctx: RequestContext, req: OffsetForLeaderEpochRequest
    ) -> Message:
        return self.replicas.offsets_for_leader_epoch(req)

    # ------------------------------------------------------------------ inspection

    async def describe_replica_log(
        self, ctx: RequestContext, req: DescribeReplicaLogRequest
    ) -> DescribeReplicaLogResponse:
        """An inspection API in the manner of kafka-dump-log, read-only and always
        served: this broker's replica of one partition as it stands, including its
        epoch cache and, per batch, base/last offset, partition leader epoch, CRC and
        size, read from the segment files' batch headers (records are never decoded).

        Runs on the event loop on purpose: appends, truncations and retention run
        there too, so the walk sees one consistent log without locks. Bounded by
        `max_batches` (at most MAX_DESCRIBED_BATCHES)."""
        p = self.replicas.partitions.get((req.topic, req.partition))
        if p is None or p.role is Role.STOPPED:
            return DescribeReplicaLogResponse(
                error_code=int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
                error_message=f"broker {self.node_id} hosts no replica of "
                f"{req.topic}-{req.partition}",
            )
        log_ = p.log
        resp = DescribeReplicaLogResponse(
            log_start_offset=log_.log_start_offset,
            log_end_offset=log_.log_end_offset,
            high_watermark=p.high_watermark,
            leader_id=p.leader_id,
            leader_epoch=p.leader_epoch,
            partition_epoch=p.partition_epoch,
            isr=list(p.isr),
            epoch_entries=[
                EpochStartOffset(epoch=e.epoch, start_offset=e.start_offset)
                for e in log_.epoch_cache.entries
            ],
        )
        if not req.include_batches:
            return resp
        limit = max(0, min(req.max_batches, MAX_DESCRIBED_BATCHES))
        batches: list[ReplicaBatchInfo] = []
        try:
            for segment in log_.segments:
                if len(batches) >= limit:
                    break
                for _position, header in segment.iter_batches():
                    if len(batches) >= limit:
                        break
                    batches.append(
                        ReplicaBatchInfo(
                            base_offset=header.base_offset,
                            last_offset=header.last_offset,
                            leader_epoch=header.partition_leader_epoch,
                            crc=header.crc,
                            size=header.size,
                        )
                    )
        except (StorageError, OSError) as exc:
            log.error("DescribeReplicaLog of %s failed: %s", p.name, exc)
            resp.error_code = int(ErrorCode.KAFKA_STORAGE_ERROR)
            resp.error_message = f"cannot read the log of {p.name}: {exc}"
        resp.batches = batches
        return resp

    async def describe_log_dirs(
        self, ctx: RequestContext, req: DescribeLogDirsRequest
    ) -> DescribeLogDirsResponse:
        """Kafka's DescribeLogDirs over this broker's one data directory: its
        partitions (size, offset lag, topic id) and the stray replicas set aside in it
        (`cluster health` reports them). Read-only; sizes come from the open segments,
        a stray's from listing its directory."""
        manager = self.replicas.log_manager
        failure = manager.dir_failure.failure
        if failure is not None:
            # As Kafka: an offline log directory answers KAFKA_STORAGE_ERROR and lists
            # nothing (nothing in it is read any more); the message says why.
            return DescribeLogDirsResponse(
                results=[
                    DescribeLogDirsResult(
                        log_dir=str(manager.data_dir),
                        error_code=int(ErrorCode.KAFKA_STORAGE_ERROR),
                        error_message=str(failure),
                    )
                ]
            )
        wanted = (
            None
            if req.topics is None
            else {(t.topic, index) for t in req.topics for index in t.partitions}
        )
        by_topic: dict[str, list[DescribeLogDirsPartition]] = {}
        for log_ in manager.all_logs():
            tp = log_.topic_partition
            if wanted is not None and tp not in wanted:
                continue
            p = self.replicas.partitions.get(tp)
            lag = 0 if p is None else max(0, p.high_watermark - log_.log_end_offset)
            by_topic.setdefault(tp[0], []).append(
                DescribeLogDirsPartition(
                    partition_index=tp[1],
                    partition_size=log_.size_in_bytes,
                    offset_lag=lag,
                    topic_id=log_.topic_id,
                )
            )
        result = DescribeLogDirsResult(
            log_dir=str(manager.data_dir.resolve()),
            topics=[
                DescribeLogDirsTopicResult(
                    name=name, partitions=sorted(parts, key=lambda x: x.partition_index)
                )
                for name, parts in sorted(by_topic.items())
            ],
            strays=[
                StrayReplica(
                    dir_name=stray.path.name,
                    topic=stray.topic,
                    partition=stray.partition,
                    topic_id=stray.topic_id,
                    size_bytes=stray.size_bytes(),
                )
                for stray in manager.stray_logs()
                if wanted is None or (stray.topic, stray.partition) in wanted
            ],
        )
        try:
            usage = shutil.disk_usage(manager.data_dir)
            result.total_bytes, result.usable_bytes = usage.total, usage.free
        except OSError as exc:
            log.warning(
                "DescribeLogDirs: cannot read the disk usage of %s: %s", manager.data_dir, exc
            )
        return DescribeLogDirsResponse(results=[result])

    async def fault_control(
        self, ctx: RequestContext, req: FaultControlRequest
    ) -> FaultControlResponse:
        """Test only (served with --enable-test-faults): see broker/faults.py."""
        return self.faults.control(req)

    # ------------------------------------------------------------------ forwarded

    async def create_topics(
        self, ctx: RequestContext, req: CreateTopicsRequest
    ) -> CreateTopicsResponse:
        timeout_s = self._timeout_s(req.timeout_ms)
        try:
            resp = await self.controller.forward(req, timeout_s)
        except RpcError as exc:
            code, message = self._forward_error(exc)
            return CreateTopicsResponse(
                topics=[
                    CreatableTopicResult(name=t.name, error_code=code, error_message=message)
                    for t in req.topics
                ]
            )
        assert isinstance(resp, CreateTopicsResponse)
        if not req.validate_only:
            created = {t.name: t.topic_id for t in resp.topics if t.error_code == ErrorCode.NONE}

            def visible() -> bool:
                for name, topic_id in created.items():
                    info = self.image.topics_by_name.get(name)
                    if info is None or (topic_id and info.topic_id != topic_id):
                        return False
                return True

            await self._wait_for_image(visible, timeout_s)
        return resp

    async def delete_topics(
        self, ctx: RequestContext, req: DeleteTopicsRequest
    ) -> DeleteTopicsResponse:
        timeout_s = self._timeout_s(req.timeout_ms)
        before = {
            name: info.topic_id
            for name in req.topic_names
            if (info := self.image.topics_by_name.get(name)) is not None
        }
        try:
            resp = await self.controller.forward(req, timeout_s)
        except RpcError as exc:
            code, message = self._forward_error(exc)
            return DeleteTopicsResponse(
                responses=[
                    DeletableTopicResult(name=name, error_code=code, error_message=message)
                    for name in req.topic_names
                ]
            )
        assert isinstance(resp, DeleteTopicsResponse)
        deleted = {r.name for r in resp.responses if r.error_code == ErrorCode.NONE}

        def gone() -> bool:
            for name in deleted:
                info = self.image.topics_by_name.get(name)
                if info is not None and info.topic_id == before.get(name, info.topic_id):
                    return False
            return True

        await self._wait_for_image(gone, timeout_s)
        return resp

    async def elect_leaders(
        self, ctx: RequestContext, req: ElectLeadersRequest
    ) -> ElectLeadersResponse:
        timeout_s = self._timeout_s(req.timeout_ms)
        try:
            resp = await self.controller.forward(req, timeout_s)
        except RpcError as exc:
            code, message = self._forward_error(exc)
            return ElectLeadersResponse(
                results=[
                    ElectLeadersResult(
                        topic=p.topic, partition=p.partition, error_code=code, error_message=message
                    )
                    for p in req.partitions
                ]
            )
        assert isinstance(resp, ElectLeadersResponse)
        elected = {
            (r.topic, r.partition): r.leader_epoch
            for r in resp.results
            if r.error_code == ErrorCode.NONE
        }

        def visible() -> bool:
            for (topic, partition), epoch in elected.items():
                state = self.image.partition(topic, partition)
                if state is None or state.leader_epoch < epoch:
                    return False
            return True

        await self._wait_for_image(visible, timeout_s)
        return resp

    async def alter_user_scram_credentials(
        self, ctx: RequestContext, req: AlterUserScramCredentialsRequest
    ) -> AlterUserScramCredentialsResponse:
        """Forwarded to the controller; answered once this broker's image shows the
        changes that succeeded (a Describe right after sees them)."""
        try:
            resp = await self.controller.forward(req, self.max_forward_wait_s)
        except RpcError as exc:
            code, message = self._forward_error(exc)
            names = dict.fromkeys(c.name for c in [*req.deletions, *req.upsertions])
            return AlterUserScramCredentialsResponse(
                results=[
                    AlterUserScramCredentialsResult(user=n, error_code=code, error_message=message)
                    for n in names
                ]
            )
        assert isinstance(resp, AlterUserScramCredentialsResponse)
        done = {r.user for r in resp.results if r.error_code == ErrorCode.NONE}
        present = {(u.name, u.mechanism, u.iterations) for u in req.upsertions if u.name in done}
        absent = {(d.name, d.mechanism) for d in req.deletions if d.name in done}

        def visible() -> bool:
            creds = self.image.scram_credentials
            return all(
                (n, m) in creds and creds[(n, m)].iterations == i for n, m, i in present
            ) and not any(key in creds for key in absent)

        await self._wait_for_image(visible, self.max_forward_wait_s)
        return resp

    async def describe_user_scram_credentials(
        self, ctx: RequestContext, req: DescribeUserScramCredentialsRequest
    ) -> DescribeUserScramCredentialsResponse:
        """Each user's mechanisms and iteration counts, from this broker's image: never
        a salt or a key. A user named that has none: RESOURCE_NOT_FOUND."""
        by_user: dict[str, list[CredentialInfo]] = {}
        for (name, mechanism), cred in sorted(self.image.scram_credentials.items()):
            by_user.setdefault(name, []).append(
                CredentialInfo(mechanism=mechanism, iterations=cred.iterations)
            )
        users = sorted(by_user) if req.users is None else list(dict.fromkeys(req.users))
        return DescribeUserScramCredentialsResponse(
            results=[
                DescribeUserScramCredentialsResult(user=u, credential_infos=by_user[u])
                if u in by_user
                else DescribeUserScramCredentialsResult(
                    user=u,
                    error_code=int(ErrorCode.RESOURCE_NOT_FOUND),
                    error_message=f"user {u!r} has no SCRAM credentials",
                )
                for u in users
            ]
        )

    # ------------------------------------------------------------------ ACLs

    def _acls_disabled(self) -> str | None:
        if self.authorizer_enabled:
            return None
        return (
            f"broker {self.node_id} runs without an authorizer: start the brokers and "
            "controllers with --authorizer-enabled true to use ACLs"
        )

    async def describe_acls(self, ctx: RequestContext, req: DescribeAclsRequest) -> Message:
        """The ACLs the filter selects, from this broker's image, grouped by resource."""
        disabled = self._acls_disabled()
        if disabled is not None:
            return DescribeAclsResponse(
                error_code=int(ErrorCode.SECURITY_DISABLED), error_message=disabled
            )
        try:
            acl_filter = filter_of(req)
            problem = acl_filter.problem()
        except ValueError as exc:
            problem = str(exc)
        if problem is not None:
            return DescribeAclsResponse(
                error_code=int(ErrorCode.INVALID_REQUEST), error_message=problem
            )
        by_resource: dict[tuple[int, str, int], list[AclDescription]] = {}
        for b in sorted(self.image.acls.values()):
            if acl_filter.matches(b):
                key = (int(b.resource_type), b.resource_name, int(b.pattern_type))
                by_resource.setdefault(key, []).append(
                    AclDescription(
                        principal=b.principal,
                        host=b.host,
                        operation=int(b.operation),
                        permission_type=int(b.permission),
                    )
                )
        return DescribeAclsResponse(
            resources=[
                AclResource(resource_type=t, resource_name=n, pattern_type=p, acls=acls)
                for (t, n, p), acls in by_resource.items()
            ]
        )

    async def create_acls(self, ctx: RequestContext, req: CreateAclsRequest) -> Message:
        """Forwarded to the controller; answered once this broker's image has the ACLs
        created (a request checked right after is decided by them)."""
        disabled = self._acls_disabled()
        resp = await self._forward_acls(req, disabled, len(req.creations))
        if isinstance(resp, CreateAclsResponse):
            wanted = set()
            for creation, result in zip(req.creations, resp.results, strict=False):
                if result.error_code == ErrorCode.NONE:
                    wanted.add(binding_of(creation))
            await self._wait_for_image(
                lambda: wanted <= set(self.image.acls.values()), self.max_forward_wait_s
            )
            return resp
        return CreateAclsResponse(
            results=[
                AclCreationResult(error_code=resp[0], error_message=resp[1]) for _ in req.creations
            ]
        )

    async def delete_acls(self, ctx: RequestContext, req: DeleteAclsRequest) -> Message:
        disabled = self._acls_disabled()
        resp = await self._forward_acls(req, disabled, len(req.filters))
        if isinstance(resp, DeleteAclsResponse):
            gone = {binding_of(m) for r in resp.filter_results for m in r.matching_acls}

            def removed() -> bool:
                return gone.isdisjoint(self.image.acls.values())

            await self._wait_for_image(removed, self.max_forward_wait_s)
            return resp
        return DeleteAclsResponse(
            filter_results=[
                DeleteAclsFilterResult(error_code=resp[0], error_message=resp[1])
                for _ in req.filters
            ]
        )

    async def _forward_acls(
        self, req: Message, disabled: str | None, count: int
    ) -> Message | tuple[int, str]:
        """The controller's answer to `req`, or the (code, message) every entry gets."""
        if disabled is not None:
            return int(ErrorCode.SECURITY_DISABLED), disabled
        try:
            return await self.controller.forward(req, self.max_forward_wait_s)
        except RpcError as exc:
            return self._forward_error(exc)

    def _timeout_s(self, timeout_ms: int) -> float:
        if timeout_ms <= 0:
            return self.max_forward_wait_s
        return min(timeout_ms / 1000, self.max_forward_wait_s)

    def _forward_error(self, exc: RpcError) -> tuple[int, str]:
        if isinstance(exc, RpcErrorResponse):
            return int(exc.error), f"the controller refused the request: {exc.message}"
        log.warning("forwarding to the controller failed: %s", exc)
        return (
            int(ErrorCode.REQUEST_TIMED_OUT),
            f"controller at {self.controller.controller_address} unreachable: {exc}",
        )

    async def _wait_for_image(self, predicate: Callable[[], bool], timeout_s: float) -> None:
        if predicate():
            return
        try:
            async with self.image_updated:
                async with asyncio.timeout(timeout_s):
                    await self.image_updated.wait_for(predicate)
        except TimeoutError:
            log.info("metadata did not show a forwarded change within %.1fs", timeout_s)
