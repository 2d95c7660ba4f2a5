"""AsyncAdmin: topics and cluster description (kafka-python's KafkaAdminClient names).

CreateTopics / DeleteTopics go to any broker, which forwards them to the controller.
`describe_topics` shows what a partition's leader says about its log (log start
offset and high watermark via ListOffsets, fenced with the cached leader epoch) next
to the metadata (leader, leader epoch, replicas, ISR).

Consumer groups (client/group_admin.py): `list_groups`, `describe_group`,
`list_group_offsets`, `group_lag`, `alter_group_offsets`, `delete_groups`.

Operations: `cluster_health` (the verdict of client/health.py over a broker's view,
or the controller's when its address is given, plus a probe of every live broker)
and `describe_replica_log` (one broker's replica of one partition: offsets, epoch
cache and batch headers, via DescribeReplicaLog, which brokers serve read-only).
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable
from collections.abc import Mapping

from client.acl_admin import AclAdmin
from client.admin_diagnostics import DEFAULT_CONTROLLER_PORT
from client.admin_diagnostics import DEFAULT_MAX_BATCHES
from client.admin_diagnostics import Diagnostics
from client.admin_diagnostics import parse_address
from client.admin_diagnostics import parse_addresses
from client.answer_matching import missing_result
from client.answer_matching import result_for_each
from client.cluster import ClusterClient
from client.descriptions import BrokerDescription
from client.descriptions import ClusterDescription
from client.descriptions import CreatedTopic
from client.descriptions import EpochEntry
from client.descriptions import LeaderElection
from client.descriptions import NewTopic
from client.descriptions import PartitionDescription
from client.descriptions import ReplicaBatch
from client.descriptions import ReplicaLogDescription
from client.descriptions import TopicDescription
from client.descriptions import _cluster_description
from client.descriptions import topics_from_metadata
from client.errors import BrokerResponseError
from client.errors import ConnectionFailedError
from client.errors import IllegalStateError
from client.errors import MinibrokerError
from client.errors import UnknownTopicOrPartitionError
from client.errors import error_for
from client.group_admin import GroupAdmin
from client.group_admin import GroupDescription
from client.group_admin import GroupListing
from client.group_admin import MemberDescription
from client.group_admin import PartitionLag
from client.lifecycle import AsyncClient
from client.offsets import list_offsets
from client.quota_admin import QuotaAdmin
from client.types import OffsetAndTimestamp
from client.types import TopicPartition
from client.user_admin import UserAdmin
from protocol.api import EARLIEST_TIMESTAMP
from protocol.api import ELECTION_PREFERRED
from protocol.api import ELECTION_UNCLEAN
from protocol.api import LATEST_TIMESTAMP
from protocol.errors import ErrorCode
from protocol.messages import CreatableTopic
from protocol.messages import CreateTopicsRequest
from protocol.messages import CreateTopicsResponse
from protocol.messages import DeleteTopicsRequest
from protocol.messages import DeleteTopicsResponse
from protocol.messages import DescribeClusterRequest
from protocol.messages import DescribeClusterResponse
from protocol.messages import ElectLeadersPartition
from protocol.messages import ElectLeadersRequest
from protocol.messages import ElectLeadersResponse

__all__ = [
    "DEFAULT_CONTROLLER_PORT",
    "DEFAULT_MAX_BATCHES",
    "AsyncAdmin",
    "BrokerDescription",
    "ClusterDescription",
    "CreatedTopic",
    "EpochEntry",
    "GroupDescription",
    "GroupListing",
    "LeaderElection",
    "MemberDescription",
    "NewTopic",
    "PartitionDescription",
    "PartitionLag",
    "ReplicaBatch",
    "ReplicaLogDescription",
    "TopicDescription",
    "parse_address",
    "parse_addresses",
    "topics_from_metadata",
]


_SPEC_TIMESTAMPS: dict[object, int] = {
    "earliest": EARLIEST_TIMESTAMP,
    "latest": LATEST_TIMESTAMP,
}


class AsyncAdmin(Diagnostics, GroupAdmin, UserAdmin, AclAdmin, QuotaAdmin, AsyncClient):
    """Administrative operations. Use `async with AsyncAdmin(...) as admin:` or
    `await start()` / `await close()`."""

    def __init__(
        self,
        bootstrap_servers: str | Iterable[str] = "127.0.0.1:9092",
        *,
        client_id: str = "minibroker-admin",
        request_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 100,
        bootstrap_retries: int = 3,
        security_protocol: str = "PLAINTEXT",
        ssl_context: ssl.SSLContext | None = None,
        sasl_mechanism: str | None = None,
        sasl_plain_username: str | None = None,
        sasl_plain_password: str | None = None,
    ) -> None:
        self._cluster = ClusterClient(
            bootstrap_servers,
            client_id=client_id,
            request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
            bootstrap_retries=bootstrap_retries,
            security_protocol=security_protocol,
            ssl_context=ssl_context,
            sasl_mechanism=sasl_mechanism,
            sasl_plain_username=sasl_plain_username,
            sasl_plain_password=sasl_plain_password,
        )
        self._request_timeout_ms = request_timeout_ms
        self._started = False

    async def close(self) -> None:
        """Close every connection."""
        await self._cluster.close()
        self._started = False

    def _check(self) -> None:
        if not self._started:
            raise IllegalStateError("AsyncAdmin is not started: await admin.start() first")

    # ------------------------------------------------------------ topics

    async def create_topics(
        self,
        new_topics: Iterable[NewTopic],
        *,
        timeout_ms: int | None = None,
        validate_only: bool = False,
    ) -> list[CreatedTopic]:
        """Create topics; raises the first topic's error (TopicAlreadyExistsError,
        InvalidReplicationFactorError, InvalidConfigurationError, ...)."""
        self._check()
        timeout_ms = self._request_timeout_ms if timeout_ms is None else timeout_ms
        request = CreateTopicsRequest(
            topics=[
                CreatableTopic(
                    name=t.name,
                    num_partitions=t.num_partitions,
                    replication_factor=t.replication_factor,
                    configs=dict(t.configs),
                )
                for t in new_topics
            ],
            timeout_ms=timeout_ms,
            validate_only=validate_only,
        )
        # The broker waits up to timeout_ms for the controller: give it a margin.
        response = await self._cluster.send_any(request, timeout_ms=timeout_ms + 5_000)
        assert isinstance(response, CreateTopicsResponse)
        results = result_for_each(
            (t.name for t in request.topics),
            response.topics,
            lambda r: r.name,
            what="topic",
            request="CreateTopics",
        )
        for result in results:
            if result.error_code != ErrorCode.NONE:
                raise error_for(result.error_code, result.error_message, topic=result.name)
        return [
            CreatedTopic(r.name, r.topic_id, r.num_partitions, r.replication_factor)
            for r in results
        ]

    async def create_topic(
        self,
        name: str,
        num_partitions: int = -1,
        replication_factor: int = -1,
        configs: Mapping[str, str] | None = None,
    ) -> CreatedTopic:
        """Create one topic (see create_topics)."""
        created = await self.create_topics(
            [NewTopic(name, num_partitions, replication_factor, configs or {})]
        )
        return created[0]  # one result per topic asked (create_topics checks)

    async def delete_topics(self, names: Iterable[str], *, timeout_ms: int | None = None) -> None:
        """Delete topics, waiting up to `timeout_ms`."""
        self._check()
        timeout_ms = self._request_timeout_ms if timeout_ms is None else timeout_ms
        request = DeleteTopicsRequest(topic_names=list(names), timeout_ms=timeout_ms)
        response = await self._cluster.send_any(request, timeout_ms=timeout_ms + 5_000)
        assert isinstance(response, DeleteTopicsResponse)
        results = result_for_each(
            request.topic_names,
            response.responses,
            lambda r: r.name,
            what="topic",
            request="DeleteTopics",
        )
        for result in results:
            if result.error_code != ErrorCode.NONE:
                raise error_for(result.error_code, result.error_message, topic=result.name)

    async def elect_leaders(
        self,
        partitions: Iterable[TopicPartition],
        *,
        unclean: bool = False,
        preferred: bool = False,
        replica: int | None = None,
        timeout_ms: int | None = None,
    ) -> dict[TopicPartition, LeaderElection]:
        """Kafka's electLeaders. `preferred=True`: the partitions (every partition of
        the cluster when none are named) led again by their preferred replica, the first
        listed, where it is in sync. `unclean=True`, for leaderless partitions: an
        in-sync replica if one is up, else one outside the ISR: `replica`, or the
        controller's choice; it says the caller accepts losing acknowledged records the
        new leader lacks. Per-partition errors are in the results."""
        self._check()
        if unclean == preferred:
            raise ValueError(
                "say which election: preferred=True (back to the preferred replica) or "
                "unclean=True (a leaderless partition, accepting to lose acknowledged "
                "records the new leader lacks)"
            )
        if preferred and replica is not None:
            raise ValueError("a preferred election elects the first replica listed: no replica")
        tps = list(dict.fromkeys(partitions))
        if unclean and not tps:
            raise ValueError("name the partitions to elect a leader for")
        timeout_ms = self._request_timeout_ms if timeout_ms is None else timeout_ms
        chosen = -1 if replica is None else replica
        request = ElectLeadersRequest(
            election_type=ELECTION_PREFERRED if preferred else ELECTION_UNCLEAN,
            partitions=[
                ElectLeadersPartition(topic=tp.topic, partition=tp.partition, replica=chosen)
                for tp in tps
            ],
            timeout_ms=timeout_ms,
        )
        response = await self._cluster.send_any(request, timeout_ms=timeout_ms + 5_000)
        assert isinstance(response, ElectLeadersResponse)
        if response.error_code != ErrorCode.NONE:
            raise error_for(response.error_code, response.error_message)
        elections = {
            TopicPartition(r.topic, r.partition): LeaderElection(
                r.leader,
                r.leader_epoch,
                None
                if r.error_code == ErrorCode.NONE
                else error_for(r.error_code, r.error_message, topic=r.topic, partition=r.partition),
            )
            for r in response.results
        }
        if not tps:
            return elections  # every partition of the cluster: whatever it answered
        return {
            tp: elections[tp]
            if tp in elections
            else LeaderElection(-1, -1, missing_result("partition", tp, "ElectLeaders"))
            for tp in tps
        }

    async def list_topics(self) -> list[str]:
        """Sorted topic names."""
        self._check()
        response, _ = await self._cluster.fetch_metadata(all_topics=True)
        return sorted(t.name for t in response.topics if t.error_code == ErrorCode.NONE)

    async def describe_topics(
        self, topics: Iterable[str] | None = None, *, include_offsets: bool = True
    ) -> list[TopicDescription]:
        """Per partition: leader, leader epoch, replicas, ISR and, with
        `include_offsets`, the leader's log start offset and high watermark.
        Named topics that do not exist raise UnknownTopicOrPartitionError."""
        self._check()
        names = None if topics is None else list(dict.fromkeys(topics))
        if names is None:
            response, _ = await self._cluster.fetch_metadata(all_topics=True)
            names = sorted(t.name for t in response.topics if t.error_code == ErrorCode.NONE)
        elif names:
            response, update = await self._cluster.fetch_metadata(names)
            for name in names:
                code = update.topic_errors.get(name)
                if code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                    raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist", topic=name)
                if code is not None:
                    raise error_for(code, topic=name)
        meta = self._cluster.metadata
        tps = [
            TopicPartition(name, p) for name in names for p in meta.partitions_for_topic(name) or []
        ]
        earliest: dict[TopicPartition, OffsetAndTimestamp] = {}
        latest: dict[TopicPartition, OffsetAndTimestamp] = {}
        errors: dict[TopicPartition, MinibrokerError] = {}
        if include_offsets and tps:
            earliest, errors = await list_offsets(
                self._cluster, dict.fromkeys(tps, EARLIEST_TIMESTAMP), max_attempts=3
            )
            latest, errors2 = await list_offsets(
                self._cluster, dict.fromkeys(tps, LATEST_TIMESTAMP), max_attempts=3
            )
            errors = {**errors2, **errors}
        out: list[TopicDescription] = []
        for name in names:
            parts: list[PartitionDescription] = []
            for p in meta.partitions_for_topic(name) or []:
                tp = TopicPartition(name, p)
                pm = meta.partition(tp)
                assert pm is not None
                err = errors.get(tp)
                unreachable = isinstance(err, ConnectionFailedError) and pm.leader >= 0
                why = None if err is None else _short(err)
                if isinstance(err, ConnectionFailedError) and unreachable:
                    why = (
                        f"leader {pm.leader} not answering ({err.reason}); the controller "
                        "has not fenced it yet"
                    )
                parts.append(
                    PartitionDescription(
                        partition=p,
                        leader=pm.leader,
                        leader_epoch=pm.leader_epoch,
                        replicas=pm.replicas,
                        isr=pm.isr,
                        offline_replicas=pm.offline_replicas,
                        log_start_offset=earliest[tp].offset if tp in earliest else -1,
                        high_watermark=latest[tp].offset if tp in latest else -1,
                        error=why,
                        leader_unreachable=unreachable,
                    )
                )
            out.append(TopicDescription(name, meta.topic_id(name) or "", parts))
        return out

    # ------------------------------------------------------------ cluster

    async def describe_cluster(self) -> ClusterDescription:
        """As a broker's metadata image has it: every registered broker, fenced ones
        included. (A broker reports as controller_id the live broker that forwards
        controller requests; the controller itself reports its own node id.)"""
        self._check()
        response = await self._cluster.send_any(DescribeClusterRequest())
        assert isinstance(response, DescribeClusterResponse)
        return _cluster_description(response)

    async def list_offsets(
        self,
        timestamps: Mapping[TopicPartition, int | str],
        *,
        isolation_level: int = 0,
    ) -> dict[TopicPartition, OffsetAndTimestamp]:
        """ListOffsets per partition: a timestamp in ms, or 'earliest' (-2) / 'latest'
        (-1). Returns offset, timestamp and leader epoch of each; raises the first error
        left after bounded retries."""
        self._check()
        wanted: dict[TopicPartition, int] = {}
        for tp, spec in timestamps.items():
            wanted[TopicPartition(*tp)] = int(_SPEC_TIMESTAMPS.get(spec, spec))
        await self._cluster.wait_for_topics(
            {tp.topic for tp in wanted}, timeout_ms=self._request_timeout_ms
        )
        results, errors = await list_offsets(self._cluster, wanted, isolation_level=isolation_level)
        if errors:
            raise next(iter(errors.values()))
        return results

    # ------------------------------------------------------------ operations


def _short(exc: MinibrokerError) -> str:
    if isinstance(exc, BrokerResponseError):
        return exc.error_code.name
    return str(exc)
