"""The admin client's diagnostics: `health` / `cluster_health` (the verdict of
client/health.py over a broker's view, or the active controller's when the addresses of
controllers are given, plus a probe of every live broker and of the controller quorum)
and `describe_replica_log` (one broker's replica of one partition via
DescribeReplicaLog, which brokers serve read-only)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from client.bootstrap_servers import parse_bootstrap_servers
from client.connection import BrokerConnection
from client.descriptions import ClusterDescription
from client.descriptions import EpochEntry
from client.descriptions import ReplicaBatch
from client.descriptions import ReplicaLogDescription
from client.descriptions import TopicDescription
from client.descriptions import _cluster_description
from client.descriptions import topics_from_metadata
from client.errors import BrokerResponseError
from client.errors import ConnectionFailedError
from client.errors import InvalidRequestError
from client.errors import MinibrokerError
from client.errors import RequestTimedOutError
from client.errors import error_for
from client.errors import short_reason
from client.health import SOURCE_BROKER
from client.health import SOURCE_CONTROLLER
from client.health import ClusterHealth
from client.health import OfflineLogDirHealth
from client.health import StrayReplicaHealth
from client.health import evaluate_health
from client.quorum_admin import ControllerSecurity
from client.quorum_admin import QuorumCheck
from client.quorum_admin import check_quorum
from protocol.errors import ErrorCode
from protocol.messages import DescribeClusterRequest
from protocol.messages import DescribeClusterResponse
from protocol.messages import DescribeLogDirsRequest
from protocol.messages import DescribeLogDirsResponse
from protocol.messages import DescribeReplicaLogRequest
from protocol.messages import DescribeReplicaLogResponse
from protocol.messages import Message
from protocol.messages import MetadataRequest
from protocol.messages import MetadataResponse

DEFAULT_CONTROLLER_PORT = 9093


# What a broker lists at most per DescribeReplicaLog (the broker caps it too).
DEFAULT_MAX_BATCHES = 100_000


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
    return parse_bootstrap_servers(stripped, what="address")[0]


def parse_addresses(text: str, default_port: int | None = None) -> list[tuple[str, int]]:
    """HOST:PORT[,HOST:PORT...] (each as parse_address reads it), at least one."""
    addresses = [parse_address(part, default_port) for part in text.split(",") if part.strip()]
    if not addresses:
        raise ValueError(f"expected HOST:PORT[,HOST:PORT...], got {text!r}")
    return addresses


def _reached(
    quorum: QuorumCheck, view: tuple[ClusterDescription, list[TopicDescription]] | None
) -> bool:
    """A controller answered: the active one with its metadata, or (with none active:
    no_active_controller says so) any voter."""
    if quorum.quorum is None:
        return False
    return view is not None or quorum.leader_address is None


class Diagnostics:
    """The admin client's diagnostics: `health` / `cluster_health` (the verdict of"""

    async def cluster_health(
        self,
        *,
        controller: str | Sequence[tuple[str, int]] | None = None,
        probe_brokers: bool = True,
        probe_timeout_ms: int = 3_000,
    ) -> ClusterHealth:
        """The cluster's health (client/health.py), never raising for an unreachable
        cluster: that is a verdict (no_broker_reachable, controller_unreachable,
        no_active_controller, controller_voters_down).

        Asks a bootstrap broker (DescribeCluster, Metadata for all topics). With
        `controller` (HOST:PORT[,HOST:PORT...], any voters of the controller quorum;
        port 9093 if left out) also the quorum: every voter is asked DescribeQuorum
        within `probe_timeout_ms` and the active controller for every voter's progress
        (client/quorum_admin.py), then the active controller for its metadata, which is
        then the one evaluated (a broker's image may lag it). With `probe_brokers`,
        every broker the metadata says is live must answer DescribeLogDirs within
        `probe_timeout_ms` (a killed broker stays unfenced until the controller's
        session timeout); the answers also list the stray replicas each broker set
        aside. Works on an admin that is not started: it tries to bootstrap first.
        Raises ValueError for a malformed `controller`."""
        controllers: list[tuple[str, int]] = []
        if isinstance(controller, str):
            controllers = parse_addresses(controller, DEFAULT_CONTROLLER_PORT)
        elif controller is not None:
            controllers = list(controller)
            if not controllers:
                raise ValueError("controller: give at least one HOST:PORT (or None)")
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
            errors.append(f"brokers: {short_reason(exc)}")

        controller_view: tuple[ClusterDescription, list[TopicDescription]] | None = None
        controller_address: str | None = None
        quorum: QuorumCheck | None = None
        if controller is not None:
            # The controllers are reached with this admin's own security settings.
            security = ControllerSecurity(self._cluster.tls, self._cluster.sasl)
            quorum = await check_quorum(controllers, probe_timeout_ms / 1000, security)
            errors.extend(quorum.errors)
            controller_address = ",".join(f"{h}:{p}" for h, p in controllers)
            if quorum.leader_address is not None:
                controller_address = "{}:{}".format(*quorum.leader_address)
                controller_view = await self._controller_view(
                    quorum.leader_address, controller_address, errors
                )
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
            controller_reachable=None if quorum is None else _reached(quorum, controller_view),
            unreachable_brokers=unreachable,
            errors=errors,
            stray_replicas=strays,
            offline_log_dirs=offline_dirs,
            quorum=quorum.quorum if quorum is not None else None,
        )

    async def _controller_view(
        self, address: tuple[str, int], where: str, errors: list[str]
    ) -> tuple[ClusterDescription, list[TopicDescription]] | None:
        """The active controller's metadata (None, with the error noted, when it does
        not answer)."""
        try:
            dc, md = await self._ask_directly(
                *address,
                [DescribeClusterRequest(), MetadataRequest(topics=None)],
                timeout_ms=min(self._request_timeout_ms, 10_000),
            )
        except MinibrokerError as exc:
            errors.append(f"controller {where}: {short_reason(exc)}")
            return None
        assert isinstance(dc, DescribeClusterResponse)
        assert isinstance(md, MetadataResponse)
        return _cluster_description(dc), topics_from_metadata(md)

    health = cluster_health  # the short name, as the CLI calls it

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
        metadata cache does not list), closed afterwards, secured as the client's
        (its TLS context and SASL user: the command line has one set for both)."""
        conn = BrokerConnection(
            host,
            port,
            node_id=node_id,
            client_id=self._cluster.client_id,
            request_timeout_ms=timeout_ms,
            connect_timeout_ms=timeout_ms,
            tls=self._cluster.tls,
            sasl=self._cluster.sasl,
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
                host,
                port,
                [DescribeLogDirsRequest()],
                timeout_ms=timeout_ms,
                node_id=node_id,
            )
        except (ConnectionFailedError, RequestTimedOutError) as exc:
            return short_reason(exc), [], []
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
