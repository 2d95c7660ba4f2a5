"""Read-only answers from the controller's image: Metadata and DescribeCluster (for
tools), and FetchMetadata, the metadata log brokers follow (long-poll, or a snapshot
when they are too far behind)."""

from __future__ import annotations

import logging

from controller.context import ControllerPart
from protocol.errors import ErrorCode
from protocol.messages import DescribeClusterRequest
from protocol.messages import DescribeClusterResponse
from protocol.messages import FetchMetadataRequest
from protocol.messages import FetchMetadataResponse
from protocol.messages import MetadataEntry
from protocol.messages import MetadataRequest
from protocol.messages import MetadataResponse
from runtime.metadata_answers import describe_cluster_response
from runtime.metadata_answers import metadata_response

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
        return describe_cluster_response(
            self.image, request, cluster_id=self.cluster_id, controller_id=self.config.node_id
        )

    async def metadata(self, request: MetadataRequest) -> MetadataResponse:
        return metadata_response(
            self.image, request, cluster_id=self.cluster_id, controller_id=self.config.node_id
        )
