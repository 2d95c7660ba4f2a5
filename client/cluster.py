"""The cluster as a client sees it: bootstrap, the metadata cache, a connection per broker.

The metadata cache is keyed by (topic, partition) and remembers each partition's
leader epoch. KIP-232: brokers answer Metadata from their own image, which may lag the
controller, so a response whose leader epoch for a partition is OLDER than the one the
client has seen is ignored for that partition (the cached entry stays) and another
refresh is scheduled, against another broker. Otherwise a lagging broker would send
the client back to a deposed leader, or make a consumer reset its offset for nothing
(KAFKA-6262). The last seen epoch of a partition outlives its cache entry (a broker
that does not know the topic yet does not reset it); a new topic id (the topic was
deleted and created again) resets it, since epochs restart at 0.

A position about to be validated can carry a newer leader epoch than any answer so far
(a seek or a committed offset with its epoch, a Spark plan): `await_leader_epoch`
records it, and until an answer reaches it the partition's entry is not current
(`leader_for` refuses it) and older answers count as stale, so the refresh goes to
another broker. This is Kafka's `Metadata.updateLastSeenEpochIfNewer` (called from
seek and from committed offsets) with `partitionMetadataIfCurrent` (KIP-320: "wait
until the metadata has at least reached the epoch of the committed offset").
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
import time
from collections.abc import Iterable
from typing import NamedTuple

from client.bootstrap_servers import parse_bootstrap_servers
from client.connection import BrokerConnection
from client.errors import ConnectionFailedError
from client.errors import KafkaTimeoutError
from client.errors import LeaderEpochBehindError
from client.errors import LeaderNotAvailableError
from client.errors import MinibrokerError
from client.errors import NoBrokersAvailableError
from client.errors import RequestTimedOutError
from client.errors import UnknownTopicOrPartitionError
from client.errors import error_for
from client.errors import short_reason
from client.security import connection_sasl
from client.security import connection_tls
from client.types import TopicPartition
from protocol.api import NO_EPOCH
from protocol.errors import ErrorCode
from protocol.messages import Message
from protocol.messages import MetadataRequest
from protocol.messages import MetadataResponse
from runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)


class BrokerMetadata(NamedTuple):
    """A live broker as Metadata lists it."""

    node_id: int
    host: str
    port: int
    rack: str | None = None


class PartitionMetadata(NamedTuple):
    """A partition as Metadata describes it, with its leader epoch."""

    topic: str
    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline_replicas: tuple[int, ...] = ()
    error_code: int = 0


class MetadataUpdate(NamedTuple):
    """What applying one Metadata response did."""

    stale: list[TopicPartition]  # older than the cache: ignored (KIP-232)
    updated: list[TopicPartition]
    topic_errors: dict[str, ErrorCode]


class ClusterMetadata:
    """The metadata cache. Pure state, no I/O: `update()` applies a response.

    `unsafe_accept_stale_metadata` is TEST-ONLY: it switches the KIP-232 rule off, so an
    answer older for a partition than the cache replaces the entry (how clients before
    KIP-232 behaved), and with it the awaited epochs of positions (Kafka keeps both in
    one last-seen-epoch map): a position's epoch no longer holds the client back from
    an older leader. Scenario 6 uses it to show the anomaly the rule prevents; never
    set it in an application.
    """

    def __init__(self, *, unsafe_accept_stale_metadata: bool = False) -> None:
        self.unsafe_accept_stale_metadata = unsafe_accept_stale_metadata
        self.brokers: dict[int, BrokerMetadata] = {}
        self.cluster_id: str | None = None
        self.controller_id = -1
        self.metadata_offset = -1
        self.last_refresh_ms = 0.0
        self._partitions: dict[TopicPartition, PartitionMetadata] = {}
        self._topic_partitions: dict[str, list[int]] = {}
        self._topic_ids: dict[str, str] = {}
        # Survives removal of the topic from the cache; reset by a new topic id.
        self._last_seen_epochs: dict[TopicPartition, int] = {}
        # Epochs of positions to validate, newer than any answer yet (see the module
        # docstring); dropped once an answer reaches them.
        self._awaited_epochs: dict[TopicPartition, int] = {}

    # ------------------------------------------------------------ reads

    def topics(self) -> list[str]:
        """Sorted names of the cached topics."""
        return sorted(self._topic_partitions)

    def topic_id(self, topic: str) -> str | None:
        """The cached topic id (None: unknown)."""
        return self._topic_ids.get(topic)

    def partitions_for_topic(self, topic: str) -> list[int] | None:
        """Sorted partition ids, or None when the topic is not in the cache."""
        parts = self._topic_partitions.get(topic)
        return list(parts) if parts is not None else None

    def partition_count(self, topic: str) -> int | None:
        """Number of partitions (None: topic not cached)."""
        parts = self._topic_partitions.get(topic)
        return len(parts) if parts is not None else None

    def available_partitions_for_topic(self, topic: str) -> list[int]:
        """Partitions that have a leader."""
        parts = self._topic_partitions.get(topic) or []
        return [p for p in parts if self._partitions[TopicPartition(topic, p)].leader >= 0]

    def partition(self, tp: TopicPartition) -> PartitionMetadata | None:
        """The cached metadata of a partition (None: unknown)."""
        return self._partitions.get(tp)

    def last_seen_epoch(self, tp: TopicPartition) -> int:
        """Highest leader epoch seen for the partition (KIP-232), -1 if none."""
        return self._last_seen_epochs.get(tp, NO_EPOCH)

    def awaited_epoch(self, tp: TopicPartition) -> int:
        """The leader epoch a position to validate needs and no answer has reached yet
        (-1: none): the entry is not current until it does."""
        return self._awaited_epochs.get(tp, NO_EPOCH)

    def await_leader_epoch(self, tp: TopicPartition, epoch: int) -> None:
        """A position of leader epoch `epoch` is to be validated: treat every answer
        older than it as stale (Kafka's updateLastSeenEpochIfNewer)."""
        if self.unsafe_accept_stale_metadata:
            return  # test-only: the rule is off (see the class docstring)
        if epoch > max(self._last_seen_epochs.get(tp, NO_EPOCH), self.awaited_epoch(tp)):
            self._awaited_epochs[tp] = epoch

    def stop_awaiting(self, tp: TopicPartition) -> None:
        """The position that needed an epoch is gone (a seek without one, a reset)."""
        self._awaited_epochs.pop(tp, None)

    def broker(self, node_id: int) -> BrokerMetadata | None:
        """A cached broker by id (None: not live)."""
        return self.brokers.get(node_id)

    # ------------------------------------------------------------ writes

    def update(self, response: MetadataResponse) -> MetadataUpdate:
        """Apply a Metadata response; partitions older than the cache are kept and reported
        stale (KIP-232)."""
        stale: list[TopicPartition] = []
        updated: list[TopicPartition] = []
        topic_errors: dict[str, ErrorCode] = {}
        for topic in response.topics:
            if topic.error_code != ErrorCode.NONE:
                code = ErrorCode.of(topic.error_code)
                topic_errors[topic.name] = code
                if code in (
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    ErrorCode.INVALID_TOPIC_EXCEPTION,
                    ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                ):
                    self._drop_topic(topic.name)
                continue
            cached_id = self._topic_ids.get(topic.name)
            if cached_id and topic.topic_id and cached_id != topic.topic_id:
                log.info(
                    "topic %s has a new id %s (was %s): it was re-created, forgetting its epochs",
                    topic.name,
                    topic.topic_id,
                    cached_id,
                )
                self._drop_topic(topic.name, forget_epochs=True)
            if topic.topic_id:
                self._topic_ids[topic.name] = topic.topic_id
            ids = set(self._topic_partitions.get(topic.name, ()))
            for p in topic.partitions:
                tp = TopicPartition(topic.name, p.partition_index)
                seen = self._last_seen_epochs.get(tp, NO_EPOCH)
                newest = max(seen, self.awaited_epoch(tp))
                current = True
                if p.leader_epoch != NO_EPOCH and p.leader_epoch < newest:
                    if not self.unsafe_accept_stale_metadata:
                        # KIP-232: an older view of this partition than we have seen.
                        stale.append(tp)
                        if p.leader_epoch < seen or tp in self._partitions:
                            continue
                        # Older only than an awaited epoch, and nothing cached: keep
                        # it so the partition is known; leader_for refuses it.
                        current = False
                    else:
                        log.warning(
                            "UNSAFE (test-only unsafe_accept_stale_metadata): adopting "
                            "leader %d at epoch %d for %s although epoch %d was seen",
                            p.leader_id,
                            p.leader_epoch,
                            tp,
                            newest,
                        )
                if p.leader_epoch != NO_EPOCH:
                    self._last_seen_epochs[tp] = p.leader_epoch
                    if p.leader_epoch >= self.awaited_epoch(tp):
                        self._awaited_epochs.pop(tp, None)
                self._partitions[tp] = PartitionMetadata(
                    topic.name,
                    p.partition_index,
                    p.leader_id,
                    p.leader_epoch,
                    tuple(p.replica_nodes),
                    tuple(p.isr_nodes),
                    tuple(p.offline_replicas),
                    p.error_code,
                )
                ids.add(p.partition_index)
                if current:
                    updated.append(tp)
            if ids:
                self._topic_partitions[topic.name] = sorted(ids)
            else:  # listed with no partitions: not one to use yet (as one being created)
                topic_errors[topic.name] = ErrorCode.LEADER_NOT_AVAILABLE
        brokers = {
            b.node_id: BrokerMetadata(b.node_id, b.host, b.port, b.rack) for b in response.brokers
        }
        if stale:
            # Entries we kept may name brokers this (older) answer no longer lists.
            self.brokers = {**self.brokers, **brokers}
        else:
            self.brokers = brokers
            self.cluster_id = response.cluster_id
            self.controller_id = response.controller_id
            self.metadata_offset = response.metadata_offset
        self.last_refresh_ms = time.monotonic() * 1000
        return MetadataUpdate(stale, updated, topic_errors)

    def _drop_topic(self, topic: str, *, forget_epochs: bool = False) -> None:
        for p in self._topic_partitions.pop(topic, ()):
            tp = TopicPartition(topic, p)
            self._partitions.pop(tp, None)
            if forget_epochs:
                self._last_seen_epochs.pop(tp, None)
        if forget_epochs:
            self._topic_ids.pop(topic, None)
            for epochs in (self._last_seen_epochs, self._awaited_epochs):
                for tp in [tp for tp in epochs if tp.topic == topic]:
                    del epochs[tp]


class ClusterClient:
    """Bootstrap, metadata and a connection pool keyed by node id."""

    def __init__(
        self,
        bootstrap_servers: str | Iterable[str] = "127.0.0.1:9092",
        *,
        client_id: str = "minibroker",
        request_timeout_ms: int = 30_000,
        connect_timeout_ms: int = 10_000,
        retry_backoff_ms: int = 100,
        bootstrap_retries: int = 3,
        max_stale_refreshes: int = 5,
        max_in_flight_requests_per_connection: int = 100,
        unsafe_accept_stale_metadata: bool = False,
        security_protocol: str = "PLAINTEXT",
        ssl_context: ssl.SSLContext | None = None,
        sasl_mechanism: str | None = None,
        sasl_plain_username: str | None = None,
        sasl_plain_password: str | None = None,
    ) -> None:
        """`unsafe_accept_stale_metadata` is TEST-ONLY (KIP-232 rule off, see
        ClusterMetadata). `security_protocol` / `ssl_context`: client/security.py."""
        self.tls = connection_tls(security_protocol, ssl_context)
        self.sasl = connection_sasl(
            security_protocol, sasl_mechanism, sasl_plain_username, sasl_plain_password
        )
        self.bootstrap_servers = parse_bootstrap_servers(bootstrap_servers)
        self.client_id = client_id
        self.request_timeout_ms = request_timeout_ms
        self.connect_timeout_ms = connect_timeout_ms
        self.retry_backoff_ms = retry_backoff_ms
        self.bootstrap_retries = bootstrap_retries
        self.max_stale_refreshes = max_stale_refreshes
        self.max_in_flight = max_in_flight_requests_per_connection
        self.metadata = ClusterMetadata(unsafe_accept_stale_metadata=unsafe_accept_stale_metadata)
        self._topics: set[str] = set()  # topics this client cares about
        self._conns: dict[int, BrokerConnection] = {}
        # A group coordinator's own connection per broker (Kafka's consumer opens one
        # too): a long-polled JoinGroup or a heartbeat never waits behind a Fetch's
        # long poll on the data connection, whose answers come in order.
        self._coordinator_conns: dict[int, BrokerConnection] = {}
        self._bootstrap_conns: dict[tuple[str, int], BrokerConnection] = {}
        self._connecting: dict[tuple[int, int], asyncio.Lock] = {}
        self._refresh_lock = asyncio.Lock()
        self._refresh_task: asyncio.Task[None] | None = None
        self._stale_refreshes = 0
        # The broker whose last answer was stale: refreshes try the others first.
        self._stale_node = -1
        self._bootstrapped = False
        self._closed = False

    # ------------------------------------------------------------ lifecycle

    async def bootstrap(self) -> None:
        """Fetch the first metadata from one of the bootstrap servers; each address
        is tried `bootstrap_retries` times with backoff before giving up."""
        reasons: dict[str, str] = {}
        for attempt in range(self.bootstrap_retries):
            for host, port in self.bootstrap_servers:
                conn = self._bootstrap_conns.get((host, port))
                try:
                    if conn is None or not conn.connected:
                        conn = await self._open(host, port, -1)
                        self._bootstrap_conns[(host, port)] = conn
                    response = await conn.send(MetadataRequest(topics=sorted(self._topics)))
                except (ConnectionFailedError, RequestTimedOutError) as exc:
                    reasons[f"{host}:{port}"] = short_reason(exc)
                    self._bootstrap_conns.pop((host, port), None)
                    continue
                assert isinstance(response, MetadataResponse)
                self._apply(response, conn)
                self._adopt_bootstrap_connections()
                self._bootstrapped = True
                return
            if attempt + 1 < self.bootstrap_retries:
                await asyncio.sleep(self.retry_backoff_ms * (2**attempt) / 1000)
        raise NoBrokersAvailableError([f"{h}:{p}" for h, p in self.bootstrap_servers], reasons)

    def _adopt_bootstrap_connections(self) -> None:
        # A bootstrap address that is a known broker becomes that broker's connection.
        by_address = {(b.host, b.port): b.node_id for b in self.metadata.brokers.values()}
        for address, conn in list(self._bootstrap_conns.items()):
            node_id = by_address.get(address)
            if node_id is not None and node_id not in self._conns and conn.connected:
                conn.node_id = node_id
                self._conns[node_id] = conn
                del self._bootstrap_conns[address]

    async def close(self) -> None:
        """Close every connection and background refresh."""
        self._closed = True
        await cancel_and_wait([self._refresh_task])
        conns = [
            *self._conns.values(),
            *self._bootstrap_conns.values(),
            *self._coordinator_conns.values(),
        ]
        self._conns.clear()
        self._coordinator_conns.clear()
        self._bootstrap_conns.clear()
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)

    # ------------------------------------------------------------ topics and leaders

    def add_topics(self, topics: Iterable[str]) -> bool:
        """Track topics for refreshes; True when any was new."""
        new = set(topics) - self._topics
        self._topics |= new
        return bool(new)

    @property
    def tracked_topics(self) -> set[str]:
        """The topics whose metadata this client refreshes."""
        return set(self._topics)

    def leader_for(self, tp: TopicPartition) -> tuple[int, int]:
        """(leader node id, leader epoch) from the cache. Raises
        UnknownTopicOrPartitionError / LeaderNotAvailableError, or LeaderEpochBehindError
        while the entry is older than an awaited epoch (all retriable after a refresh)."""
        meta = self.metadata.partition(tp)
        if meta is None:
            raise UnknownTopicOrPartitionError(
                "not in this client's metadata", topic=tp.topic, partition=tp.partition
            )
        awaited = self.metadata.awaited_epoch(tp)
        if meta.leader_epoch < awaited:
            raise LeaderEpochBehindError(
                f"the metadata has leader {meta.leader} at leader epoch {meta.leader_epoch}, "
                f"older than leader epoch {awaited} of a position to validate; waiting for "
                "a metadata refresh to reach it",
                topic=tp.topic,
                partition=tp.partition,
            )
        if meta.leader < 0:
            raise LeaderNotAvailableError(
                f"no leader (leader epoch {meta.leader_epoch})",
                topic=tp.topic,
                partition=tp.partition,
            )
        return meta.leader, meta.leader_epoch

    async def wait_for_topics(self, topics: Iterable[str], *, timeout_ms: int) -> None:
        """Refresh until every topic is in the cache, bounded by `timeout_ms`."""
        wanted = set(topics)
        self.add_topics(wanted)
        deadline = time.monotonic() + timeout_ms / 1000
        backoff = self.retry_backoff_ms / 1000
        while True:
            missing = {t for t in wanted if self.metadata.partitions_for_topic(t) is None}
            if not missing:
                return
            update = await self.refresh_metadata(missing)
            missing = {t for t in wanted if self.metadata.partitions_for_topic(t) is None}
            if not missing:
                return
            for topic in sorted(missing):
                code = update.topic_errors.get(topic)
                if code == ErrorCode.TOPIC_AUTHORIZATION_FAILED:
                    # Final, as in Kafka's clients: waiting would not grant the ACL.
                    raise error_for(
                        code,
                        f"topic {topic}: this principal may not describe it (an ACL "
                        "is missing: minibroker acl add)",
                    )
            if time.monotonic() + backoff > deadline:
                names = ", ".join(sorted(missing))
                errors = {update.topic_errors.get(t) for t in missing} - {None}
                if errors <= {ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}:
                    raise UnknownTopicOrPartitionError(
                        f"topic {names} does not exist (waited {timeout_ms} ms); "
                        f"create it with `minibroker topic create {sorted(missing)[0]}`"
                    )
                raise KafkaTimeoutError(f"topic {names} not available after {timeout_ms} ms")
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)

    # ------------------------------------------------------------ metadata

    async def refresh_metadata(
        self, topics: Iterable[str] | None = None, *, all_topics: bool = False
    ) -> MetadataUpdate:
        """Fetch metadata for `topics` (added to the tracked topics; default: the
        tracked topics; `all_topics`: every topic) from the least loaded broker and
        apply it (KIP-232 rule)."""
        return (await self.fetch_metadata(topics, all_topics=all_topics))[1]

    async def fetch_metadata(
        self, topics: Iterable[str] | None = None, *, all_topics: bool = False
    ) -> tuple[MetadataResponse, MetadataUpdate]:
        """Like refresh_metadata, also returning the raw response (what that one
        broker said, which may be older than the cache)."""
        if topics is not None:
            self.add_topics(topics)
        async with self._refresh_lock:
            request = MetadataRequest(topics=None if all_topics else sorted(self._topics))
            response, conn = await self._send_any_with_conn(request, avoid_node=self._stale_node)
            assert isinstance(response, MetadataResponse)
            return response, self._apply(response, conn)

    def request_refresh(self) -> None:
        """Refresh soon in the background (coalesced): after a retriable error that
        says our metadata is out of date."""
        if self._closed or (self._refresh_task is not None and not self._refresh_task.done()):
            return
        self._refresh_task = asyncio.get_running_loop().create_task(
            self._background_refresh(0.0, self._stale_node), name="minibroker-metadata-refresh"
        )

    def _apply(self, response: MetadataResponse, conn: BrokerConnection) -> MetadataUpdate:
        update = self.metadata.update(response)
        if update.stale:
            self._stale_node = conn.node_id
            self._stale_refreshes += 1
            log.info(
                "ignored stale metadata from %s for %s (older leader epochs than cached, "
                "KIP-232); refreshing again (%d/%d)",
                conn.describe(),
                ", ".join(str(tp) for tp in update.stale[:5]),
                self._stale_refreshes,
                self.max_stale_refreshes,
            )
            if self._stale_refreshes <= self.max_stale_refreshes and not self._closed:
                self._schedule_stale_refresh(conn.node_id)
        else:
            self._stale_refreshes = 0
            self._stale_node = -1
        return update

    def _schedule_stale_refresh(self, avoid_node: int) -> None:
        if self._refresh_task is not None and not self._refresh_task.done():
            return
        delay = self.retry_backoff_ms * min(2 ** (self._stale_refreshes - 1), 10) / 1000
        self._refresh_task = asyncio.get_running_loop().create_task(
            self._background_refresh(delay, avoid_node), name="minibroker-metadata-refresh"
        )

    async def _background_refresh(self, delay: float, avoid_node: int = -1) -> None:
        await asyncio.sleep(delay)
        try:
            async with self._refresh_lock:
                request = MetadataRequest(topics=sorted(self._topics))
                response, conn = await self._send_any_with_conn(request, avoid_node=avoid_node)
                assert isinstance(response, MetadataResponse)
                self._refresh_task = None  # the stale rule may schedule the next one
                self._apply(response, conn)
        except MinibrokerError as exc:
            log.debug("background metadata refresh failed: %s", exc)

    # ------------------------------------------------------------ requests

    async def send(
        self,
        node_id: int,
        request: Message,
        *,
        timeout_ms: int | None = None,
        expect_response: bool = True,
        coordinator: bool = False,
    ) -> Message | None:
        """Send to one broker (with `coordinator`, on its group-coordinator connection).
        Connection failures raise ConnectionFailedError (and schedule a metadata
        refresh: the broker may be gone); no automatic retry."""
        conns = self._coordinator_conns if coordinator else self._conns
        conn = await self._connection(node_id, conns)
        try:
            return await conn.send(request, timeout_ms=timeout_ms, expect_response=expect_response)
        except (ConnectionFailedError, RequestTimedOutError):
            if not conn.connected:
                conns.pop(node_id, None)
                self.request_refresh()
            raise

    async def send_any(self, request: Message, *, timeout_ms: int | None = None) -> Message:
        """Send to the least loaded reachable broker, trying the others on failure."""
        response, _ = await self._send_any_with_conn(request, timeout_ms=timeout_ms)
        return response

    async def _send_any_with_conn(
        self, request: Message, *, timeout_ms: int | None = None, avoid_node: int = -2
    ) -> tuple[Message, BrokerConnection]:
        if self._closed:
            raise ConnectionFailedError("the client is closed")
        reasons: dict[str, str] = {}
        for target in self._candidates(avoid_node):
            try:
                if isinstance(target, int):
                    conn = await self._connection(target)
                else:
                    conn = self._bootstrap_conns.get(target)
                    if conn is None or not conn.connected:
                        conn = await self._open(target[0], target[1], -1)
                        self._bootstrap_conns[target] = conn
                response = await conn.send(request, timeout_ms=timeout_ms)
            except (ConnectionFailedError, RequestTimedOutError) as exc:
                name = f"node {target}" if isinstance(target, int) else f"{target[0]}:{target[1]}"
                reasons[name] = short_reason(exc)
                if isinstance(target, int):
                    self._conns.pop(target, None)
                else:
                    self._bootstrap_conns.pop(target, None)
                continue
            assert response is not None
            return response, conn
        addresses = [f"{b.host}:{b.port}" for b in self.metadata.brokers.values()]
        addresses += [f"{h}:{p}" for h, p in self.bootstrap_servers if f"{h}:{p}" not in addresses]
        raise NoBrokersAvailableError(addresses, reasons)

    def _candidates(self, avoid_node: int) -> list[int | tuple[str, int]]:
        connected = sorted(
            (c for n, c in self._conns.items() if c.connected and n != avoid_node),
            key=lambda c: c.in_flight,
        )
        order: list[int | tuple[str, int]] = [c.node_id for c in connected]
        others = [n for n in self.metadata.brokers if n not in order and n != avoid_node]
        random.shuffle(others)
        order += others
        if avoid_node in self.metadata.brokers:
            order.append(avoid_node)  # still better than nothing
        known = {(b.host, b.port) for b in self.metadata.brokers.values()}
        order += [a for a in self.bootstrap_servers if a not in known]
        return order

    async def _connection(
        self, node_id: int, conns: dict[int, BrokerConnection] | None = None
    ) -> BrokerConnection:
        conns = self._conns if conns is None else conns
        conn = conns.get(node_id)
        if conn is not None and conn.connected:
            return conn
        lock = self._connecting.setdefault((node_id, id(conns)), asyncio.Lock())
        async with lock:
            conn = conns.get(node_id)
            if conn is not None and conn.connected:
                return conn
            broker = self.metadata.broker(node_id)
            if broker is None:
                raise ConnectionFailedError(
                    f"broker {node_id} is not in the cluster metadata (fenced or gone)",
                    node_id=node_id,
                )
            try:
                conn = await self._open(broker.host, broker.port, node_id)
            except ConnectionFailedError:
                self.request_refresh()
                raise
            conns[node_id] = conn
            return conn

    async def _open(self, host: str, port: int, node_id: int) -> BrokerConnection:
        conn = BrokerConnection(
            host,
            port,
            node_id=node_id,
            client_id=self.client_id,
            request_timeout_ms=self.request_timeout_ms,
            connect_timeout_ms=self.connect_timeout_ms,
            max_in_flight=self.max_in_flight,
            tls=self.tls,
            sasl=self.sasl,
        )
        await conn.connect()
        return conn


__all__ = [
    "BrokerMetadata",
    "ClusterClient",
    "ClusterMetadata",
    "MetadataUpdate",
    "PartitionMetadata",
    "parse_bootstrap_servers",
]
