"""Read-only answers from the controller's image: Metadata and DescribeCluster (for
tools), and FetchMetadata, the metadata log brokers follow (long-poll, or a snapshot
when they are too far behind)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from controller.context import ControllerPart
from protocol.errors import ErrorCode
from protocol.messages import (
    DescribeClusterBroker,
    DescribeClusterRequest,
    DescribeClusterResponse,
    FetchMetadataRequest,
    FetchMetadataResponse,
    MetadataBroker,
    MetadataEntry,
    MetadataPartition,
    MetadataRequest,
    MetadataResponse,
    MetadataTopic,
)
from protocol.metadata_records import NO_LEADER

log = logging.getLogger(__name__)


class MetadataService(ControllerPart):
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
