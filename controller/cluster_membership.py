"""Cluster membership (Kafka's ClusterControlManager): broker registration (a new
broker epoch per incarnation), heartbeats, fencing and unfencing, controlled shutdown,
and the fencing of brokers whose session ran out (the liveness loop). The partition
changes these cause are ReplicationControl's.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from controller.context import ControllerContext
from controller.context import ControllerPart
from controller.epochs import broker_epoch_at
from controller.replication_control import ReplicationControl
from controller.replication_control import partition_name
from controller.state import BrokerInfo
from controller.state import MetadataImage
from protocol.errors import ErrorCode
from protocol.messages import BrokerHeartbeatRequest
from protocol.messages import BrokerHeartbeatResponse
from protocol.messages import BrokerRegistrationRequest
from protocol.messages import BrokerRegistrationResponse
from protocol.metadata_records import FenceBrokerRecord
from protocol.metadata_records import ListenerInfo
from protocol.metadata_records import MetadataRecord
from protocol.metadata_records import PartitionRecord
from protocol.metadata_records import RegisterBrokerRecord
from protocol.metadata_records import UnfenceBrokerRecord

log = logging.getLogger(__name__)

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


def _registration_problem(request: BrokerRegistrationRequest) -> str | None:
    """Why a registration is malformed (INVALID_REQUEST), or None."""
    if request.broker_id < 0:
        return f"broker id {request.broker_id} < 0"
    if not request.incarnation_id:
        return "empty incarnation id"
    if not request.listeners:
        return "a broker needs at least one listener"
    for listener in request.listeners:
        if not listener.host or not 0 < listener.port <= 65535:
            return (
                f"listener {listener.name} {listener.host}:{listener.port} is not a "
                "usable advertised address"
            )
    return None


class ClusterMembership(ControllerPart):
    def __init__(self, ctx: ControllerContext, replication: ReplicationControl) -> None:
        super().__init__(ctx)
        self.replication = replication
        self.foreign_clusters = ForeignClusterRefusals(ctx)

    # ------------------------------------------------------------------ registration

    async def broker_registration(
        self, request: BrokerRegistrationRequest, principal: str | None = None
    ) -> BrokerRegistrationResponse:
        """`principal`: who sent it (controller/server.py), kept in the record."""
        # Partitions whose last in-sync replica this registration concerns: left with an
        # empty ISR (the broker lost its data), or kept as the last member (it restarted
        # with its data after an unclean shutdown). Logged once the records are durable.
        stranded: list[str] = []
        last_member_unclean: list[str] = []

        def build(image: MetadataImage) -> tuple[list[MetadataRecord], Any]:
            if request.cluster_id and request.cluster_id != self.cluster_id:
                return [], self.foreign_clusters.refuse(request.broker_id, request.cluster_id)
            problem = _registration_problem(request)
            if problem is not None:
                log.warning("refused registration of broker %d: %s", request.broker_id, problem)
                return [], BrokerRegistrationResponse(
                    error_code=int(ErrorCode.INVALID_REQUEST),
                    error_message=problem,
                    cluster_id=self.cluster_id,
                )
            existing = image.brokers.get(request.broker_id)
            if existing is not None and existing.incarnation_id == request.incarnation_id:
                # A retry of a registration that already succeeded: same epoch.
                return [], (existing.broker_epoch, existing.broker_epoch)
            records: list[MetadataRecord] = []
            if existing is not None:
                records = self._replace_incarnation(
                    image, existing, request, stranded, last_member_unclean
                )
            epoch = broker_epoch_at(image.next_offset + len(records))
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
                    principal=principal,
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
            self.ctx.lost_data_at_registration[request.broker_id] = epoch
        else:
            self.ctx.lost_data_at_registration.pop(request.broker_id, None)
        self.ctx.shutting_down = {k for k in self.ctx.shutting_down if k[0] != request.broker_id}
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

    def _replace_incarnation(
        self,
        image: MetadataImage,
        existing: BrokerInfo,
        request: BrokerRegistrationRequest,
        stranded: list[str],
        last_member_unclean: list[str],
    ) -> list[MetadataRecord]:
        """The previous incarnation is gone: handle it like a fencing, so its
        leaderships move (leader epochs bumped) and it leaves the ISRs; every ISR, the
        last member included, when its data is gone. Fills `stranded` and
        `last_member_unclean` (see broker_registration)."""
        records: list[MetadataRecord] = []
        data_lost = registers_without_data(request)
        if not existing.fenced:
            records.append(
                FenceBrokerRecord(broker_id=existing.broker_id, broker_epoch=existing.broker_epoch)
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
        changes = self.replication.broker_gone_records(
            image, {existing.broker_id}, why, keep_in_isr=keep, data_lost=data_lost
        )
        records.extend(changes)
        changed = {
            (r.topic_id, r.partition_id): r for r in changes if isinstance(r, PartitionRecord)
        }
        stranded[:] = [partition_name(image, r) for r in changed.values() if not r.isr]
        if not data_lost and not request.clean_shutdown:
            last_member_unclean[:] = [
                partition_name(image, now)
                for _, p in image.topic_partitions()
                if (now := changed.get((p.topic_id, p.partition_id), p)).isr == [existing.broker_id]
            ]
        return records

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
            if request.want_shut_down or (broker_id, epoch) in self.ctx.shutting_down:
                records = self._fence(image, broker, f"controlled shutdown of broker {broker_id}")
                events.extend(["shutdown"] if records else [])
                return records, BrokerHeartbeatResponse(
                    is_caught_up=caught_up, is_fenced=True, should_shut_down=True
                )
            if request.want_fence:
                why = (
                    f"log directory of broker {broker_id} offline"
                    if request.offline_log_dirs
                    else f"broker {broker_id} asked to be fenced"
                )
                records = self._fence(image, broker, why)
                events.extend(["fence"] if records else [])
                return records, BrokerHeartbeatResponse(is_caught_up=caught_up, is_fenced=True)
            records = []
            if broker.fenced:
                if not caught_up:
                    return [], BrokerHeartbeatResponse(is_caught_up=False, is_fenced=True)
                records.append(UnfenceBrokerRecord(broker_id=broker_id, broker_epoch=epoch))
                records.extend(self.replication.unfence_records(image, broker_id))
                events.append("unfence")
            return records, BrokerHeartbeatResponse(is_caught_up=caught_up, is_fenced=False)

        # Count the heartbeat as soon as it arrives, not when the writer lock is free:
        # a slow fsync or snapshot must not fence a broker that did beat in time.
        known = self.image.brokers.get(broker_id)
        if known is not None and known.broker_epoch == request.broker_epoch:
            self.sessions.touch(broker_id, known.broker_epoch)
        response = await self.writer.commit(build)
        if "shutdown" in events:
            self.ctx.shutting_down.add((broker_id, request.broker_epoch))
        _log_heartbeat_events(request, events)
        return response

    def _fence(self, image: MetadataImage, broker: BrokerInfo, why: str) -> list[MetadataRecord]:
        """The fencing of `broker` and the partition changes it causes; none when it
        is fenced already."""
        if broker.fenced:
            return []
        return [
            FenceBrokerRecord(broker_id=broker.broker_id, broker_epoch=broker.broker_epoch),
            *self.replication.broker_gone_records(image, {broker.broker_id}, why),
        ]

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
                self.replication.broker_gone_records(
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


class ForeignClusterRefusals(ControllerPart):
    """Registrations of brokers of another cluster: refused, and logged once per
    foreign cluster id, not once per retry."""

    def __init__(self, ctx: ControllerContext) -> None:
        super().__init__(ctx)
        # Foreign cluster id -> (broker ids seen, refusals, when last logged).
        self._seen: dict[str, tuple[set[int], int, float]] = {}

    def refuse(self, broker_id: int, cluster_id: str) -> BrokerRegistrationResponse:
        """INCONSISTENT_CLUSTER_ID, and one clear log line per foreign cluster (then at
        most one per FOREIGN_CLUSTER_LOG_INTERVAL_S), not one per retry."""
        if self.ctx.new_cluster:
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
        seen = self._seen.get(cluster_id)
        if seen is None:
            while len(self._seen) >= MAX_FOREIGN_CLUSTERS:
                del self._seen[next(iter(self._seen))]
            log.error("%s", message)
            self._seen[cluster_id] = ({broker_id}, 1, now)
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
            self._seen[cluster_id] = (brokers, refusals + 1, logged_at)
        reply = (
            f"broker {broker_id} belongs to cluster {cluster_id}; this controller runs "
            f"cluster {self.cluster_id}"
        ) + (
            ", formatted anew when it started on an empty data dir (its data lost?)"
            if self.ctx.new_cluster
            else ""
        )
        return BrokerRegistrationResponse(
            error_code=int(ErrorCode.INCONSISTENT_CLUSTER_ID),
            error_message=reply,
            cluster_id=self.cluster_id,
        )


def _log_heartbeat_events(request: BrokerHeartbeatRequest, events: list[str]) -> None:
    """What a heartbeat changed, once it is durable."""
    broker_id, epoch = request.broker_id, request.broker_epoch
    if "shutdown" in events:
        log.info(
            "broker %d epoch %d: controlled shutdown, leaderships moved, broker fenced",
            broker_id,
            epoch,
        )
    elif "fence" in events and request.offline_log_dirs:
        log.warning(
            "broker %d epoch %d fenced at its request, its leaderships moved: log "
            "director%s offline: %s; it stays fenced until it restarts",
            broker_id,
            epoch,
            "y" if len(request.offline_log_dirs) == 1 else "ies",
            "; ".join(request.offline_log_dirs),
        )
    elif "fence" in events:
        log.info("broker %d epoch %d fenced at its request", broker_id, epoch)
    elif "unfence" in events:
        log.info(
            "broker %d epoch %d unfenced (metadata offset %d)",
            broker_id,
            epoch,
            request.current_metadata_offset,
        )
