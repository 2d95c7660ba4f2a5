"""Partitions and replication (Kafka's ReplicationControlManager): the partition
changes when brokers go away or come back, AlterPartition (the leader's ISR changes,
with KIP-903's broker epoch checks) and ElectLeaders. The epochs move as
controller/epochs.py says; who leads, as controller/election.py says.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from controller.context import ControllerPart
from controller.election import elect_if_leaderless
from controller.election import elect_preferred
from controller.election import remove_broker
from controller.epochs import change_partition
from controller.epochs import stale_broker_epoch
from controller.state import MetadataImage
from controller.topic_validation import unclean_election_enabled
from protocol.api import ELECTION_PREFERRED
from protocol.api import ELECTION_UNCLEAN
from protocol.errors import ErrorCode
from protocol.messages import AlterPartitionPartition
from protocol.messages import AlterPartitionPartitionResult
from protocol.messages import AlterPartitionRequest
from protocol.messages import AlterPartitionResponse
from protocol.messages import AlterPartitionTopicResult
from protocol.messages import ElectLeadersRequest
from protocol.messages import ElectLeadersResponse
from protocol.messages import ElectLeadersResult
from protocol.metadata_records import LEADER_RECOVERED
from protocol.metadata_records import LEADER_RECOVERING
from protocol.metadata_records import NO_LEADER
from protocol.metadata_records import MetadataRecord
from protocol.metadata_records import PartitionRecord

log = logging.getLogger(__name__)


def partition_name(image: MetadataImage, record: PartitionRecord) -> str:
    """ "topic-partition" for log lines (the topic id when the topic is unknown)."""
    topic = image.topics.get(record.topic_id)
    return f"{topic.name if topic else record.topic_id}-{record.partition_id}"


def _election_result(
    topic: str, partition: int, code: ErrorCode, why: str, state: PartitionRecord | None
) -> ElectLeadersResult:
    return ElectLeadersResult(
        topic=topic,
        partition=partition,
        error_code=int(code),
        error_message=why or None,
        leader=-1 if state is None else state.leader,
        leader_epoch=-1 if state is None else state.leader_epoch,
    )


class ReplicationControl(ControllerPart):
    def broker_gone_records(
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

        lost = self.ctx.lost_data(image)
        out: list[MetadataRecord] = []
        for topic, partition in image.topic_partitions():
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
            record = change_partition(
                partition,
                leader=current.leader,
                isr=current.isr,
                leader_recovery_state=current.leader_recovery_state,
            )
            if record is None:
                continue
            self.log_partition_change(image, partition, record, why)
            out.append(record)
        return out

    def log_partition_change(
        self, image: MetadataImage, old: PartitionRecord, new: PartitionRecord, why: str
    ) -> None:
        tp = partition_name(image, new)
        if new.leader_recovery_state == LEADER_RECOVERING and (
            old.leader_recovery_state != LEADER_RECOVERING or old.leader != new.leader
        ):
            self.ctx.unclean_elections += 1
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
                self.ctx.unclean_elections,
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

    def unfence_records(self, image: MetadataImage, broker_id: int) -> list[MetadataRecord]:
        """Elect leaders for leaderless partitions now that `broker_id` is back."""

        def usable(b: int) -> bool:
            return b == broker_id or image.is_unfenced(b)

        out: list[MetadataRecord] = []
        for topic, partition in image.topic_partitions():
            if partition.leader != NO_LEADER:
                continue
            changed, _unclean = elect_if_leaderless(
                partition,
                usable,
                unclean_allowed=unclean_election_enabled(topic.configs),
                last_resort=self.ctx.lost_data(image),
            )
            if changed is not None:
                self.log_partition_change(image, partition, changed, f"broker {broker_id} back")
                out.append(changed)
        return out

    # ------------------------------------------------------------------ ElectLeaders

    async def elect_leaders(self, request: ElectLeadersRequest) -> ElectLeadersResponse:
        """Kafka's ElectLeaders. PREFERRED: the named partitions (all, when none are
        named) led by their preferred replica where it is in sync. UNCLEAN, for
        leaderless partitions: a usable ISR member if there is one, else (the operator
        accepting the loss of what it lacks) the replica named, or the first usable one
        outside the ISR in replica order, replicas known to have lost their data last."""
        if request.election_type == ELECTION_PREFERRED:
            return await self._elect_preferred(request)
        if request.election_type != ELECTION_UNCLEAN:
            return ElectLeadersResponse(
                error_code=int(ErrorCode.INVALID_REQUEST),
                error_message=f"election type {request.election_type} is not served: "
                f"preferred ({ELECTION_PREFERRED}) or unclean ({ELECTION_UNCLEAN})",
            )
        if not request.partitions:
            return ElectLeadersResponse(
                error_code=int(ErrorCode.INVALID_REQUEST),
                error_message="name the partitions to elect a leader for",
            )

        def build(image: MetadataImage) -> tuple[list[MetadataRecord], ElectLeadersResponse]:
            lost = self.ctx.lost_data(image)
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
                        self.log_partition_change(
                            image, state, changed, "asked by an operator with ElectLeaders"
                        )
                        records.append(changed)
                        state = changed
                results.append(_election_result(item.topic, item.partition, code, why, state))
            return records, ElectLeadersResponse(results=results)

        return await self.writer.commit(build)

    def _usable_leader(self, image: MetadataImage) -> Callable[[int], bool]:
        stopping = {broker for broker, _ in self.ctx.shutting_down}
        return lambda b: b not in stopping and image.is_unfenced(b)

    async def _elect_preferred(self, request: ElectLeadersRequest) -> ElectLeadersResponse:
        def build(image: MetadataImage) -> tuple[list[MetadataRecord], ElectLeadersResponse]:
            usable = self._usable_leader(image)
            named = [(p.topic, p.partition) for p in request.partitions] or [
                (topic.name, record.partition_id) for topic, record in image.topic_partitions()
            ]
            records: list[MetadataRecord] = []
            results: list[ElectLeadersResult] = []
            for topic_name, partition_id in dict.fromkeys(named):
                tp = f"{topic_name}-{partition_id}"
                topic = image.topic_by_name(topic_name)
                state = None if topic is None else topic.partitions.get(partition_id)
                code, why = ErrorCode.NONE, ""
                if state is None:
                    code, why = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{tp} does not exist"
                elif state.replicas and state.leader == state.replicas[0]:
                    code, why = (
                        ErrorCode.ELECTION_NOT_NEEDED,
                        (f"{tp} is led by its preferred replica, broker {state.leader}"),
                    )
                elif (changed := elect_preferred(state, usable)) is None:
                    code, why = (
                        ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
                        (
                            f"the preferred replica of {tp}, broker {state.replicas[0]}, is not "
                            f"in sync and up (ISR {state.isr}); it leads again once it caught up"
                        ),
                    )
                else:
                    self.log_partition_change(image, state, changed, "preferred election")
                    records.append(changed)
                    state = changed
                results.append(_election_result(topic_name, partition_id, code, why, state))
            return records, ElectLeadersResponse(results=results)

        return await self.writer.commit(build)

    async def rebalance_leaders(self) -> int:
        """Kafka's auto leader rebalance: for each broker that leads fewer of the
        partitions it is preferred for than the imbalance percentage allows, give those
        whose preferred replica is in sync back to it (in one change). How many moved."""
        allowed = self.config.leader_imbalance_per_broker_percentage

        def build(image: MetadataImage) -> tuple[list[MetadataRecord], int]:
            usable = self._usable_leader(image)
            preferred: dict[int, int] = {}
            elsewhere: dict[int, list[PartitionRecord]] = {}
            for _topic, state in image.topic_partitions():
                if not state.replicas:
                    continue
                broker = state.replicas[0]
                preferred[broker] = preferred.get(broker, 0) + 1
                if state.leader != broker:
                    elsewhere.setdefault(broker, []).append(state)
            records: list[MetadataRecord] = []
            for broker, states in sorted(elsewhere.items()):
                if len(states) * 100 <= allowed * preferred[broker]:
                    continue
                moved = [c for s in states if (c := elect_preferred(s, usable)) is not None]
                if moved:
                    log.info(
                        "leader rebalance: broker %d led %d of the %d partitions it is "
                        "preferred for (imbalance allowed: %d%%); %d go back to it",
                        broker,
                        preferred[broker] - len(states),
                        preferred[broker],
                        allowed,
                        len(moved),
                    )
                records.extend(moved)
            return records, len(records)

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

    # ------------------------------------------------------------------ AlterPartition

    async def alter_partition(self, request: AlterPartitionRequest) -> AlterPartitionResponse:
        outcomes: list[AlterOutcome] = []

        def build(image: MetadataImage) -> tuple[list[MetadataRecord], AlterPartitionResponse]:
            stale = stale_broker_epoch(image.brokers, request.broker_id, request.broker_epoch)
            if stale is not None:
                outcomes.append(("*", -1, ErrorCode.STALE_BROKER_EPOCH, stale, None))
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
                        code, why, current = check_alter(
                            image,
                            request,
                            topic_data.topic_name,
                            data,
                            shutting_down=self.ctx.shutting_down,
                            ignore_broker_epochs=self.config.unsafe_ignore_broker_epochs,
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
                    state = change_partition(
                        current,
                        isr=[s.broker_id for s in data.new_isr_with_epochs],
                        leader_recovery_state=data.leader_recovery_state,
                    )
                    if state is None:
                        state = current
                    else:
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
        _log_alter_outcomes(self.image, request.broker_id, outcomes)
        return response


AlterOutcome = tuple[str, int, ErrorCode, str, PartitionRecord | None]


def _log_alter_outcomes(image: MetadataImage, requester: int, outcomes: list[AlterOutcome]) -> None:
    """One line per partition an AlterPartition changed or was refused for, once the
    changes are durable (`image` is the image after them)."""
    for topic_name, partition, code, why, current in outcomes:
        if code != ErrorCode.NONE:
            log.info(
                "AlterPartition from broker %d refused for %s-%d: %s (%s)",
                requester,
                topic_name,
                partition,
                code.name,
                why,
            )
            continue
        topic = image.topic_by_name(topic_name)
        state = topic.partitions.get(partition) if topic else None
        if state is not None and current is not None and state is not current:
            log.info(
                "AlterPartition from broker %d: %s-%d ISR %s -> %s, leader %d epoch %d, "
                "partition epoch %d -> %d",
                requester,
                topic_name,
                partition,
                current.isr,
                state.isr,
                state.leader,
                state.leader_epoch,
                current.partition_epoch,
                state.partition_epoch,
            )


# KIP-903's checks of one AlterPartition entry (pure: the image and the controller's
# shutdown set in, the verdict out).


def check_alter(
    image: MetadataImage,
    request: AlterPartitionRequest,
    topic_name: str,
    data: AlterPartitionPartition,
    *,
    shutting_down: set[tuple[int, int]],
    ignore_broker_epochs: bool,
) -> tuple[ErrorCode, str, PartitionRecord | None]:
    """KIP-903's checks for one partition: (error, why, current state)."""
    topic = image.topic_by_name(topic_name)
    current = None if topic is None else topic.partitions.get(data.partition_index)
    if current is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "unknown partition", None
    fenced = _leader_problem(request.broker_id, data, current)
    if fenced is not None:
        return (*fenced, current)
    invalid = _new_isr_problem(data, current)
    if invalid is not None:
        return ErrorCode.INVALID_REQUEST, invalid, current
    for state in data.new_isr_with_epochs:
        reason = _ineligible(
            image,
            current,
            state.broker_id,
            state.broker_epoch,
            shutting_down=shutting_down,
            ignore_broker_epochs=ignore_broker_epochs,
        )
        if reason is not None:
            return ErrorCode.INELIGIBLE_REPLICA, reason, current
    return ErrorCode.NONE, "", current


def _leader_problem(
    broker_id: int, data: AlterPartitionPartition, current: PartitionRecord
) -> tuple[ErrorCode, str] | None:
    """Whether the request comes from the current leader at the current epochs."""
    if data.leader_epoch > current.leader_epoch:
        return (
            ErrorCode.UNKNOWN_LEADER_EPOCH,
            f"leader epoch {data.leader_epoch} is newer than {current.leader_epoch}",
        )
    if data.leader_epoch < current.leader_epoch:
        return (
            ErrorCode.FENCED_LEADER_EPOCH,
            f"leader epoch {data.leader_epoch} is older than {current.leader_epoch}",
        )
    if broker_id != current.leader:
        return (
            ErrorCode.FENCED_LEADER_EPOCH,
            f"broker {broker_id} is not the leader (leader is {current.leader})",
        )
    if data.partition_epoch != current.partition_epoch:
        return (
            ErrorCode.INVALID_UPDATE_VERSION,
            f"partition epoch {data.partition_epoch} is not the current {current.partition_epoch}",
        )
    return None


def _new_isr_problem(data: AlterPartitionPartition, current: PartitionRecord) -> str | None:
    """What makes the proposed ISR and recovery state invalid (INVALID_REQUEST)."""
    new_isr = [s.broker_id for s in data.new_isr_with_epochs]
    if not new_isr or len(set(new_isr)) != len(new_isr):
        return f"invalid ISR {new_isr} (empty or duplicates)"
    if current.leader not in new_isr:
        return f"the new ISR {new_isr} leaves out the leader {current.leader}"
    if data.leader_recovery_state not in (LEADER_RECOVERED, LEADER_RECOVERING):
        return f"unknown leader recovery state {data.leader_recovery_state}"
    if data.leader_recovery_state == LEADER_RECOVERING and len(new_isr) > 1:
        return "the ISR cannot grow while the leader is still recovering"
    if (
        current.leader_recovery_state == LEADER_RECOVERED
        and data.leader_recovery_state == LEADER_RECOVERING
    ):
        return "RECOVERED cannot go back to RECOVERING"
    return None


def _ineligible(
    image: MetadataImage,
    current: PartitionRecord,
    broker_id: int,
    broker_epoch: int,
    *,
    shutting_down: set[tuple[int, int]],
    ignore_broker_epochs: bool,
) -> str | None:
    if broker_id not in current.replicas:
        return f"broker {broker_id} is not a replica ({current.replicas})"
    broker = image.brokers.get(broker_id)
    if broker is None:
        return f"broker {broker_id} is not registered"
    if (broker_id, broker.broker_epoch) in shutting_down:
        return f"broker {broker_id} is shutting down"
    if broker.fenced:
        return f"broker {broker_id} is fenced"
    if broker_epoch != -1 and broker_epoch != broker.broker_epoch:
        if ignore_broker_epochs:
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
