"""The controller's request handlers: one method per API, plus the session-expiry
fencing the liveness loop drives.

A handler that changes metadata hands a `build` function to the single writer
(metadata_writer.py): it decides from the image under the writer's lock, returns
the records and the answer, and the answer goes out only after the records are
durable and applied. Handlers that only read answer from the image directly.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from controller.config import ControllerConfig
from controller.election import elect_if_leaderless, remove_broker
from controller.faults import NO_FAULTS, Faults, TestFaults
from controller.liveness import BrokerSessions
from controller.meta_properties import new_uuid_string
from controller.metadata_writer import MetadataWriter
from controller.replica_placement import PlacementError, assign_replicas
from controller.state import MetadataImage
from controller.topic_validation import (
    InvalidTopicConfig,
    InvalidTopicName,
    unclean_election_enabled,
    validate_topic_configs,
    validate_topic_name,
)
from protocol.api import ELECTION_UNCLEAN, ApiKey
from protocol.errors import ErrorCode
from protocol.messages import (
    API_SPECS,
    AllocateProducerIdsRequest,
    AllocateProducerIdsResponse,
    AlterPartitionPartition,
    AlterPartitionPartitionResult,
    AlterPartitionRequest,
    AlterPartitionResponse,
    AlterPartitionTopicResult,
    ApiVersionRange,
    ApiVersionsRequest,
    ApiVersionsResponse,
    BrokerHeartbeatRequest,
    BrokerHeartbeatResponse,
    BrokerRegistrationRequest,
    BrokerRegistrationResponse,
    CreatableTopic,
    CreatableTopicResult,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeletableTopicResult,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeClusterBroker,
    DescribeClusterRequest,
    DescribeClusterResponse,
    ElectLeadersRequest,
    ElectLeadersResponse,
    ElectLeadersResult,
    FaultControlRequest,
    FaultControlResponse,
    FetchMetadataRequest,
    FetchMetadataResponse,
    Message,
    MetadataBroker,
    MetadataEntry,
    MetadataPartition,
    MetadataRequest,
    MetadataResponse,
    MetadataTopic,
)
from protocol.metadata_records import (
    LEADER_RECOVERED,
    LEADER_RECOVERING,
    NO_LEADER,
    FenceBrokerRecord,
    ListenerInfo,
    MetadataRecord,
    PartitionRecord,
    ProducerIdsRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnfenceBrokerRecord,
)

log = logging.getLogger(__name__)

Handler = Callable[[Any], Awaitable[Message]]

# The APIs a controller serves (plus FaultControl with --enable-test-faults); everything
# else is answered INVALID_REQUEST by the connection layer ("unknown or unserved API key").
CONTROLLER_APIS = (
    ApiKey.API_VERSIONS,
    ApiKey.METADATA,
    ApiKey.CREATE_TOPICS,
    ApiKey.DELETE_TOPICS,
    ApiKey.ALTER_PARTITION,
    ApiKey.DESCRIBE_CLUSTER,
    ApiKey.BROKER_REGISTRATION,
    ApiKey.BROKER_HEARTBEAT,
    ApiKey.FETCH_METADATA,
    ApiKey.ALLOCATE_PRODUCER_IDS,
    ApiKey.ELECT_LEADERS,
)

# Producer ids handed to a broker per AllocateProducerIds (Kafka's block size).
PRODUCER_ID_BLOCK_SIZE = 1000
# Brokers of another cluster retry their registration every heartbeat: the refusal is
# logged once per foreign cluster id, then at most this often; at most this many
# foreign clusters are tracked.
FOREIGN_CLUSTER_LOG_INTERVAL_S = 300.0
MAX_FOREIGN_CLUSTERS = 16


def registers_without_data(request: BrokerRegistrationRequest) -> bool:
    """The registering broker's data directory holds no data of this cluster: it names
    no cluster id because its meta.properties was absent (a first start, or a data
    directory lost, replaced or wiped). A broker writes the cluster id there right after
    its first accepted registration, before it creates any replica, and every later
    registration of the same process names it (broker/server.py,
    broker/controller_channel.py); so a broker this controller already knows that
    registers without one has lost every replica it had."""
    return not request.cluster_id


def _tp(image: MetadataImage, record: PartitionRecord) -> str:
    topic = image.topics.get(record.topic_id)
    return f"{topic.name if topic else record.topic_id}-{record.partition_id}"


class ControllerHandlers:
    def __init__(
        self,
        config: ControllerConfig,
        writer: MetadataWriter,
        sessions: BrokerSessions,
        cluster_id: str,
        *,
        new_cluster: bool = False,
        rng: random.Random | None = None,
        faults: Faults | None = None,
    ) -> None:
        """`new_cluster`: this start formatted `cluster_id` on an empty data dir."""
        self.config = config
        if faults is None:
            faults = (
                TestFaults(node_id=config.node_id, protections_off=config.protections_off)
                if config.enable_test_faults
                else NO_FAULTS
            )
        self.faults = faults
        self.writer = writer
        self.sessions = sessions
        self.cluster_id = cluster_id
        self.new_cluster = new_cluster
        # Foreign cluster id -> (broker ids seen, refusals, when last logged).
        self._foreign_clusters: dict[str, tuple[set[int], int, float]] = {}
        self.rng = rng or random.Random()
        # (broker id, broker epoch) of brokers in controlled shutdown: never unfenced
        # again in that epoch. One entry per broker at most (dropped on re-registration).
        self.shutting_down: set[tuple[int, int]] = set()
        # broker id -> broker epoch of a known broker's registration with an empty data
        # directory (its disk was lost): an unclean election takes its replicas last.
        # One entry per broker at most (dropped at its next registration); not kept
        # across controller restarts.
        self.lost_data_at_registration: dict[int, int] = {}
        self.unclean_elections = 0
        self.handlers: dict[int, Handler] = {
            ApiKey.API_VERSIONS: self.api_versions,
            ApiKey.METADATA: self.metadata,
            ApiKey.CREATE_TOPICS: self.create_topics,
            ApiKey.DELETE_TOPICS: self.delete_topics,
            ApiKey.ALTER_PARTITION: self.alter_partition,
            ApiKey.DESCRIBE_CLUSTER: self.describe_cluster,
            ApiKey.BROKER_REGISTRATION: self.broker_registration,
            ApiKey.BROKER_HEARTBEAT: self.broker_heartbeat,
            ApiKey.FETCH_METADATA: self.fetch_metadata,
            ApiKey.ALLOCATE_PRODUCER_IDS: self.allocate_producer_ids,
            ApiKey.ELECT_LEADERS: self.elect_leaders,
        }
        if self.faults.enabled:
            self.handlers[ApiKey.FAULT_CONTROL] = self.fault_control
        if config.enable_test_faults:
            log.warning(
                "TEST FAULTS ENABLED: never use this in production (controller %d)",
                config.node_id,
            )
        if config.unsafe_keep_restarted_replicas_in_isr:
            log.warning(
                "UNSAFE TEST SWITCH --unsafe-keep-restarted-replicas-in-isr is ON: a broker that "
                "registers again stays in the ISRs it was in (ZooKeeper-era behaviour, KIP-101 "
                "scenario 1); a restarted replica that lost data can be elected. Never run this "
                "in production."
            )
        if config.unsafe_ignore_broker_epochs:
            log.warning(
                "UNSAFE TEST FAULT ON: AlterPartition does NOT check ISR members' broker epochs "
                "(KIP-903 protection off); a rebooted replica with an empty disk can rejoin the "
                "ISR. Never run this in production."
            )

    @property
    def image(self) -> MetadataImage:
        return self.writer.image

    # ------------------------------------------------------------------ shared rules

    def _broker_gone_records(
        self,
        image: MetadataImage,
        gone: set[int],
        why: str,
        *,
        keep_in_isr: bool = False,
        data_lost: bool = False,
    ) -> list[MetadataRecord]:
        """Partition changes for brokers that go away (fenced, shutting down, replaced
        by a new incarnation): out of the ISRs (unless `keep_in_isr`, a test-only
        switch; with `data_lost`, out of every ISR, the last member included),
        leaderships moved (election.py)."""

        def usable(broker_id: int) -> bool:
            return broker_id not in gone and image.is_unfenced(broker_id)

        lost = self._lost_data(image)
        out: list[MetadataRecord] = []
        for topic, partition in image.partitions():
            if not gone.intersection(partition.replicas):
                continue
            unclean = unclean_election_enabled(topic.configs)
            current = partition
            for broker_id in sorted(gone):
                changed = remove_broker(
                    current,
                    broker_id,
                    usable,
                    unclean_allowed=unclean,
                    keep_in_isr=keep_in_isr,
                    data_lost=data_lost,
                    last_resort=lost,
                )
                if changed is not None:
                    current = changed
            if current is partition:
                continue
            # Several brokers at once: one record, epochs bumped once.
            leader_changed = current.leader != partition.leader
            record = PartitionRecord(
                topic_id=partition.topic_id,
                partition_id=partition.partition_id,
                replicas=list(partition.replicas),
                isr=list(current.isr),
                leader=current.leader,
                leader_epoch=partition.leader_epoch + (1 if leader_changed else 0),
                partition_epoch=partition.partition_epoch + 1,
                leader_recovery_state=current.leader_recovery_state,
            )
            self._log_partition_change(image, partition, record, why)
            out.append(record)
        return out

    def _log_partition_change(
        self, image: MetadataImage, old: PartitionRecord, new: PartitionRecord, why: str
    ) -> None:
        tp = _tp(image, new)
        if new.leader_recovery_state == LEADER_RECOVERING and (
            old.leader_recovery_state != LEADER_RECOVERING or old.leader != new.leader
        ):
            self.unclean_elections += 1
            log.warning(
                "UNCLEAN leader election for %s (%s): leader %d -> %d at leader epoch %d, ISR "
                "%s -> %s; records acknowledged by the old ISR may be lost (unclean elections "
                "so far: %d)",
                tp,
                why,
                old.leader,
                new.leader,
                new.leader_epoch,
                old.isr,
                new.isr,
                self.unclean_elections,
            )
        elif new.leader != old.leader:
            log.info(
                "%s (%s): leader %d -> %d, leader epoch %d -> %d, ISR %s -> %s, partition epoch %d",
                tp,
                why,
                old.leader,
                new.leader,
                old.leader_epoch,
                new.leader_epoch,
                old.isr,
                new.isr,
                new.partition_epoch,
            )
        else:
            log.info(
                "%s (%s): ISR %s -> %s, leader %d epoch %d, partition epoch %d",
                tp,
                why,
                old.isr,
                new.isr,
                new.leader,
                new.leader_epoch,
                new.partition_epoch,
            )

    def _unfence_records(self, image: MetadataImage, broker_id: int) -> list[MetadataRecord]:
        """Elect leaders for leaderless partitions now that `broker_id` is back."""

        def usable(b: int) -> bool:
            return b == broker_id or image.is_unfenced(b)

        out: list[MetadataRecord] = []
        for topic, partition in image.partitions():
            if partition.leader != NO_LEADER:
                continue
            changed, _unclean = elect_if_leaderless(
                partition,
                usable,
                unclean_allowed=unclean_election_enabled(topic.configs),
                last_resort=self._lost_data(image),
            )
            if changed is not None:
                self._log_partition_change(image, partition, changed, f"broker {broker_id} back")
                out.append(changed)
        return out

    def _lost_data(self, image: MetadataImage) -> set[int]:
        """Brokers whose current incarnation came back with an empty data directory."""
        return {
            broker_id
            for broker_id, epoch in self.lost_data_at_registration.items()
            if (broker := image.brokers.get(broker_id)) is not None and broker.broker_epoch == epoch
        }

    def _placeable_brokers(self, image: MetadataImage) -> list[int]:
        """Brokers that may get new replicas: unfenced, not shutting down, and heard
        from (registration or heartbeat) by this controller process within their
        session. An unfenced state replayed from the log after a restart is not
        enough: that broker may have died while the controller was down."""
        out = []
        for broker_id in image.unfenced_broker_ids():
            epoch = image.brokers[broker_id].broker_epoch
            if (broker_id, epoch) in self.shutting_down:
                continue
            if self.sessions.heard_from(broker_id, epoch):
                out.append(broker_id)
        return out

    # ------------------------------------------------------------------ ApiVersions

    async def api_versions(self, request: ApiVersionsRequest) -> ApiVersionsResponse:
        served = [*CONTROLLER_APIS, *([ApiKey.FAULT_CONTROL] if self.faults.enabled else [])]
        return ApiVersionsResponse(
            api_keys=[
                ApiVersionRange(
                    api_key=int(key),
                    min_version=API_SPECS[key].min_version,
                    max_version=API_SPECS[key].max_version,
                )
                for key in served
            ]
        )

    # ------------------------------------------------------------------ test faults

    async def fault_control(self, request: FaultControlRequest) -> FaultControlResponse:
        """Test only (served with --enable-test-faults): see controller/faults.py."""
        return self.faults.control(request)

    # ------------------------------------------------------------------ registration

    async def broker_registration(
        self, request: BrokerRegistrationRequest
    ) -> BrokerRegistrationResponse:
        def error(code: ErrorCode, message: str) -> tuple[list[MetadataRecord], Any]:
            log.warning("refused registration of broker %d: %s", request.broker_id, message)
            return [], BrokerRegistrationResponse(
                error_code=int(code), error_message=message, cluster_id=self.cluster_id
            )

        # Partitions whose last in-sync replica this registration concerns: left with an
        # empty ISR (the broker lost its data), or kept as the last member (it restarted
        # with its data after an unclean shutdown). Logged once the records are durable.
        stranded: list[str] = []
        last_member_unclean: list[str] = []

        def build(image: MetadataImage) -> tuple[list[MetadataRecord], Any]:
            if request.cluster_id and request.cluster_id != self.cluster_id:
                return [], self._refuse_foreign_cluster(request.broker_id, request.cluster_id)
            if request.broker_id < 0:
                return error(ErrorCode.INVALID_REQUEST, f"broker id {request.broker_id} < 0")
            if not request.incarnation_id:
                return error(ErrorCode.INVALID_REQUEST, "empty incarnation id")
            if not request.listeners:
                return error(ErrorCode.INVALID_REQUEST, "a broker needs at least one listener")
            for listener in request.listeners:
                if not listener.host or not 0 < listener.port <= 65535:
                    return error(
                        ErrorCode.INVALID_REQUEST,
                        f"listener {listener.name} {listener.host}:{listener.port} is not a "
                        "usable advertised address",
                    )
            existing = image.brokers.get(request.broker_id)
            if existing is not None and existing.incarnation_id == request.incarnation_id:
                # A retry of a registration that already succeeded: same epoch.
                return [], (existing.broker_epoch, existing.broker_epoch)
            records: list[MetadataRecord] = []
            if existing is not None:
                # The previous incarnation is gone: handle it like a fencing, so its
                # leaderships move (leader epochs bumped) and it leaves the ISRs; every
                # ISR, the last member included, when its data is gone.
                data_lost = registers_without_data(request)
                if not existing.fenced:
                    records.append(
                        FenceBrokerRecord(
                            broker_id=existing.broker_id, broker_epoch=existing.broker_epoch
                        )
                    )
                keep = self.config.unsafe_keep_restarted_replicas_in_isr
                if keep:
                    log.warning(
                        "UNSAFE TEST SWITCH: broker %d registers again and stays in its ISRs "
                        "(--unsafe-keep-restarted-replicas-in-isr)",
                        existing.broker_id,
                    )
                why = (
                    f"broker {existing.broker_id} epoch {existing.broker_epoch} replaced by a "
                    f"new incarnation{' with an EMPTY data directory' if data_lost else ''}"
                )
                changes = self._broker_gone_records(
                    image,
                    {existing.broker_id},
                    why,
                    keep_in_isr=keep,
                    data_lost=data_lost,
                )
                records.extend(changes)
                changed = {
                    (r.topic_id, r.partition_id): r
                    for r in changes
                    if isinstance(r, PartitionRecord)
                }
                stranded[:] = [_tp(image, r) for r in changed.values() if not r.isr]
                if not data_lost and not request.clean_shutdown:
                    last_member_unclean[:] = [
                        _tp(image, now)
                        for _, p in image.partitions()
                        if (now := changed.get((p.topic_id, p.partition_id), p)).isr
                        == [existing.broker_id]
                    ]
            epoch = image.next_offset + len(records)
            records.append(
                RegisterBrokerRecord(
                    broker_id=request.broker_id,
                    broker_epoch=epoch,
                    incarnation_id=request.incarnation_id,
                    listeners=[
                        ListenerInfo(name=li.name, host=li.host, port=li.port)
                        for li in request.listeners
                    ],
                    rack=request.rack,
                    fenced=True,
                )
            )
            previous = None if existing is None else existing.broker_epoch
            return records, (epoch, previous)

        result = await self.writer.commit(build)
        if isinstance(result, BrokerRegistrationResponse):
            return result
        epoch, previous = result
        self.sessions.touch(request.broker_id, epoch)
        if previous is not None and registers_without_data(request):
            self.lost_data_at_registration[request.broker_id] = epoch
        else:
            self.lost_data_at_registration.pop(request.broker_id, None)
        self.shutting_down = {k for k in self.shutting_down if k[0] != request.broker_id}
        listeners = ",".join(f"{li.name}://{li.host}:{li.port}" for li in request.listeners)
        if previous is None:
            log.info(
                "registered broker %d at epoch %d (incarnation %s, %s, clean shutdown %s)",
                request.broker_id,
                epoch,
                request.incarnation_id,
                listeners,
                request.clean_shutdown,
            )
        elif previous != epoch:
            log.info(
                "registered broker %d at epoch %d replacing epoch %d (incarnation %s, %s, "
                "clean shutdown %s%s)",
                request.broker_id,
                epoch,
                previous,
                request.incarnation_id,
                listeners,
                request.clean_shutdown,
                ", EMPTY data directory" if registers_without_data(request) else "",
            )
            self._warn_last_in_sync(request.broker_id, stranded, last_member_unclean)
        return BrokerRegistrationResponse(broker_epoch=epoch, cluster_id=self.cluster_id)

    def _warn_last_in_sync(
        self, broker_id: int, stranded: list[str], last_member_unclean: list[str]
    ) -> None:
        """What a re-registration did to partitions whose last in-sync replica it was,
        and what an operator can do."""
        if stranded:
            log.warning(
                "broker %d came back with an EMPTY data directory (its disk was lost, "
                "replaced or wiped) and was the last in-sync replica of %s: it left their "
                "ISRs, which are now empty, so they have no leader (it is never elected "
                "with an empty log). Their records are kept on their other replicas, none "
                "of which is known to hold every acknowledged record. Only an unclean "
                "election of one of them serves them again, accepting the loss of any "
                "acknowledged record it lacks: minibroker topic elect-leader TOPIC -p "
                "PARTITION --unclean [--replica ID] (compare the replicas first with "
                "minibroker debug replica-log); a topic with unclean.leader.election.enable "
                "gets one at once",
                broker_id,
                ", ".join(stranded),
            )
        if last_member_unclean:
            log.warning(
                "broker %d restarted after an unclean shutdown and is still the last "
                "in-sync replica of %s: it leads them again with what its log kept. A "
                "crashed process loses nothing written; if its host crashed, records it "
                "had not flushed (flush.messages, flush.ms) are lost on every replica",
                broker_id,
                ", ".join(last_member_unclean),
            )

    def _refuse_foreign_cluster(
        self, broker_id: int, cluster_id: str
    ) -> BrokerRegistrationResponse:
        """INCONSISTENT_CLUSTER_ID, and one clear log line per foreign cluster (then at
        most one per FOREIGN_CLUSTER_LOG_INTERVAL_S), not one per retry."""
        if self.new_cluster:
            message = (
                f"brokers of an existing cluster (id {cluster_id}) are knocking (broker "
                f"{broker_id}), but this controller formatted a NEW cluster id "
                f"{self.cluster_id} when it started on the empty data dir "
                f"{self.config.data_dir}, probably because its data directory was lost; "
                "they are refused, keep their data and apply nothing from this controller. "
                "To recover: stop this controller, restore its data directory from a backup "
                "and start it again (the brokers rejoin by themselves); do NOT empty the "
                "brokers' data directories, they hold the cluster's data"
            )
        else:
            message = (
                f"broker {broker_id} of another cluster (id {cluster_id}) tried to register; "
                f"this controller runs cluster {self.cluster_id} (data dir "
                f"{self.config.data_dir}); refused: point that broker's --controller at its "
                "own cluster's controller"
            )
        now = time.monotonic()
        seen = self._foreign_clusters.get(cluster_id)
        if seen is None:
            while len(self._foreign_clusters) >= MAX_FOREIGN_CLUSTERS:
                del self._foreign_clusters[next(iter(self._foreign_clusters))]
            log.error("%s", message)
            self._foreign_clusters[cluster_id] = ({broker_id}, 1, now)
        else:
            brokers, refusals, logged_at = seen
            brokers.add(broker_id)
            if now - logged_at >= FOREIGN_CLUSTER_LOG_INTERVAL_S:
                log.error(
                    "still refusing brokers %s of cluster %s (%d registrations refused); %s",
                    sorted(brokers),
                    cluster_id,
                    refusals + 1,
                    message,
                )
                logged_at = now
            self._foreign_clusters[cluster_id] = (brokers, refusals + 1, logged_at)
        reply = (
            f"broker {broker_id} belongs to cluster {cluster_id}; this controller runs "
            f"cluster {self.cluster_id}"
        ) + (
            ", formatted anew when it started on an empty data dir (its data lost?)"
            if self.new_cluster
            else ""
        )
        return BrokerRegistrationResponse(
            error_code=int(ErrorCode.INCONSISTENT_CLUSTER_ID),
            error_message=reply,
            cluster_id=self.cluster_id,
        )

    # ------------------------------------------------------------------ heartbeat

    async def broker_heartbeat(self, request: BrokerHeartbeatRequest) -> BrokerHeartbeatResponse:
        broker_id = request.broker_id
        events: list[str] = []

        def build(image: MetadataImage) -> tuple[list[MetadataRecord], BrokerHeartbeatResponse]:
            broker = image.brokers.get(broker_id)
            if broker is None or broker.broker_epoch != request.broker_epoch:
                return [], BrokerHeartbeatResponse(
                    error_code=int(ErrorCode.STALE_BROKER_EPOCH), is_fenced=True
                )
            epoch = broker.broker_epoch
            self.sessions.touch(broker_id, epoch)
            caught_up = request.current_metadata_offset >= epoch
            records: list[MetadataRecord] = []
            if request.want_shut_down or (broker_id, epoch) in self.shutting_down:
                if not broker.fenced:
                    records.append(FenceBrokerRecord(broker_id=broker_id, broker_epoch=epoch))
                    records.extend(
                        self._broker_gone_records(
                            image, {broker_id}, f"controlled shutdown of broker {broker_id}"
                        )
                    )
                    events.append("shutdown")
                return records, BrokerHeartbeatResponse(
                    is_caught_up=caught_up, is_fenced=True, should_shut_down=True
                )
            if request.want_fence:
                if not broker.fenced:
                    why = (
                        f"log directory of broker {broker_id} offline"
                        if request.offline_log_dirs
                        else f"broker {broker_id} asked to be fenced"
                    )
                    records.append(FenceBrokerRecord(broker_id=broker_id, broker_epoch=epoch))
                    records.extend(self._broker_gone_records(image, {broker_id}, why))
                    events.append("fence")
                return records, BrokerHeartbeatResponse(is_caught_up=caught_up, is_fenced=True)
            if broker.fenced:
                if not caught_up:
                    return [], BrokerHeartbeatResponse(is_caught_up=False, is_fenced=True)
                records.append(UnfenceBrokerRecord(broker_id=broker_id, broker_epoch=epoch))
                records.extend(self._unfence_records(image, broker_id))
                events.append("unfence")
            return records, BrokerHeartbeatResponse(is_caught_up=caught_up, is_fenced=False)

        # Count the heartbeat as soon as it arrives, not when the writer lock is free:
        # a slow fsync or snapshot must not fence a broker that did beat in time.
        known = self.image.brokers.get(broker_id)
        if known is not None and known.broker_epoch == request.broker_epoch:
            self.sessions.touch(broker_id, known.broker_epoch)
        response = await self.writer.commit(build)
        if "shutdown" in events:
            self.shutting_down.add((broker_id, request.broker_epoch))
            log.info(
                "broker %d epoch %d: controlled shutdown, leaderships moved, broker fenced",
                broker_id,
                request.broker_epoch,
            )
        elif "fence" in events and request.offline_log_dirs:
            log.warning(
                "broker %d epoch %d fenced at its request, its leaderships moved: log "
                "director%s offline: %s; it stays fenced until it restarts",
                broker_id,
                request.broker_epoch,
                "y" if len(request.offline_log_dirs) == 1 else "ies",
                "; ".join(request.offline_log_dirs),
            )
        elif "fence" in events:
            log.info("broker %d epoch %d fenced at its request", broker_id, request.broker_epoch)
        elif "unfence" in events:
            log.info(
                "broker %d epoch %d unfenced (metadata offset %d)",
                broker_id,
                request.broker_epoch,
                request.current_metadata_offset,
            )
        return response

    async def allocate_producer_ids(
        self, request: AllocateProducerIdsRequest
    ) -> AllocateProducerIdsResponse:
        """KIP-730: the next block of producer ids, made durable before it is answered,
        so no id is handed out twice, even across a controller restart."""

        def build(
            image: MetadataImage,
        ) -> tuple[list[MetadataRecord], AllocateProducerIdsResponse]:
            broker = image.brokers.get(request.broker_id)
            if broker is None or broker.broker_epoch != request.broker_epoch:
                known = None if broker is None else broker.broker_epoch
                return [], AllocateProducerIdsResponse(
                    error_code=int(ErrorCode.STALE_BROKER_EPOCH),
                    error_message=f"broker {request.broker_id} epoch {request.broker_epoch} "
                    f"is not the registered epoch {known}",
                )
            start = image.next_producer_id
            record = ProducerIdsRecord(
                broker_id=request.broker_id,
                broker_epoch=request.broker_epoch,
                next_producer_id=start + PRODUCER_ID_BLOCK_SIZE,
            )
            return [record], AllocateProducerIdsResponse(
                producer_id_start=start, producer_id_len=PRODUCER_ID_BLOCK_SIZE
            )

        response = await self.writer.commit(build)
        if response.error_code == 0:
            log.info(
                "broker %d epoch %d: producer ids [%d, %d) allocated",
                request.broker_id,
                request.broker_epoch,
                response.producer_id_start,
                response.producer_id_start + response.producer_id_len,
            )
        return response

    async def fence_expired_brokers(self) -> list[int]:
        """Fence every unfenced broker whose session ran out (the liveness loop)."""
        fenced: list[tuple[int, int]] = []

        def build(image: MetadataImage) -> tuple[list[MetadataRecord], None]:
            candidates = [
                (b.broker_id, b.broker_epoch) for b in image.brokers.values() if not b.fenced
            ]
            expired = set(self.sessions.expired(candidates))
            if not expired:
                return [], None
            records: list[MetadataRecord] = []
            for broker_id in sorted(expired):
                epoch = image.brokers[broker_id].broker_epoch
                records.append(FenceBrokerRecord(broker_id=broker_id, broker_epoch=epoch))
                fenced.append((broker_id, epoch))
            records.extend(
                self._broker_gone_records(
                    image, expired, f"session of broker(s) {sorted(expired)} expired"
                )
            )
            return records, None

        await self.writer.commit(build)
        for broker_id, epoch in fenced:
            log.warning(
                "fenced broker %d epoch %d: no heartbeat for %d ms",
                broker_id,
                epoch,
                self.config.session_timeout_ms,
            )
        return [b for b, _ in fenced]

    # ------------------------------------------------------------------ ElectLeaders

    async def elect_leaders(self, request: ElectLeadersRequest) -> ElectLeadersResponse:
        """Kafka's ElectLeaders, unclean only, for leaderless partitions: a usable ISR
        member if there is one, else (the operator accepting the loss of what it lacks)
        the replica named, or the first usable one outside the ISR in replica order,
        replicas known to have lost their data last."""
        if request.election_type != ELECTION_UNCLEAN:
            return ElectLeadersResponse(
                error_code=int(ErrorCode.INVALID_REQUEST),
                error_message=f"election type {request.election_type} is not served: only "
                f"unclean elections ({ELECTION_UNCLEAN}); a leaderless partition gets its "
                "in-sync replica back as leader by itself",
            )
        if not request.partitions:
            return ElectLeadersResponse(
                error_code=int(ErrorCode.INVALID_REQUEST),
                error_message="name the partitions to elect a leader for",
            )

        def build(image: MetadataImage) -> tuple[list[MetadataRecord], ElectLeadersResponse]:
            lost = self._lost_data(image)
            records: list[MetadataRecord] = []
            results: list[ElectLeadersResult] = []
            seen: set[tuple[str, int]] = set()
            for item in request.partitions:
                tp = f"{item.topic}-{item.partition}"
                code, why, state = self._elect_one(image, item.topic, item.partition, item.replica)
                if (item.topic, item.partition) in seen:
                    code, why, state = ErrorCode.INVALID_REQUEST, f"{tp} is listed twice", None
                seen.add((item.topic, item.partition))
                if code == ErrorCode.NONE and state is not None:
                    changed, _unclean = elect_if_leaderless(
                        state,
                        self._electable(image, item.replica),
                        unclean_allowed=True,
                        last_resort=lost,
                    )
                    if changed is None:
                        code, why = (
                            ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE,
                            f"no replica of {tp} is up (replicas {state.replicas} are down or "
                            "fenced); start one of them",
                        )
                    else:
                        self._log_partition_change(
                            image, state, changed, "asked by an operator with ElectLeaders"
                        )
                        records.append(changed)
                        state = changed
                results.append(
                    ElectLeadersResult(
                        topic=item.topic,
                        partition=item.partition,
                        error_code=int(code),
                        error_message=why or None,
                        leader=-1 if state is None else state.leader,
                        leader_epoch=-1 if state is None else state.leader_epoch,
                    )
                )
            return records, ElectLeadersResponse(results=results)

        return await self.writer.commit(build)

    def _elect_one(
        self, image: MetadataImage, topic_name: str, partition_id: int, replica: int
    ) -> tuple[ErrorCode, str, PartitionRecord | None]:
        """Whether a partition may get a leader by ElectLeaders: (error, why, state)."""
        tp = f"{topic_name}-{partition_id}"
        topic = image.topic_by_name(topic_name)
        state = None if topic is None else topic.partitions.get(partition_id)
        if state is None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{tp} does not exist", None
        if state.leader != NO_LEADER:
            return (
                ErrorCode.ELECTION_NOT_NEEDED,
                f"{tp} has a leader: broker {state.leader} at leader epoch {state.leader_epoch}",
                state,
            )
        if replica >= 0 and replica not in state.replicas:
            return (
                ErrorCode.INVALID_REQUEST,
                f"broker {replica} holds no replica of {tp} (replicas {state.replicas})",
                None,
            )
        if replica >= 0 and not image.is_unfenced(replica):
            return (
                ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE,
                f"broker {replica} is down or fenced; start it, or name another replica of "
                f"{tp} ({state.replicas})",
                None,
            )
        return ErrorCode.NONE, "", state

    @staticmethod
    def _electable(image: MetadataImage, replica: int) -> Callable[[int], bool]:
        if replica >= 0:
            return lambda b: b == replica
        return image.is_unfenced

    # ------------------------------------------------------------------ FetchMetadata

    async def fetch_metadata(self, request: FetchMetadataRequest) -> FetchMetadataResponse:
        """Metadata only for a registered broker at its current broker epoch: an
        unregistered one (e.g. a broker of another cluster, or one this controller lost
        with its data) must not act on this controller's image."""
        broker = self.image.brokers.get(request.broker_id)
        if broker is None or broker.broker_epoch != request.broker_epoch:
            known = "not registered" if broker is None else f"registered at {broker.broker_epoch}"
            return FetchMetadataResponse(
                error_code=int(ErrorCode.STALE_BROKER_EPOCH),
                error_message=f"broker {request.broker_id} epoch {request.broker_epoch} is "
                f"{known} here (cluster {self.cluster_id}); register first",
                cluster_id=self.cluster_id,
            )
        from_offset = max(0, request.from_offset)
        max_records = max(1, min(request.max_records, self.config.max_metadata_records))
        entries = self.writer.entries_from(from_offset, max_records)
        if entries is not None and not entries and request.max_wait_ms > 0:
            wait_ms = min(request.max_wait_ms, self.config.max_metadata_wait_ms)
            await self.writer.wait_for_append(from_offset, wait_ms / 1000.0)
            entries = self.writer.entries_from(from_offset, max_records)
        image = self.image
        if entries is None:
            return self._snapshot_response(from_offset)
        return FetchMetadataResponse(
            cluster_id=self.cluster_id,
            entries=entries,
            next_offset=from_offset + len(entries),
            high_watermark=image.next_offset,
        )

    def _snapshot_response(self, from_offset: int) -> FetchMetadataResponse:
        image = self.image
        log.info(
            "FetchMetadata from offset %d: older than the retained log (from %d) or past its "
            "end (%d); sending a snapshot",
            from_offset,
            self.writer.oldest_retained_offset,
            image.next_offset,
        )
        # Every snapshot entry carries the offset the image is as of.
        return FetchMetadataResponse(
            cluster_id=self.cluster_id,
            is_snapshot=True,
            entries=[
                MetadataEntry(offset=image.last_offset, record=r) for r in image.snapshot_records()
            ],
            next_offset=image.next_offset,
            high_watermark=image.next_offset,
        )

    # ------------------------------------------------------------------ topics

    def _create_one(
        self, image: MetadataImage, topic: CreatableTopic
    ) -> tuple[CreatableTopicResult, list[MetadataRecord]]:
        def error(code: ErrorCode, message: str) -> tuple[CreatableTopicResult, list[Any]]:
            log.info("refused to create topic %r: %s", topic.name, message)
            return (
                CreatableTopicResult(name=topic.name, error_code=int(code), error_message=message),
                [],
            )

        try:
            validate_topic_name(topic.name)
        except InvalidTopicName as exc:
            return error(ErrorCode.INVALID_TOPIC_EXCEPTION, str(exc))
        if topic.name in image.topic_ids:
            return error(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {topic.name!r} already exists")
        unfenced = self._placeable_brokers(image)
        if topic.assignments:
            if topic.num_partitions != -1 or topic.replication_factor != -1:
                return error(
                    ErrorCode.INVALID_REQUEST,
                    "give either assignments or num_partitions/replication_factor, not both",
                )
            indexes = sorted(a.partition_index for a in topic.assignments)
            if indexes != list(range(len(indexes))):
                return error(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"assignment partitions {indexes} are not 0..{len(indexes) - 1}",
                )
            if len(indexes) > self.config.max_partitions_per_topic:
                return error(
                    ErrorCode.INVALID_PARTITIONS,
                    f"{len(indexes)} partitions exceed the limit of "
                    f"{self.config.max_partitions_per_topic}",
                )
            sizes = {len(a.broker_ids) for a in topic.assignments}
            if len(sizes) != 1 or 0 in sizes:
                return error(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    "every partition needs the same, non-zero number of replicas",
                )
            placement: list[list[int]] = []
            for assignment in sorted(topic.assignments, key=lambda a: a.partition_index):
                replicas = list(assignment.broker_ids)
                if len(set(replicas)) != len(replicas):
                    return error(
                        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                        f"partition {assignment.partition_index} lists a broker twice: {replicas}",
                    )
                unknown = [b for b in replicas if b not in image.brokers]
                if unknown:
                    return error(
                        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                        f"partition {assignment.partition_index} names unregistered brokers "
                        f"{unknown}",
                    )
                if not any(b in unfenced for b in replicas):
                    return error(
                        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                        f"every broker of partition {assignment.partition_index} ({replicas}) "
                        "is fenced",
                    )
                placement.append(replicas)
            num_partitions, replication_factor = len(placement), len(placement[0])
        else:
            num_partitions = (
                self.config.default_partitions
                if topic.num_partitions == -1
                else topic.num_partitions
            )
            replication_factor = (
                self.config.default_replication_factor
                if topic.replication_factor == -1
                else topic.replication_factor
            )
            if num_partitions < 1:
                return error(
                    ErrorCode.INVALID_PARTITIONS,
                    f"number of partitions must be >= 1, not {num_partitions}",
                )
            if num_partitions > self.config.max_partitions_per_topic:
                return error(
                    ErrorCode.INVALID_PARTITIONS,
                    f"{num_partitions} partitions exceed the limit of "
                    f"{self.config.max_partitions_per_topic}",
                )
            if replication_factor < 1:
                return error(
                    ErrorCode.INVALID_REPLICATION_FACTOR,
                    f"replication factor must be >= 1, not {replication_factor}",
                )
            try:
                placement = assign_replicas(
                    num_partitions, replication_factor, unfenced, rng=self.rng
                )
            except PlacementError as exc:
                silent = sorted(set(image.unfenced_broker_ids()) - set(unfenced))
                hint = (
                    f"; brokers {silent} are registered but have not heartbeated to this "
                    "controller since it started: retry in a moment if they are alive"
                    if silent
                    else ""
                )
                return error(ErrorCode.INVALID_REPLICATION_FACTOR, f"{exc}{hint}")
        try:
            configs = validate_topic_configs(
                topic.configs,
                default_min_insync_replicas=self.config.default_min_insync_replicas,
                default_unclean_leader_election=self.config.default_unclean_leader_election,
            )
        except InvalidTopicConfig as exc:
            return error(ErrorCode.INVALID_CONFIG, str(exc))

        topic_id = new_uuid_string()
        while topic_id in image.topics:
            topic_id = new_uuid_string()
        records: list[MetadataRecord] = [
            TopicRecord(name=topic.name, topic_id=topic_id, configs=configs)
        ]
        for partition_id, replicas in enumerate(placement):
            isr = [b for b in replicas if b in unfenced]
            records.append(
                PartitionRecord(
                    topic_id=topic_id,
                    partition_id=partition_id,
                    replicas=replicas,
                    isr=isr,
                    leader=isr[0],
                    leader_epoch=0,
                    partition_epoch=0,
                )
            )
        result = CreatableTopicResult(
            name=topic.name,
            topic_id=topic_id,
            num_partitions=num_partitions,
            replication_factor=replication_factor,
        )
        return result, records

    async def _await_silent_brokers(self, request: CreateTopicsRequest) -> None:
        """Right after a restart the controller has not yet heard from live brokers
        (their next heartbeat is a moment away): when that leaves fewer placeable
        brokers than a topic's replication factor, wait until every silent broker
        heartbeated or its session ran out (fenced), at most one session timeout."""
        needed = max(
            (
                self.config.default_replication_factor
                if t.replication_factor == -1
                else t.replication_factor
                for t in request.topics
                if not t.assignments
            ),
            default=0,
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.session_timeout_s
        while loop.time() < deadline:
            placeable = self._placeable_brokers(self.image)
            if len(placeable) >= needed or len(self.image.unfenced_broker_ids()) == len(placeable):
                return
            await asyncio.sleep(0.05)

    async def create_topics(self, request: CreateTopicsRequest) -> CreateTopicsResponse:
        counts = Counter(t.name for t in request.topics)
        await self._await_silent_brokers(request)

        def build(image: MetadataImage) -> tuple[list[MetadataRecord], CreateTopicsResponse]:
            results: list[CreatableTopicResult] = []
            records: list[MetadataRecord] = []
            for topic in request.topics:
                if counts[topic.name] > 1:
                    results.append(
                        CreatableTopicResult(
                            name=topic.name,
                            error_code=int(ErrorCode.INVALID_REQUEST),
                            error_message=f"topic {topic.name!r} appears more than once",
                        )
                    )
                    continue
                result, topic_records = self._create_one(image, topic)
                results.append(result)
                if not request.validate_only:
                    records.extend(topic_records)
            return records, CreateTopicsResponse(topics=results)

        response = await self.writer.commit(build)
        if not request.validate_only:
            for result in response.topics:
                if result.error_code == 0:
                    topic = self.image.topic_by_name(result.name)
                    assignment = (
                        {p: part.replicas for p, part in sorted(topic.partitions.items())}
                        if topic
                        else {}
                    )
                    log.info(
                        "created topic %s (id %s): %d partitions, replication factor %d, "
                        "replicas %s, configs %s",
                        result.name,
                        result.topic_id,
                        result.num_partitions,
                        result.replication_factor,
                        assignment,
                        topic.configs if topic else {},
                    )
        return response

    async def delete_topics(self, request: DeleteTopicsRequest) -> DeleteTopicsResponse:
        counts = Counter(request.topic_names)

        def build(image: MetadataImage) -> tuple[list[MetadataRecord], DeleteTopicsResponse]:
            results: list[DeletableTopicResult] = []
            records: list[MetadataRecord] = []
            for name in request.topic_names:
                if counts[name] > 1:
                    results.append(
                        DeletableTopicResult(
                            name=name,
                            error_code=int(ErrorCode.INVALID_REQUEST),
                            error_message=f"topic {name!r} appears more than once",
                        )
                    )
                    continue
                topic = image.topic_by_name(name)
                if topic is None:
                    results.append(
                        DeletableTopicResult(
                            name=name,
                            error_code=int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
                            error_message=f"topic {name!r} does not exist",
                        )
                    )
                    continue
                records.append(RemoveTopicRecord(topic_id=topic.topic_id))
                results.append(DeletableTopicResult(name=name))
            return records, DeleteTopicsResponse(responses=results)

        response = await self.writer.commit(build)
        for result in response.responses:
            if result.error_code == 0:
                log.info("deleted topic %s", result.name)
        return response

    # ------------------------------------------------------------------ AlterPartition

    def _check_alter(
        self,
        image: MetadataImage,
        request: AlterPartitionRequest,
        topic_name: str,
        data: AlterPartitionPartition,
    ) -> tuple[ErrorCode, str, PartitionRecord | None]:
        """KIP-903's checks for one partition: (error, why, current state)."""
        topic = image.topic_by_name(topic_name)
        current = None if topic is None else topic.partitions.get(data.partition_index)
        if current is None:
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "unknown partition", None
        if data.leader_epoch > current.leader_epoch:
            return (
                ErrorCode.UNKNOWN_LEADER_EPOCH,
                f"leader epoch {data.leader_epoch} is newer than {current.leader_epoch}",
                current,
            )
        if data.leader_epoch < current.leader_epoch:
            return (
                ErrorCode.FENCED_LEADER_EPOCH,
                f"leader epoch {data.leader_epoch} is older than {current.leader_epoch}",
                current,
            )
        if request.broker_id != current.leader:
            return (
                ErrorCode.FENCED_LEADER_EPOCH,
                f"broker {request.broker_id} is not the leader (leader is {current.leader})",
                current,
            )
        if data.partition_epoch != current.partition_epoch:
            return (
                ErrorCode.INVALID_UPDATE_VERSION,
                f"partition epoch {data.partition_epoch} is not the current "
                f"{current.partition_epoch}",
                current,
            )
        new_isr = [s.broker_id for s in data.new_isr_with_epochs]
        if not new_isr or len(set(new_isr)) != len(new_isr):
            return (
                ErrorCode.INVALID_REQUEST,
                f"invalid ISR {new_isr} (empty or duplicates)",
                current,
            )
        if current.leader not in new_isr:
            return (
                ErrorCode.INVALID_REQUEST,
                f"the new ISR {new_isr} leaves out the leader {current.leader}",
                current,
            )
        if data.leader_recovery_state not in (LEADER_RECOVERED, LEADER_RECOVERING):
            return (
                ErrorCode.INVALID_REQUEST,
                f"unknown leader recovery state {data.leader_recovery_state}",
                current,
            )
        if data.leader_recovery_state == LEADER_RECOVERING and len(new_isr) > 1:
            return (
                ErrorCode.INVALID_REQUEST,
                "the ISR cannot grow while the leader is still recovering",
                current,
            )
        if (
            current.leader_recovery_state == LEADER_RECOVERED
            and data.leader_recovery_state == LEADER_RECOVERING
        ):
            return ErrorCode.INVALID_REQUEST, "RECOVERED cannot go back to RECOVERING", current
        for state in data.new_isr_with_epochs:
            reason = self._ineligible(image, current, state.broker_id, state.broker_epoch)
            if reason is not None:
                return ErrorCode.INELIGIBLE_REPLICA, reason, current
        return ErrorCode.NONE, "", current

    def _ineligible(
        self, image: MetadataImage, current: PartitionRecord, broker_id: int, broker_epoch: int
    ) -> str | None:
        if broker_id not in current.replicas:
            return f"broker {broker_id} is not a replica ({current.replicas})"
        broker = image.brokers.get(broker_id)
        if broker is None:
            return f"broker {broker_id} is not registered"
        if (broker_id, broker.broker_epoch) in self.shutting_down:
            return f"broker {broker_id} is shutting down"
        if broker.fenced:
            return f"broker {broker_id} is fenced"
        if broker_epoch != -1 and broker_epoch != broker.broker_epoch:
            if self.config.unsafe_ignore_broker_epochs:
                log.warning(
                    "UNSAFE TEST FAULT: accepting broker %d with stale broker epoch %d "
                    "(registered %d) into an ISR",
                    broker_id,
                    broker_epoch,
                    broker.broker_epoch,
                )
                return None
            return (
                f"broker {broker_id} has broker epoch {broker.broker_epoch}, the request "
                f"says {broker_epoch} (it restarted since; KIP-903)"
            )
        return None

    async def alter_partition(self, request: AlterPartitionRequest) -> AlterPartitionResponse:
        outcomes: list[tuple[str, int, ErrorCode, str, PartitionRecord | None]] = []

        def build(image: MetadataImage) -> tuple[list[MetadataRecord], AlterPartitionResponse]:
            requester = image.brokers.get(request.broker_id)
            if requester is None or requester.broker_epoch != request.broker_epoch:
                known = None if requester is None else requester.broker_epoch
                outcomes.append(
                    (
                        "*",
                        -1,
                        ErrorCode.STALE_BROKER_EPOCH,
                        f"broker {request.broker_id} epoch {request.broker_epoch} is not the "
                        f"registered epoch {known}",
                        None,
                    )
                )
                return [], AlterPartitionResponse(error_code=int(ErrorCode.STALE_BROKER_EPOCH))
            records: list[MetadataRecord] = []
            topics: list[AlterPartitionTopicResult] = []
            seen: set[tuple[str, int]] = set()
            for topic_data in request.topics:
                results: list[AlterPartitionPartitionResult] = []
                for data in topic_data.partitions:
                    key = (topic_data.topic_name, data.partition_index)
                    if key in seen:
                        code, why, current = (
                            ErrorCode.INVALID_REQUEST,
                            "partition listed twice in one request",
                            None,
                        )
                    else:
                        seen.add(key)
                        code, why, current = self._check_alter(
                            image, request, topic_data.topic_name, data
                        )
                    if code != ErrorCode.NONE or current is None:
                        outcomes.append(
                            (topic_data.topic_name, data.partition_index, code, why, current)
                        )
                        results.append(
                            AlterPartitionPartitionResult(
                                partition_index=data.partition_index, error_code=int(code)
                            )
                        )
                        continue
                    new_isr = [s.broker_id for s in data.new_isr_with_epochs]
                    state = current
                    if (
                        new_isr != current.isr
                        or data.leader_recovery_state != current.leader_recovery_state
                    ):
                        state = PartitionRecord(
                            topic_id=current.topic_id,
                            partition_id=current.partition_id,
                            replicas=list(current.replicas),
                            isr=new_isr,
                            leader=current.leader,
                            leader_epoch=current.leader_epoch,
                            partition_epoch=current.partition_epoch + 1,
                            leader_recovery_state=data.leader_recovery_state,
                        )
                        records.append(state)
                    outcomes.append(
                        (topic_data.topic_name, data.partition_index, code, why, current)
                    )
                    results.append(
                        AlterPartitionPartitionResult(
                            partition_index=data.partition_index,
                            leader_id=state.leader,
                            leader_epoch=state.leader_epoch,
                            isr=list(state.isr),
                            leader_recovery_state=state.leader_recovery_state,
                            partition_epoch=state.partition_epoch,
                        )
                    )
                topics.append(
                    AlterPartitionTopicResult(topic_name=topic_data.topic_name, partitions=results)
                )
            return records, AlterPartitionResponse(topics=topics)

        response = await self.writer.commit(build)
        for topic_name, partition, code, why, current in outcomes:
            if code == ErrorCode.NONE:
                new = self.image.topic_by_name(topic_name)
                state = new.partitions.get(partition) if new else None
                if state is not None and current is not None and state is not current:
                    log.info(
                        "AlterPartition from broker %d: %s-%d ISR %s -> %s, leader %d epoch %d, "
                        "partition epoch %d -> %d",
                        request.broker_id,
                        topic_name,
                        partition,
                        current.isr,
                        state.isr,
                        state.leader,
                        state.leader_epoch,
                        current.partition_epoch,
                        state.partition_epoch,
                    )
            else:
                log.info(
                    "AlterPartition from broker %d refused for %s-%d: %s (%s)",
                    request.broker_id,
                    topic_name,
                    partition,
                    code.name,
                    why,
                )
        return response

    # ------------------------------------------------------------------ read-only

    async def describe_cluster(self, request: DescribeClusterRequest) -> DescribeClusterResponse:
        image = self.image
        brokers = []
        for broker_id in sorted(image.brokers):
            broker = image.brokers[broker_id]
            if broker.fenced and not request.include_fenced_brokers:
                continue
            first = broker.listeners[0]
            brokers.append(
                DescribeClusterBroker(
                    broker_id=broker_id,
                    host=first.host,
                    port=first.port,
                    rack=broker.rack,
                    is_fenced=broker.fenced,
                    broker_epoch=broker.broker_epoch,
                )
            )
        return DescribeClusterResponse(
            cluster_id=self.cluster_id,
            controller_id=self.config.node_id,
            brokers=brokers,
            metadata_offset=image.last_offset,
        )

    async def metadata(self, request: MetadataRequest) -> MetadataResponse:
        image = self.image
        brokers = []
        for broker_id in image.unfenced_broker_ids():
            broker = image.brokers[broker_id]
            first = broker.listeners[0]
            brokers.append(
                MetadataBroker(
                    node_id=broker_id, host=first.host, port=first.port, rack=broker.rack
                )
            )
        names: Iterable[str] = sorted(image.topic_ids) if request.topics is None else request.topics
        topics = []
        for name in names:
            topic = image.topic_by_name(name)
            if topic is None:
                topics.append(
                    MetadataTopic(error_code=int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), name=name)
                )
                continue
            partitions = []
            for partition_id in sorted(topic.partitions):
                part = topic.partitions[partition_id]
                partitions.append(
                    MetadataPartition(
                        error_code=int(
                            ErrorCode.LEADER_NOT_AVAILABLE
                            if part.leader == NO_LEADER
                            else ErrorCode.NONE
                        ),
                        partition_index=partition_id,
                        leader_id=part.leader,
                        leader_epoch=part.leader_epoch,
                        replica_nodes=list(part.replicas),
                        isr_nodes=list(part.isr),
                        offline_replicas=[r for r in part.replicas if not image.is_unfenced(r)],
                    )
                )
            topics.append(MetadataTopic(name=name, topic_id=topic.topic_id, partitions=partitions))
        return MetadataResponse(
            brokers=brokers,
            cluster_id=self.cluster_id,
            controller_id=self.config.node_id,
            topics=topics,
            metadata_offset=image.last_offset,
        )
