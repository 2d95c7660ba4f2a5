"""ListOffsets against each partition's leader, fenced by the cached leader epoch.

Shared by the admin (log start offset and high watermark in `describe_topics`) and
the consumer (auto_offset_reset, seek_to_beginning/end). One request per leader for
all of its partitions; each carries current_leader_epoch (KIP-320), so a deposed
leader answers FENCED_LEADER_EPOCH instead of an offset from a log that is no longer
the partition's. Retriable answers are retried with backoff within a time bound (and
an optional number of attempts): among them OFFSET_NOT_AVAILABLE, a new leader whose
high watermark has not reached the start of its epoch yet (KIP-207), which would
otherwise answer "latest" with an offset below what was acknowledged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Mapping

from client.cluster import ClusterClient
from client.errors import BrokerResponseError
from client.errors import ConnectionFailedError
from client.errors import MinibrokerError
from client.errors import RequestTimedOutError
from client.errors import UnknownTopicOrPartitionError
from client.errors import error_for
from client.types import OffsetAndTimestamp
from client.types import TopicPartition
from protocol.api import CONSUMER_REPLICA_ID
from protocol.api import EARLIEST_TIMESTAMP
from protocol.api import LATEST_TIMESTAMP
from protocol.errors import ErrorCode
from protocol.messages import ListOffsetsPartition
from protocol.messages import ListOffsetsRequest
from protocol.messages import ListOffsetsResponse
from protocol.messages import ListOffsetsTopic

log = logging.getLogger(__name__)


async def list_offsets(
    cluster: ClusterClient,
    timestamps: Mapping[TopicPartition, int],
    *,
    timeout_ms: int | None = None,
    max_attempts: int | None = None,
    isolation_level: int = 0,
) -> tuple[dict[TopicPartition, OffsetAndTimestamp], dict[TopicPartition, MinibrokerError]]:
    """Resolve `timestamps` (-2 earliest, -1 latest, else ms) to offsets.

    Returns (results, errors): a partition is in exactly one of them. Retriable
    errors are retried (one attempt at least) while `timeout_ms` (default: the
    cluster's request_timeout_ms) leaves room for the next backoff, and at most
    `max_attempts` times if given; what is left is reported."""
    results: dict[TopicPartition, OffsetAndTimestamp] = {}
    errors: dict[TopicPartition, MinibrokerError] = {}
    remaining = dict(timestamps)
    budget_ms = cluster.request_timeout_ms if timeout_ms is None else timeout_ms
    deadline = time.monotonic() + budget_ms / 1000
    backoff = cluster.retry_backoff_ms / 1000
    attempt = 0
    while True:
        attempt += 1
        retry: dict[TopicPartition, MinibrokerError] = {}
        by_leader: dict[int, list[tuple[TopicPartition, int]]] = defaultdict(list)
        for tp in remaining:
            try:
                leader, epoch = cluster.leader_for(tp)
            except BrokerResponseError as exc:
                retry[tp] = exc
                continue
            by_leader[leader].append((tp, epoch))
        answers = await asyncio.gather(
            *(
                _send(cluster, node, parts, remaining, isolation_level)
                for node, parts in by_leader.items()
            )
        )
        for answer in answers:
            for tp, outcome in answer.items():
                if isinstance(outcome, OffsetAndTimestamp):
                    results[tp] = outcome
                elif outcome.retriable:
                    retry[tp] = outcome
                else:
                    errors[tp] = outcome
        remaining = {tp: remaining[tp] for tp in retry}
        if not remaining:
            break
        out_of_attempts = max_attempts is not None and attempt >= max_attempts
        if out_of_attempts or time.monotonic() + backoff > deadline:
            errors.update(retry)
            break
        log.debug("ListOffsets retry for %s: %s", list(retry), list(retry.values())[:1])
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, 1.0)
        try:
            await cluster.refresh_metadata({tp.topic for tp in remaining})
        except MinibrokerError as exc:
            log.debug("metadata refresh failed: %s", exc)
    return results, errors


async def _send(
    cluster: ClusterClient,
    node: int,
    parts: list[tuple[TopicPartition, int]],
    timestamps: Mapping[TopicPartition, int],
    isolation_level: int,
) -> dict[TopicPartition, OffsetAndTimestamp | MinibrokerError]:
    by_topic: dict[str, list[ListOffsetsPartition]] = defaultdict(list)
    for tp, epoch in parts:
        by_topic[tp.topic].append(
            ListOffsetsPartition(
                partition_index=tp.partition,
                current_leader_epoch=epoch,
                timestamp=timestamps[tp],
            )
        )
    request = ListOffsetsRequest(
        replica_id=CONSUMER_REPLICA_ID,
        isolation_level=isolation_level,
        topics=[ListOffsetsTopic(name=t, partitions=ps) for t, ps in by_topic.items()],
    )
    out: dict[TopicPartition, OffsetAndTimestamp | MinibrokerError] = {}
    try:
        response = await cluster.send(node, request)
    except (ConnectionFailedError, RequestTimedOutError) as exc:
        return {tp: exc for tp, _ in parts}
    except BrokerResponseError as exc:
        return {tp: exc for tp, _ in parts}
    assert isinstance(response, ListOffsetsResponse)
    asked = {tp for tp, _ in parts}
    for topic in response.topics:
        for p in topic.partitions:
            tp = TopicPartition(topic.name, p.partition_index)
            if tp not in asked:
                continue  # not ours to report (a broker's fault)
            if p.error_code != ErrorCode.NONE:
                out[tp] = error_for(p.error_code, topic=tp.topic, partition=tp.partition)
            elif p.offset < 0 and timestamps[tp] in (EARLIEST_TIMESTAMP, LATEST_TIMESTAMP):
                # Earliest or latest answered "unknown offset": no position to take (as
                # Kafka's consumer, which leaves the partition to retry); a timestamp
                # query's -1 means "no record at or after it", for the caller to read.
                out[tp] = error_for(
                    ErrorCode.OFFSET_NOT_AVAILABLE,
                    f"broker {node} answered offset {p.offset} for the "
                    f"{'earliest' if timestamps[tp] == EARLIEST_TIMESTAMP else 'latest'} offset",
                    topic=tp.topic,
                    partition=tp.partition,
                )
            else:
                out[tp] = OffsetAndTimestamp(p.offset, p.timestamp, p.leader_epoch)
    for tp, _ in parts:
        if tp not in out:
            out[tp] = UnknownTopicOrPartitionError(
                f"broker {node} did not answer for this partition",
                topic=tp.topic,
                partition=tp.partition,
            )
    return out
