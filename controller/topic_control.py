"""Topics (Kafka's ReplicationControlManager's topic half and its configuration
checks): CreateTopics (names, configs, replica placement, first partition states) and
DeleteTopics."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

from controller.context import ControllerPart
from controller.epochs import new_partition
from controller.meta_properties import new_uuid_string
from controller.replica_placement import PlacementError
from controller.replica_placement import assign_replicas
from controller.state import MetadataImage
from controller.topic_validation import InvalidTopicConfig
from controller.topic_validation import InvalidTopicName
from controller.topic_validation import collision_key
from controller.topic_validation import validate_topic_configs
from controller.topic_validation import validate_topic_name
from protocol.errors import ErrorCode
from protocol.messages import CreatableTopic
from protocol.messages import CreatableTopicResult
from protocol.messages import CreateTopicsRequest
from protocol.messages import CreateTopicsResponse
from protocol.messages import DeletableTopicResult
from protocol.messages import DeleteTopicsRequest
from protocol.messages import DeleteTopicsResponse
from protocol.metadata_records import MetadataRecord
from protocol.metadata_records import RemoveTopicRecord
from protocol.metadata_records import TopicRecord

log = logging.getLogger(__name__)
# How many partitions' replicas the "created topic" line names.
LOGGED_ASSIGNMENTS = 20


class _Refused(Exception):
    """A CreateTopics entry refused: its error code and why."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class TopicControl(ControllerPart):
    def placeable_brokers(self, image: MetadataImage) -> list[int]:
        """Brokers that may get new replicas: unfenced, not shutting down, and heard
        from (registration or heartbeat) by this controller process within their
        session. An unfenced state replayed from the log after a restart is not
        enough: that broker may have died while the controller was down."""
        out = []
        for broker_id in image.unfenced_broker_ids():
            epoch = image.brokers[broker_id].broker_epoch
            if (broker_id, epoch) in self.ctx.shutting_down:
                continue
            if self.sessions.heard_from(broker_id, epoch):
                out.append(broker_id)
        return out

    def _create_one(
        self, image: MetadataImage, topic: CreatableTopic, claimed: dict[str, str]
    ) -> tuple[CreatableTopicResult, list[MetadataRecord]]:
        """The records creating `topic` and the answer, or the refusal and none.
        `claimed`: collision key -> the topic this request creates under it."""
        unfenced = self.placeable_brokers(image)
        try:
            try:
                validate_topic_name(topic.name)
            except InvalidTopicName as exc:
                raise _Refused(ErrorCode.INVALID_TOPIC_EXCEPTION, str(exc)) from None
            if topic.name in image.topics_by_name:
                raise _Refused(
                    ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {topic.name!r} already exists"
                )
            key = collision_key(topic.name)
            # As Kafka: '.' and '_' are one character in metric names, so two topics
            # that differ only there would report each other's metrics. An earlier
            # entry of this request counts too (Kafka's KRaft controller checks only
            # topics that exist, and would create both).
            other = image.colliding_topic(topic.name) or (claimed.get(key) if key else None)
            if other is not None:
                raise _Refused(
                    ErrorCode.INVALID_TOPIC_EXCEPTION,
                    f"topic {topic.name!r} collides with existing topic {other!r} "
                    "('.' and '_' are the same character in metric names)",
                )
            if topic.assignments:
                placement = self._assigned_placement(image, topic, unfenced)
            else:
                placement = self._counted_placement(image, topic, unfenced)
            try:
                configs = validate_topic_configs(
                    topic.configs,
                    default_min_insync_replicas=self.config.default_min_insync_replicas,
                    default_unclean_leader_election=self.config.default_unclean_leader_election,
                )
            except InvalidTopicConfig as exc:
                raise _Refused(ErrorCode.INVALID_CONFIG, str(exc)) from None
            if key is not None:
                claimed[key] = topic.name
        except _Refused as refused:
            log.info("refused to create topic %r: %s", topic.name, refused.message)
            return (
                CreatableTopicResult(
                    name=topic.name, error_code=int(refused.code), error_message=refused.message
                ),
                [],
            )

        topic_id = new_uuid_string()
        while topic_id in image.topics:
            topic_id = new_uuid_string()
        records: list[MetadataRecord] = [
            TopicRecord(name=topic.name, topic_id=topic_id, configs=configs)
        ]
        for partition_id, replicas in enumerate(placement):
            isr = [b for b in replicas if b in unfenced]
            records.append(new_partition(topic_id, partition_id, replicas, isr, leader=isr[0]))
        result = CreatableTopicResult(
            name=topic.name,
            topic_id=topic_id,
            num_partitions=len(placement),
            replication_factor=len(placement[0]),
        )
        return result, records

    def _assigned_placement(
        self, image: MetadataImage, topic: CreatableTopic, unfenced: list[int]
    ) -> list[list[int]]:
        """The replicas the request assigns, checked (raises _Refused)."""
        if topic.num_partitions != -1 or topic.replication_factor != -1:
            raise _Refused(
                ErrorCode.INVALID_REQUEST,
                "give either assignments or num_partitions/replication_factor, not both",
            )
        indexes = sorted(a.partition_index for a in topic.assignments)
        if indexes != list(range(len(indexes))):
            raise _Refused(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"assignment partitions {indexes} are not 0..{len(indexes) - 1}",
            )
        self._check_partition_count(len(indexes))
        sizes = {len(a.broker_ids) for a in topic.assignments}
        if len(sizes) != 1 or 0 in sizes:
            raise _Refused(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                "every partition needs the same, non-zero number of replicas",
            )
        placement: list[list[int]] = []
        for assignment in sorted(topic.assignments, key=lambda a: a.partition_index):
            replicas = list(assignment.broker_ids)
            index = assignment.partition_index
            unknown = [b for b in replicas if b not in image.brokers]
            if len(set(replicas)) != len(replicas):
                why = f"partition {index} lists a broker twice: {replicas}"
            elif unknown:
                why = f"partition {index} names unregistered brokers {unknown}"
            elif not any(b in unfenced for b in replicas):
                why = f"every broker of partition {index} ({replicas}) is fenced"
            else:
                placement.append(replicas)
                continue
            raise _Refused(ErrorCode.INVALID_REPLICA_ASSIGNMENT, why)
        return placement

    def _counted_placement(
        self, image: MetadataImage, topic: CreatableTopic, unfenced: list[int]
    ) -> list[list[int]]:
        """Replicas placed for the partition count and replication factor asked (or
        the defaults) over the placeable brokers (raises _Refused)."""
        num_partitions = (
            self.config.default_partitions if topic.num_partitions == -1 else topic.num_partitions
        )
        replication_factor = (
            self.config.default_replication_factor
            if topic.replication_factor == -1
            else topic.replication_factor
        )
        if num_partitions < 1:
            raise _Refused(
                ErrorCode.INVALID_PARTITIONS,
                f"number of partitions must be >= 1, not {num_partitions}",
            )
        self._check_partition_count(num_partitions)
        if replication_factor < 1:
            raise _Refused(
                ErrorCode.INVALID_REPLICATION_FACTOR,
                f"replication factor must be >= 1, not {replication_factor}",
            )
        try:
            return assign_replicas(num_partitions, replication_factor, unfenced, rng=self.ctx.rng)
        except PlacementError as exc:
            silent = sorted(set(image.unfenced_broker_ids()) - set(unfenced))
            hint = (
                f"; brokers {silent} are registered but have not heartbeated to this "
                "controller since it started: retry in a moment if they are alive"
                if silent
                else ""
            )
            raise _Refused(ErrorCode.INVALID_REPLICATION_FACTOR, f"{exc}{hint}") from None

    def _check_partition_count(self, count: int) -> None:
        if count > self.config.max_partitions_per_topic:
            raise _Refused(
                ErrorCode.INVALID_PARTITIONS,
                f"{count} partitions exceed the limit of {self.config.max_partitions_per_topic}",
            )

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
            placeable = self.placeable_brokers(self.image)
            if len(placeable) >= needed or len(self.image.unfenced_broker_ids()) == len(placeable):
                return
            await asyncio.sleep(0.05)

    async def create_topics(self, request: CreateTopicsRequest) -> CreateTopicsResponse:
        counts = Counter(t.name for t in request.topics)
        await self._await_silent_brokers(request)

        def build(image: MetadataImage) -> tuple[list[MetadataRecord], CreateTopicsResponse]:
            results: list[CreatableTopicResult] = []
            records: list[MetadataRecord] = []
            claimed: dict[str, str] = {}
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
                result, topic_records = self._create_one(image, topic, claimed)
                results.append(result)
                if not request.validate_only:
                    records.extend(topic_records)
            return records, CreateTopicsResponse(topics=results)

        response = await self.writer.commit(build)
        if not request.validate_only:
            for result in response.topics:
                if result.error_code == 0:
                    topic = self.image.topic_by_name(result.name)
                    # The first partitions' replicas only: a line per topic, whatever
                    # its size (10,000 partitions made one of 150 KB).
                    shown = sorted(topic.partitions.items())[:LOGGED_ASSIGNMENTS] if topic else []
                    assignment: dict[int | str, object] = {p: r.replicas for p, r in shown}
                    if topic and len(topic.partitions) > len(shown):
                        assignment["..."] = f"{len(topic.partitions) - len(shown)} more"
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
                topic = image.topic_by_name(name)
                if counts[name] > 1:
                    code, message = (
                        ErrorCode.INVALID_REQUEST,
                        f"topic {name!r} appears more than once",
                    )
                elif topic is None:
                    code, message = (
                        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                        f"topic {name!r} does not exist",
                    )
                else:
                    records.append(RemoveTopicRecord(topic_id=topic.topic_id))
                    results.append(DeletableTopicResult(name=name))
                    continue
                results.append(
                    DeletableTopicResult(name=name, error_code=int(code), error_message=message)
                )
            return records, DeleteTopicsResponse(responses=results)

        response = await self.writer.commit(build)
        for result in response.responses:
            if result.error_code == 0:
                log.info("deleted topic %s", result.name)
        return response
