"""AsyncAdmin: topics and cluster description (kafka-python's KafkaAdminClient names).

CreateTopics / DeleteTopics go to any broker, which forwards them to the controller.
`describe_topics` shows what a partition's leader says about its log (log start
offset and high watermark via ListOffsets, fenced with the cached leader epoch) next
to the metadata (leader, leader epoch, replicas, ISR).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import NamedTuple

from client.cluster import ClusterClient
from client.errors import (
    BrokerResponseError,
    IllegalStateError,
    MinibrokerError,
    UnknownTopicOrPartitionError,
    error_for,
)
from client.offsets import list_offsets
from client.types import OffsetAndTimestamp, TopicPartition
from protocol.api import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP
from protocol.errors import ErrorCode
from protocol.messages import (
    CreatableTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
)


class NewTopic(NamedTuple):
    """-1 partitions / replication factor: the controller's defaults."""

    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    configs: Mapping[str, str] = {}


class CreatedTopic(NamedTuple):
    """What the controller created (defaults filled in)."""

    name: str
    topic_id: str
    num_partitions: int
    replication_factor: int


class PartitionDescription(NamedTuple):
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline_replicas: tuple[int, ...] = ()
    log_start_offset: int = -1  # -1: not asked, or the leader could not answer
    high_watermark: int = -1
    error: str | None = None  # why the offsets are missing


class TopicDescription(NamedTuple):
    name: str
    topic_id: str
    partitions: list[PartitionDescription]

    @property
    def replication_factor(self) -> int:
        return max((len(p.replicas) for p in self.partitions), default=0)


class BrokerDescription(NamedTuple):
    node_id: int
    host: str
    port: int
    rack: str | None = None
    is_fenced: bool = False
    broker_epoch: int = -1


class ClusterDescription(NamedTuple):
    cluster_id: str
    controller_id: int
    brokers: list[BrokerDescription]
    metadata_offset: int = -1


class AsyncAdmin:
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
    ) -> None:
        self._cluster = ClusterClient(
            bootstrap_servers,
            client_id=client_id,
            request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
            bootstrap_retries=bootstrap_retries,
        )
        self._request_timeout_ms = request_timeout_ms
        self._started = False

    @property
    def cluster(self) -> ClusterClient:
        return self._cluster

    async def start(self) -> None:
        await self._cluster.bootstrap()
        self._started = True

    async def close(self) -> None:
        await self._cluster.close()
        self._started = False

    async def __aenter__(self) -> AsyncAdmin:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

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
        for result in response.topics:
            if result.error_code != ErrorCode.NONE:
                raise error_for(result.error_code, result.error_message, topic=result.name)
        return [
            CreatedTopic(r.name, r.topic_id, r.num_partitions, r.replication_factor)
            for r in response.topics
        ]

    async def create_topic(
        self,
        name: str,
        num_partitions: int = -1,
        replication_factor: int = -1,
        configs: Mapping[str, str] | None = None,
    ) -> CreatedTopic:
        created = await self.create_topics(
            [NewTopic(name, num_partitions, replication_factor, configs or {})]
        )
        if not created:
            raise UnknownTopicOrPartitionError("the broker did not answer for it", topic=name)
        return created[0]

    async def delete_topics(self, names: Iterable[str], *, timeout_ms: int | None = None) -> None:
        self._check()
        timeout_ms = self._request_timeout_ms if timeout_ms is None else timeout_ms
        request = DeleteTopicsRequest(topic_names=list(names), timeout_ms=timeout_ms)
        response = await self._cluster.send_any(request, timeout_ms=timeout_ms + 5_000)
        assert isinstance(response, DeleteTopicsResponse)
        for result in response.responses:
            if result.error_code != ErrorCode.NONE:
                raise error_for(result.error_code, result.error_message, topic=result.name)

    async def list_topics(self) -> list[str]:
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
                        error=_short(err) if err is not None else None,
                    )
                )
            out.append(TopicDescription(name, meta.topic_id(name) or "", parts))
        return out

    # ------------------------------------------------------------ cluster

    async def describe_cluster(self) -> ClusterDescription:
        self._check()
        response = await self._cluster.send_any(DescribeClusterRequest())
        assert isinstance(response, DescribeClusterResponse)
        if response.error_code != ErrorCode.NONE:
            raise error_for(response.error_code, response.error_message)
        return ClusterDescription(
            response.cluster_id,
            response.controller_id,
            sorted(
                (
                    BrokerDescription(
                        b.broker_id, b.host, b.port, b.rack, b.is_fenced, b.broker_epoch
                    )
                    for b in response.brokers
                ),
                key=lambda b: b.node_id,
            ),
            response.metadata_offset,
        )


def _short(exc: MinibrokerError) -> str:
    if isinstance(exc, BrokerResponseError):
        return exc.error_code.name
    return str(exc)
