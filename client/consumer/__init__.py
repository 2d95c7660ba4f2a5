"""The consumer, split by job as aiokafka splits it: async_consumer.py (AsyncConsumer,
the facade: configuration, lifecycle, poll), subscription_state.py (assignment,
positions, pause), fetcher.py (Fetch and buffered records), truncation.py (KIP-320
validation), offset_lookup.py (ListOffsets), committed_offsets.py (the group
coordinator) and partition_state.py. The rules it follows are described in
async_consumer.py."""

from __future__ import annotations

from client.consumer.async_consumer import AsyncConsumer
from client.consumer.partition_state import _PartitionState

__all__ = ["AsyncConsumer", "_PartitionState"]
