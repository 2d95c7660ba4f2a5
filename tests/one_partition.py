"""Requests for one partition of one topic, the shape nearly every broker test sends:
Produce, Fetch, ListOffsets and OffsetsForLeaderEpoch with the epoch fields the seeds
are about. Each builder names the partition-level fields; `**request` goes to the
request itself (acks, replica_id, max_wait_ms...), so a test sets only what it tests.
"""

from __future__ import annotations

from typing import Any

from protocol.messages import FetchPartition
from protocol.messages import FetchRequest
from protocol.messages import FetchTopic
from protocol.messages import ListOffsetsPartition
from protocol.messages import ListOffsetsRequest
from protocol.messages import ListOffsetsTopic
from protocol.messages import OffsetForLeaderEpochRequest
from protocol.messages import OffsetForLeaderPartition
from protocol.messages import OffsetForLeaderTopic
from protocol.messages import ProducePartition
from protocol.messages import ProduceRequest
from protocol.messages import ProduceTopic


def produce_request(
    topic: str, records: bytes, *, index: int = 0, epoch: int = -1, **request: Any
) -> ProduceRequest:
    partition = ProducePartition(index=index, current_leader_epoch=epoch, records=records)
    return ProduceRequest(topics=[ProduceTopic(name=topic, partitions=[partition])], **request)


def fetch_request(
    topic: str,
    offset: int,
    *,
    index: int = 0,
    epoch: int = -1,
    last_epoch: int = -1,
    partition_max_bytes: int = 1 << 20,
    **request: Any,
) -> FetchRequest:
    partition = FetchPartition(
        partition=index,
        current_leader_epoch=epoch,
        fetch_offset=offset,
        last_fetched_epoch=last_epoch,
        partition_max_bytes=partition_max_bytes,
    )
    return FetchRequest(topics=[FetchTopic(topic=topic, partitions=[partition])], **request)


def list_offsets_request(
    topic: str, timestamp: int, *, index: int = 0, epoch: int = -1, **request: Any
) -> ListOffsetsRequest:
    partition = ListOffsetsPartition(
        partition_index=index, current_leader_epoch=epoch, timestamp=timestamp
    )
    return ListOffsetsRequest(
        topics=[ListOffsetsTopic(name=topic, partitions=[partition])], **request
    )


def offsets_for_epoch_request(
    topic: str, leader_epoch: int, *, index: int = 0, epoch: int = -1, **request: Any
) -> OffsetForLeaderEpochRequest:
    partition = OffsetForLeaderPartition(
        partition=index, current_leader_epoch=epoch, leader_epoch=leader_epoch
    )
    return OffsetForLeaderEpochRequest(
        topics=[OffsetForLeaderTopic(topic=topic, partitions=[partition])], **request
    )
