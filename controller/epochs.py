"""The epoch rules, in one place (DESIGN.md section 3). Every record the controller
writes takes its epochs from here:

- broker epoch: the metadata log offset of the broker's RegisterBrokerRecord, so each
  registration (a new incarnation) gets a larger one, and a broker whose metadata
  offset reached its epoch has seen its own registration;
- leader epoch: bumped by every leader change;
- partition epoch: bumped by every change of leader, ISR or leader recovery state;
- a new partition starts at leader epoch 0 and partition epoch 0.
"""

from __future__ import annotations

from collections.abc import Mapping

from protocol.metadata_records import LEADER_RECOVERED
from protocol.metadata_records import PartitionRecord
from runtime.metadata_image import BrokerInfo


def broker_epoch_at(register_offset: int) -> int:
    """The epoch of a broker whose RegisterBrokerRecord is at `register_offset`."""
    return register_offset


def stale_broker_epoch(
    brokers: Mapping[int, BrokerInfo], broker_id: int, broker_epoch: int
) -> str | None:
    """Why a request from `broker_id` at `broker_epoch` is refused with
    STALE_BROKER_EPOCH (an incarnation that is gone, or never registered), or None."""
    broker = brokers.get(broker_id)
    if broker is not None and broker.broker_epoch == broker_epoch:
        return None
    known = None if broker is None else broker.broker_epoch
    return f"broker {broker_id} epoch {broker_epoch} is not the registered epoch {known}"


def new_partition(
    topic_id: str, partition_id: int, replicas: list[int], isr: list[int], leader: int
) -> PartitionRecord:
    """A partition's first state."""
    return PartitionRecord(
        topic_id=topic_id,
        partition_id=partition_id,
        replicas=replicas,
        isr=isr,
        leader=leader,
        leader_epoch=0,
        partition_epoch=0,
        leader_recovery_state=LEADER_RECOVERED,
    )


def change_partition(
    partition: PartitionRecord,
    *,
    leader: int | None = None,
    isr: list[int] | None = None,
    leader_recovery_state: int | None = None,
) -> PartitionRecord | None:
    """The partition with the given fields changed and its epochs bumped, or None."""
    new_leader = partition.leader if leader is None else leader
    new_isr = list(partition.isr) if isr is None else list(isr)
    new_recovery = (
        partition.leader_recovery_state if leader_recovery_state is None else leader_recovery_state
    )
    leader_changed = new_leader != partition.leader
    other_changed = new_isr != partition.isr or new_recovery != partition.leader_recovery_state
    if not leader_changed and not other_changed:
        return None
    return PartitionRecord(
        topic_id=partition.topic_id,
        partition_id=partition.partition_id,
        replicas=list(partition.replicas),
        isr=new_isr,
        leader=new_leader,
        leader_epoch=partition.leader_epoch + (1 if leader_changed else 0),
        partition_epoch=partition.partition_epoch + 1,
        leader_recovery_state=new_recovery,
    )
