"""Helpers for the broker unit tests: a ReplicaManager over a real LogManager in a
temp directory, and metadata records to drive it."""

from __future__ import annotations

import itertools
from pathlib import Path

from broker.config import BrokerConfig
from broker.metadata_image import MetadataImage
from broker.metadata_image import PartitionState
from broker.replica_manager import ReplicaManager
from broker.server import base_log_config
from broker.storage.log_manager import LogManager
from protocol.messages import MetadataEntry
from protocol.metadata_records import PartitionRecord
from protocol.metadata_records import RemoveTopicRecord
from protocol.metadata_records import TopicRecord
from protocol.record_batch import encode_batch


class Harness:
    def __init__(
        self,
        data_dir: Path,
        node_id: int = 1,
        *,
        rm_kwargs: dict[str, object] | None = None,
        **overrides: object,
    ) -> None:
        self.config = BrokerConfig(node_id=node_id, data_dir=data_dir, **overrides)  # type: ignore[arg-type]
        self.log_manager = LogManager(data_dir, base_log_config(self.config))
        self.log_manager.startup()
        self.image = MetadataImage()
        self.rm = ReplicaManager(
            self.config,
            self.log_manager,
            self.image,
            base_log_config=base_log_config(self.config),
            checkpointed_high_watermarks=self.log_manager.read_high_watermarks(),
            **(rm_kwargs or {}),  # type: ignore[arg-type]
        )
        self._offsets = itertools.count()
        self._topic_ids: dict[str, str] = {}

    async def apply(self, *records: object) -> None:
        entries = [MetadataEntry(offset=next(self._offsets), record=r) for r in records]  # type: ignore[arg-type]
        delta = self.image.apply(entries)
        await self.rm.apply_delta(delta)

    async def create_topic(
        self,
        name: str,
        partitions: int = 1,
        *,
        leader: int | None = None,
        replicas: list[int] | None = None,
        isr: list[int] | None = None,
        configs: dict[str, str] | None = None,
        topic_id: str | None = None,
    ) -> None:
        topic_id = topic_id or f"{name}-id-{len(self._topic_ids)}"
        self._topic_ids[name] = topic_id
        node = self.config.node_id
        replicas = replicas or [node]
        records: list[object] = [TopicRecord(name=name, topic_id=topic_id, configs=configs or {})]
        for index in range(partitions):
            records.append(
                PartitionRecord(
                    topic_id=topic_id,
                    partition_id=index,
                    replicas=replicas,
                    isr=isr or replicas,
                    leader=node if leader is None else leader,
                    leader_epoch=0,
                    partition_epoch=0,
                )
            )
        await self.apply(*records)

    async def set_partition(
        self,
        name: str,
        index: int,
        *,
        leader: int,
        leader_epoch: int,
        partition_epoch: int | None = None,
        replicas: list[int] | None = None,
        isr: list[int] | None = None,
    ) -> None:
        replicas = replicas or [self.config.node_id]
        await self.apply(
            PartitionRecord(
                topic_id=self._topic_ids[name],
                partition_id=index,
                replicas=replicas,
                isr=isr or replicas,
                leader=leader,
                leader_epoch=leader_epoch,
                partition_epoch=leader_epoch if partition_epoch is None else partition_epoch,
            )
        )

    async def delete_topic(self, name: str) -> None:
        await self.apply(RemoveTopicRecord(topic_id=self._topic_ids[name]))

    async def close(self) -> None:
        await self.rm.shutdown()
        self.log_manager.shutdown()


def partition_record(
    topic_id: str,
    index: int = 0,
    *,
    replicas: list[int],
    leader: int,
    epoch: int = 0,
    partition_epoch: int | None = None,
) -> PartitionRecord:
    """A partition with every replica in the ISR."""
    return PartitionRecord(
        topic_id=topic_id,
        partition_id=index,
        replicas=replicas,
        isr=list(replicas),
        leader=leader,
        leader_epoch=epoch,
        partition_epoch=epoch if partition_epoch is None else partition_epoch,
    )


def partition_state(
    leader: int,
    epoch: int,
    *,
    replicas: tuple[int, ...] = (1, 2, 3),
    isr: tuple[int, ...] = (1, 2, 3),
    pe: int | None = None,
) -> PartitionState:
    """The image's state of partition t-0 (topic id "T"); its partition epoch is the
    leader epoch unless `pe` says otherwise."""
    return PartitionState(
        topic="t",
        topic_id="T",
        partition=0,
        replicas=tuple(replicas),
        isr=tuple(isr),
        leader=leader,
        leader_epoch=epoch,
        partition_epoch=epoch if pe is None else pe,
    )


def batch(*values: bytes, timestamp: int | None = None) -> bytes:
    return encode_batch([(None, v, (), timestamp) for v in values])
