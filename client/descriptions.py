"""What the admin client and the health verdict describe: topics, partitions,
brokers, the cluster, a replica's log; built from Metadata and DescribeCluster answers.
Immutable tuples with no I/O, so client/admin.py and client/health.py both use them
without importing each other."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from typing import NamedTuple

from client.errors import BrokerResponseError
from client.errors import error_for
from protocol.errors import ErrorCode
from protocol.messages import DescribeClusterResponse
from protocol.messages import MetadataResponse


class NewTopic(NamedTuple):
    """-1 partitions / replication factor: the controller's defaults."""

    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    configs: Mapping[str, str] = {}


class CreatedTopic(NamedTuple):
    """What the controller created (defaults filled in)."""

    name: str
    topic_id: str
    num_partitions: int
    replication_factor: int


class LeaderElection(NamedTuple):
    """One partition's ElectLeaders outcome: its leader and leader epoch, and the
    error when none was elected (ElectionNotNeeded: it has a leader, shown)."""

    leader: int
    leader_epoch: int
    error: BrokerResponseError | None = None


class PartitionDescription(NamedTuple):
    """One partition: leader, leader epoch, replicas, ISR and (optionally) offsets."""

    partition: int
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline_replicas: tuple[int, ...] = ()
    log_start_offset: int = -1  # -1: not asked, or the leader could not answer
    high_watermark: int = -1
    error: str | None = None  # why the offsets are missing
    # The leader did not answer (process dead or stuck) while the metadata still names
    # it: the controller has not fenced it yet (its session has not expired).
    leader_unreachable: bool = False


class TopicDescription(NamedTuple):
    """One topic and its partitions."""

    name: str
    topic_id: str
    partitions: list[PartitionDescription]

    @property
    def replication_factor(self) -> int:
        """Number of replicas of the first partition."""
        return max((len(p.replicas) for p in self.partitions), default=0)


class BrokerDescription(NamedTuple):
    """One live broker: id, address, rack."""

    node_id: int
    host: str
    port: int
    rack: str | None = None
    is_fenced: bool = False
    broker_epoch: int = -1


class ClusterDescription(NamedTuple):
    """Cluster id, controller id and live brokers."""

    cluster_id: str
    controller_id: int
    brokers: list[BrokerDescription]
    metadata_offset: int = -1


class EpochEntry(NamedTuple):
    """One leader-epoch cache entry: `epoch` started at `start_offset`."""

    epoch: int
    start_offset: int


class ReplicaBatch(NamedTuple):
    """One record batch header as it is on the replica's disk."""

    base_offset: int
    last_offset: int
    leader_epoch: int
    crc: int
    size: int


class ReplicaLogDescription(NamedTuple):
    """One broker's replica of one partition, as that broker sees it.
    `broker_id` is -1 when the broker was addressed by HOST:PORT."""

    broker_id: int
    host: str
    port: int
    topic: str
    partition: int
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    leader_id: int
    leader_epoch: int
    partition_epoch: int
    isr: tuple[int, ...]
    epoch_entries: tuple[EpochEntry, ...]
    batches: tuple[ReplicaBatch, ...]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly dict of this description."""
        return {
            "broker_id": self.broker_id,
            "address": f"{self.host}:{self.port}",
            "topic": self.topic,
            "partition": self.partition,
            "log_start_offset": self.log_start_offset,
            "log_end_offset": self.log_end_offset,
            "high_watermark": self.high_watermark,
            "leader_id": self.leader_id,
            "leader_epoch": self.leader_epoch,
            "partition_epoch": self.partition_epoch,
            "isr": list(self.isr),
            "epoch_entries": [e._asdict() for e in self.epoch_entries],
            "batches": [b._asdict() for b in self.batches],
        }


def _cluster_description(response: DescribeClusterResponse) -> ClusterDescription:
    if response.error_code != ErrorCode.NONE:
        raise error_for(response.error_code, response.error_message)
    return ClusterDescription(
        response.cluster_id,
        response.controller_id,
        sorted(
            (
                BrokerDescription(b.broker_id, b.host, b.port, b.rack, b.is_fenced, b.broker_epoch)
                for b in response.brokers
            ),
            key=lambda b: b.node_id,
        ),
        response.metadata_offset,
    )


def topics_from_metadata(response: MetadataResponse) -> list[TopicDescription]:
    """Topic descriptions straight from one Metadata answer (no cache, no offsets);
    topics answered with an error are left out."""
    out = []
    for t in sorted(response.topics, key=lambda t: t.name):
        if t.error_code != ErrorCode.NONE:
            continue
        parts = [
            PartitionDescription(
                partition=p.partition_index,
                leader=p.leader_id,
                leader_epoch=p.leader_epoch,
                replicas=tuple(p.replica_nodes),
                isr=tuple(p.isr_nodes),
                offline_replicas=tuple(p.offline_replicas),
            )
            for p in sorted(t.partitions, key=lambda p: p.partition_index)
        ]
        out.append(TopicDescription(t.name, t.topic_id, parts))
    return out
