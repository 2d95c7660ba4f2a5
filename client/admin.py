"""AsyncAdmin: topics and cluster description (kafka-python's KafkaAdminClient names).

CreateTopics / DeleteTopics go to any broker, which forwards them to the controller.
`describe_topics` shows what a partition's leader says about its log (log start
offset and high watermark via ListOffsets, fenced with the cached leader epoch) next
to the metadata (leader, leader epoch, replicas, ISR).

Operations: `cluster_health` (the verdict of client/health.py over a broker's view,
or the controller's when its address is given, plus a probe of every live broker)
and `describe_replica_log` (one broker's replica of one partition: offsets, epoch
cache and batch headers, via DescribeReplicaLog, which brokers serve read-only).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, NamedTuple

from client.cluster import ClusterClient, parse_bootstrap_servers
from client.connection import BrokerConnection
from client.errors import (
    START_HINT,
    BrokerResponseError,
    ConnectionFailedError,
    IllegalStateError,
    InvalidRequestError,
    MinibrokerError,
    RequestTimedOutError,
    UnknownTopicOrPartitionError,
    error_for,
)
from client.health import (
    SOURCE_BROKER,
    SOURCE_CONTROLLER,
    ClusterHealth,
    OfflineLogDirHealth,
    StrayReplicaHealth,
    evaluate_health,
)
from client.offsets import list_offsets
from client.types import OffsetAndTimestamp, TopicPartition
from protocol.api import EARLIEST_TIMESTAMP, ELECTION_UNCLEAN, LATEST_TIMESTAMP
from protocol.errors import ErrorCode
from protocol.messages import (
    CreatableTopic,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
    DescribeLogDirsRequest,
    DescribeLogDirsResponse,
    DescribeReplicaLogRequest,
    DescribeReplicaLogResponse,
    ElectLeadersPartition,
    ElectLeadersRequest,
    ElectLeadersResponse,
    Message,
    MetadataRequest,
    MetadataResponse,
)

DEFAULT_CONTROLLER_PORT = 9093
# What a broker lists at most per DescribeReplicaLog (the broker caps it too).
DEFAULT_MAX_BATCHES = 100_000


_SPEC_TIMESTAMPS: dict[object, int] = {
    "earliest": EARLIEST_TIMESTAMP,
    "latest": LATEST_TIMESTAMP,
}


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


class LeaderElection(NamedTuple):
    """One partition's ElectLeaders outcome: its leader and leader epoch, and the
    error when none was elected (ElectionNotNeeded: it has a leader, shown)."""

    leader: int
    leader_epoch: int
    error: BrokerResponseError | None = None


class PartitionDescription(NamedTuple):
    """One partition: leader, leader epoch, replicas, ISR and (optionally) offsets."""

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
    """One topic and its partitions."""

    name: str
    topic_id: str
    partitions: list[PartitionDescription]

    @property
    def replication_factor(self) -> int:
        """Number of replicas of the first partition."""
        return max((len(p.replicas) for p in self.partitions), default=0)


class BrokerDescription(NamedTuple):
    """One live broker: id, address, rack."""

    node_id: int
    host: str
    port: int
    rack: str | None = None
    is_fenced: bool = False
    broker_epoch: int = -1


class ClusterDescription(NamedTuple):
    """Cluster id, controller id and live brokers."""

    cluster_id: str
    controller_id: int
    brokers: list[BrokerDescription]
    metadata_offset: int = -1


class EpochEntry(NamedTuple):
    """One leader-epoch cache entry: `epoch` started at `start_offset`."""

    epoch: int
    start_offset: int


class ReplicaBatch(NamedTuple):
    """One record batch header as it is on the replica's disk."""

    base_offset: int
    last_offset: int
    leader_epoch: int
    crc: int
    size: int


class ReplicaLogDescription(NamedTuple):
    """One broker's replica of one partition, as that broker sees it.
    `broker_id` is -1 when the broker was addressed by HOST:PORT."""

    broker_id: int
    host: str
    port: int
    topic: str
    partition: int
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    leader_id: int
    leader_epoch: int
    partition_epoch: int
    isr: tuple[int, ...]
    epoch_entries: tuple[EpochEntry, ...]
    batches: tuple[ReplicaBatch, ...]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict of this description."""
        return {
            "broker_id": self.broker_id,
            "address": f"{self.host}:{self.port}",
            "topic": self.topic,
            "partition": self.partition,
            "log_start_offset": self.log_start_offset,
            "log_end_offset": self.log_end_offset,
            "high_watermark": self.high_watermark,
            "leader_id": self.leader_id,
            "leader_epoch": self.leader_epoch,
            "partition_epoch": self.partition_epoch,
            "isr": list(self.isr),
            "epoch_entries": [e._asdict() for e in self.epoch_entries],
            "batches": [b._asdict() for b in self.batches],
        }


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
        """The metadata cache and connection pool."""
        return self._cluster

    async def start(self) -> None:
        """Connect to a bootstrap broker."""
        await self._cluster.bootstrap()
        self._started = True

    async def close(self) -> None:
        """Close every connection."""
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
        """Create one topic (see create_topics)."""
        created = await self.create_topics(
            [NewTopic(name, num_partitions, replication_factor, configs or {})]
        )
        if not created:
            raise UnknownTopicOrPartitionError("the broker did not answer for it", topic=name)
        return created[0]

    async def delete_topics(self, names: Iterable[str], *, timeout_ms: int | None = None) -> None:
        """Delete topics, waiting up to `timeout_ms`."""
        self._check()
        timeout_ms = self._request_timeout_ms if timeout_ms is None else timeout_ms
        request = DeleteTopicsRequest(topic_names=list(names), timeout_ms=timeout_ms)
        response = await self._cluster.send_any(request, timeout_ms=timeout_ms + 5_000)
        assert isinstance(response, DeleteTopicsResponse)
        for result in response.responses:
            if result.error_code != ErrorCode.NONE:
                raise error_for(result.error_code, result.error_message, topic=result.name)

    async def elect_leaders(
        self,
        partitions: Iterable[TopicPartition],
        *,
        unclean: bool,
        replica: int | None = None,
        timeout_ms: int | None = None,
    ) -> dict[TopicPartition, LeaderElection]:
        """Kafka's electLeaders, unclean only, for leaderless partitions: an in-sync
        replica if one is up, else one outside the ISR: `replica`, or the controller's
        choice. `unclean=True` says the caller accepts losing acknowledged records the
        new leader lacks. Per-partition errors are in the results."""
        self._check()
        if not unclean:
            raise ValueError(
                "only unclean elections are served (a leaderless partition gets its in-sync "
                "replica back as leader by itself): pass unclean=True to accept losing "
                "acknowledged records the new leader lacks"
            )
        tps = list(dict.fromkeys(partitions))
        if not tps:
            raise ValueError("name the partitions to elect a leader for")
        timeout_ms = self._request_timeout_ms if timeout_ms is None else timeout_ms
        chosen = -1 if replica is None else replica
        request = ElectLeadersRequest(
            election_type=ELECTION_UNCLEAN,
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
        return {
            TopicPartition(r.topic, r.partition): LeaderElection(
                r.leader,
                r.leader_epoch,
                None
                if r.error_code == ErrorCode.NONE
                else error_for(r.error_code, r.error_message, topic=r.topic, partition=r.partition),
            )
            for r in response.results
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

    async def health(
        self,
        *,
        controller: str | None = None,
        probe_brokers: bool = True,
        probe_timeout_ms: int = 3_000,
    ) -> ClusterHealth:
        """Alias of `cluster_health`."""
        return await self.cluster_health(
            controller=controller, probe_brokers=probe_brokers, probe_timeout_ms=probe_timeout_ms
        )

    # ------------------------------------------------------------ operations

    async def cluster_health(
        self,
        *,
        controller: str | None = None,
        probe_brokers: bool = True,
        probe_timeout_ms: int = 3_000,
    ) -> ClusterHealth:
        """The cluster's health (client/health.py), never raising for an unreachable
        cluster: that is a verdict (no_broker_reachable, controller_unreachable).

        Asks a bootstrap broker (DescribeCluster, Metadata for all topics); with
        `controller` (HOST:PORT) also the controller, whose answer is then the one
        evaluated (a broker's image may lag it). With `probe_brokers`, every broker
        the metadata says is live must answer DescribeLogDirs within `probe_timeout_ms`
        (a killed broker stays unfenced until the controller's session timeout); the
        answers also list the stray replicas each broker set aside.
        Works on an admin that is not started: it tries to bootstrap first."""
        errors: list[str] = []
        broker_view: tuple[ClusterDescription, list[TopicDescription]] | None = None
        try:
            if not self._started:
                await self.start()
            broker_view = (
                await self.describe_cluster(),
                await self.describe_topics(include_offsets=False),
            )
        except MinibrokerError as exc:
            errors.append(f"brokers: {_reason(exc)}")

        controller_view: tuple[ClusterDescription, list[TopicDescription]] | None = None
        controller_address: str | None = None
        if controller is not None:
            host, port = parse_address(controller, DEFAULT_CONTROLLER_PORT)
            controller_address = f"{host}:{port}"
            try:
                dc, md = await self._ask_directly(
                    host,
                    port,
                    [DescribeClusterRequest(), MetadataRequest(topics=None)],
                    timeout_ms=min(self._request_timeout_ms, 10_000),
                )
                assert isinstance(dc, DescribeClusterResponse)
                assert isinstance(md, MetadataResponse)
                controller_view = (_cluster_description(dc), topics_from_metadata(md))
            except MinibrokerError as exc:
                errors.append(f"controller {controller_address}: {_reason(exc)}")

        view = controller_view or broker_view
        unreachable: list[int] = []
        strays: list[StrayReplicaHealth] = []
        offline_dirs: list[OfflineLogDirHealth] = []
        if view is not None and probe_brokers:
            # Prefer the addresses a broker gave: they are those of the listener this
            # client reached it on; the controller knows the first listener only.
            addresses = {b.node_id: (b.host, b.port) for b in view[0].brokers}
            if broker_view is not None:
                addresses.update({b.node_id: (b.host, b.port) for b in broker_view[0].brokers})
            # Fenced brokers too: one fenced for a failed disk says so.
            fenced = {b.node_id for b in view[0].brokers if b.is_fenced}
            probed = sorted(addresses)
            answers = await asyncio.gather(
                *(self._probe(*addresses[n], n, probe_timeout_ms) for n in probed)
            )
            for node_id, (why, found, offline) in zip(probed, answers, strict=True):
                if why is not None and node_id not in fenced:
                    unreachable.append(node_id)
                    errors.append(f"broker {node_id}: {why}")
                strays.extend(found)
                offline_dirs.extend(offline)
        return evaluate_health(
            view[0] if view is not None else None,
            view[1] if view is not None else [],
            source=SOURCE_CONTROLLER if controller_view is not None else SOURCE_BROKER,
            brokers_reachable=broker_view is not None,
            controller_address=controller_address,
            controller_reachable=None if controller is None else controller_view is not None,
            unreachable_brokers=unreachable,
            errors=errors,
            stray_replicas=strays,
            offline_log_dirs=offline_dirs,
        )

    async def describe_replica_log(
        self,
        broker: int | str,
        topic: str,
        partition: int,
        *,
        include_batches: bool = True,
        max_batches: int = DEFAULT_MAX_BATCHES,
        timeout_ms: int | None = None,
    ) -> ReplicaLogDescription:
        """One broker's replica of `topic`-`partition` (DescribeReplicaLog): log start
        offset, log end offset, high watermark, the leader / epochs / ISR that broker
        knows, its leader-epoch cache and, with `include_batches`, every batch header
        (at most `max_batches`). `broker` is a node id (looked up with
        DescribeCluster, so a fenced broker that still runs can be inspected) or
        "HOST:PORT" (no bootstrap needed)."""
        if isinstance(broker, str):
            host, port = parse_address(broker)
            broker_id = -1
        else:
            self._check()
            cluster = await self.describe_cluster()
            found = next((b for b in cluster.brokers if b.node_id == broker), None)
            if found is None:
                known = " ".join(str(b.node_id) for b in cluster.brokers) or "none"
                raise MinibrokerError(
                    f"broker {broker} is not registered in the cluster (brokers: {known}); "
                    "pass a registered --broker ID or --at HOST:PORT"
                )
            host, port, broker_id = found.host, found.port, found.node_id
        where = f"broker {broker_id} at {host}:{port}" if broker_id >= 0 else f"{host}:{port}"
        request = DescribeReplicaLogRequest(
            topic=topic,
            partition=partition,
            include_batches=include_batches,
            max_batches=max_batches,
        )
        try:
            (response,) = await self._ask_directly(
                host,
                port,
                [request],
                timeout_ms=self._request_timeout_ms if timeout_ms is None else timeout_ms,
                node_id=broker_id,
            )
        except InvalidRequestError as exc:
            raise MinibrokerError(
                f"{where} does not serve DescribeReplicaLog (INVALID_REQUEST: {exc.message}): "
                "it is not a broker (the controller?) or runs a minibroker without replica "
                "inspection; point --broker / --at at an up-to-date broker"
            ) from exc
        assert isinstance(response, DescribeReplicaLogResponse)
        if response.error_code != ErrorCode.NONE:
            raise error_for(
                response.error_code,
                f"{response.error_message or ''} (from {where})".strip(),
                topic=topic,
                partition=partition,
            )
        return ReplicaLogDescription(
            broker_id=broker_id,
            host=host,
            port=port,
            topic=topic,
            partition=partition,
            log_start_offset=response.log_start_offset,
            log_end_offset=response.log_end_offset,
            high_watermark=response.high_watermark,
            leader_id=response.leader_id,
            leader_epoch=response.leader_epoch,
            partition_epoch=response.partition_epoch,
            isr=tuple(response.isr),
            epoch_entries=tuple(
                EpochEntry(e.epoch, e.start_offset) for e in response.epoch_entries
            ),
            batches=tuple(
                ReplicaBatch(b.base_offset, b.last_offset, b.leader_epoch, b.crc, b.size)
                for b in response.batches
            ),
        )

    async def _ask_directly(
        self,
        host: str,
        port: int,
        requests: list[Message],
        *,
        timeout_ms: int,
        node_id: int = -1,
    ) -> list[Message]:
        """Requests over a connection of their own (the controller, or a broker the
        metadata cache does not list), closed afterwards."""
        conn = BrokerConnection(
            host,
            port,
            node_id=node_id,
            client_id=self._cluster.client_id,
            request_timeout_ms=timeout_ms,
            connect_timeout_ms=timeout_ms,
        )
        try:
            await conn.connect()
            responses = []
            for request in requests:
                response = await conn.send(request)
                assert response is not None
                responses.append(response)
            return responses
        finally:
            await conn.close()

    async def _probe(
        self, host: str, port: int, node_id: int, timeout_ms: int
    ) -> tuple[str | None, list[StrayReplicaHealth], list[OfflineLogDirHealth]]:
        """(None when the broker answers DescribeLogDirs in time (an error answer is
        an answer too), else why not; the stray replicas it reports; its log
        directories that answer an error: offline)."""
        try:
            (response,) = await self._ask_directly(
                host, port, [DescribeLogDirsRequest()], timeout_ms=timeout_ms, node_id=node_id
            )
        except (ConnectionFailedError, RequestTimedOutError) as exc:
            return _reason(exc), [], []
        except BrokerResponseError:
            return None, [], []  # alive; an older broker without DescribeLogDirs
        assert isinstance(response, DescribeLogDirsResponse)
        strays = [
            StrayReplicaHealth(node_id, s.dir_name, s.topic, s.partition, s.topic_id, s.size_bytes)
            for result in response.results
            for s in result.strays
        ]
        offline = [
            OfflineLogDirHealth(node_id, result.log_dir, result.error_message or "")
            for result in response.results
            if result.error_code != 0
        ]
        return None, strays, offline


def parse_address(text: str, default_port: int | None = None) -> tuple[str, int]:
    """One HOST:PORT ('[::1]:9093' for IPv6); the port may be left out only when a
    default is given."""
    stripped = text.strip()
    if "," in stripped:
        raise ValueError(f"expected one HOST:PORT, got {text!r}")
    if stripped.startswith("["):
        has_port = ":" in stripped.rsplit("]", 1)[-1]
    elif stripped.count(":") > 1:
        raise ValueError(f"bad address {text!r}: write an IPv6 address as [HOST]:PORT")
    else:
        has_port = ":" in stripped
    if not has_port:
        if default_port is None:
            raise ValueError(f"bad address {text!r}: expected HOST:PORT")
        stripped = f"{stripped}:{default_port}"
    return parse_bootstrap_servers(stripped)[0]


def _cluster_description(response: DescribeClusterResponse) -> ClusterDescription:
    if response.error_code != ErrorCode.NONE:
        raise error_for(response.error_code, response.error_message)
    return ClusterDescription(
        response.cluster_id,
        response.controller_id,
        sorted(
            (
                BrokerDescription(b.broker_id, b.host, b.port, b.rack, b.is_fenced, b.broker_epoch)
                for b in response.brokers
            ),
            key=lambda b: b.node_id,
        ),
        response.metadata_offset,
    )


def topics_from_metadata(response: MetadataResponse) -> list[TopicDescription]:
    """Topic descriptions straight from one Metadata answer (no cache, no offsets);
    topics answered with an error are left out."""
    out = []
    for t in sorted(response.topics, key=lambda t: t.name):
        if t.error_code != ErrorCode.NONE:
            continue
        parts = [
            PartitionDescription(
                partition=p.partition_index,
                leader=p.leader_id,
                leader_epoch=p.leader_epoch,
                replicas=tuple(p.replica_nodes),
                isr=tuple(p.isr_nodes),
                offline_replicas=tuple(p.offline_replicas),
            )
            for p in sorted(t.partitions, key=lambda p: p.partition_index)
        ]
        out.append(TopicDescription(t.name, t.topic_id, parts))
    return out


def _short(exc: MinibrokerError) -> str:
    if isinstance(exc, BrokerResponseError):
        return exc.error_code.name
    return str(exc)


def _reason(exc: MinibrokerError) -> str:
    """One line for a health report: the why without the how-to-start hint."""
    if isinstance(exc, ConnectionFailedError):
        return exc.reason
    text = str(exc)
    cut = text.find(f"; {START_HINT}")
    return text[:cut] if cut >= 0 else text
