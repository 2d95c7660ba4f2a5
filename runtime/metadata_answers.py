"""The Metadata and DescribeCluster answers, built from a metadata image
(runtime/metadata_image.py) by the broker (for clients) and the controller (for
tools) alike. What differs between them is a parameter: the listener whose address
is given (a broker answers with the address of the listener the request came in on,
the controller with each broker's first listener), which topic names are invalid
rather than unknown, and which topics are internal."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Container
from typing import Any

from protocol.errors import ErrorCode
from protocol.messages import DescribeClusterBroker
from protocol.messages import DescribeClusterRequest
from protocol.messages import DescribeClusterResponse
from protocol.messages import MetadataBroker
from protocol.messages import MetadataPartition
from protocol.messages import MetadataRequest
from protocol.messages import MetadataResponse
from protocol.messages import MetadataTopic
from protocol.metadata_records import NO_LEADER
from protocol.metadata_records import ListenerInfo
from runtime.metadata_image import BrokerInfo
from runtime.metadata_image import MetadataImage


def _address(broker: BrokerInfo, listener: str | None) -> ListenerInfo | None:
    """The named listener's address, else (no name, or the broker lacks it) the
    broker's first listener."""
    named = broker.listener(listener) if listener is not None else None
    return named or (broker.listeners[0] if broker.listeners else None)


def _unknown_topic(name: str) -> ErrorCode:
    return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def metadata_response(
    image: MetadataImage[Any],
    request: MetadataRequest,
    *,
    cluster_id: str | None,
    controller_id: int,
    listener: str | None = None,
    missing_topic_error: Callable[[str], ErrorCode] = _unknown_topic,
    internal_topics: Container[str] = (),
) -> MetadataResponse:
    """Live brokers, and the topics asked for (all when `request.topics` is None).
    With a `listener` name, brokers without that listener are left out."""
    live = image.live_brokers()
    live_ids = {b.broker_id for b in live}
    brokers = []
    for broker in live:
        address = broker.listener(listener) if listener is not None else _address(broker, None)
        if address is not None:
            brokers.append(
                MetadataBroker(
                    node_id=broker.broker_id, host=address.host, port=address.port, rack=broker.rack
                )
            )
    names = sorted(image.topics_by_name) if request.topics is None else request.topics
    topics = []
    for name in names:
        topic = image.topic_by_name(name)
        if topic is None:
            topics.append(MetadataTopic(error_code=int(missing_topic_error(name)), name=name))
            continue
        partitions = []
        for index in sorted(topic.partitions):
            state = topic.partitions[index]
            partitions.append(
                MetadataPartition(
                    error_code=int(
                        ErrorCode.LEADER_NOT_AVAILABLE
                        if state.leader == NO_LEADER
                        else ErrorCode.NONE
                    ),
                    partition_index=index,
                    leader_id=state.leader,
                    leader_epoch=state.leader_epoch,
                    replica_nodes=list(state.replicas),
                    isr_nodes=list(state.isr),
                    offline_replicas=[r for r in state.replicas if r not in live_ids],
                )
            )
        topics.append(
            MetadataTopic(
                name=name,
                topic_id=topic.topic_id,
                is_internal=name in internal_topics,
                partitions=partitions,
            )
        )
    return MetadataResponse(
        brokers=brokers,
        cluster_id=cluster_id,
        controller_id=controller_id,
        topics=topics,
        metadata_offset=image.last_offset,
    )


def describe_cluster_response(
    image: MetadataImage[Any],
    request: DescribeClusterRequest,
    *,
    cluster_id: str,
    controller_id: int,
    listener: str | None = None,
) -> DescribeClusterResponse:
    """Every registered broker (the fenced ones only when asked), at the `listener`'s
    address, or its first listener's."""
    brokers = []
    for broker_id in sorted(image.brokers):
        broker = image.brokers[broker_id]
        if broker.fenced and not request.include_fenced_brokers:
            continue
        address = _address(broker, listener)
        brokers.append(
            DescribeClusterBroker(
                broker_id=broker_id,
                host=address.host if address else "",
                port=address.port if address else -1,
                rack=broker.rack,
                is_fenced=broker.fenced,
                broker_epoch=broker.broker_epoch,
            )
        )
    return DescribeClusterResponse(
        cluster_id=cluster_id,
        controller_id=controller_id,
        brokers=brokers,
        metadata_offset=image.last_offset,
    )
