"""The producer, split by job as aiokafka splits it: async_producer.py (AsyncProducer,
the facade: configuration, lifecycle, flush and close), accumulator.py (records into
per-partition batches), sender.py (batches to the leaders, retries, completion),
idempotence.py (producer id, epoch, sequences, the KIP-360 bump) and batches.py.
The protocol it follows is described in async_producer.py."""

from __future__ import annotations

from client.producer.async_producer import AsyncProducer
from client.producer.batches import ProducerBatch
from client.producer.batches import parse_acks

__all__ = ["AsyncProducer", "ProducerBatch", "parse_acks"]
