"""The librdkafka consumer of `python -m bench tls` (bench/README.md, "Issue 18"): when
its local queue is over queued.max.messages.kbytes, librdkafka holds its next Fetch
for fetch.queue.backoff.ms (1 s by default). With the bench's settings that pause is
10 ms: a queue kept small here (256 KiB, so that every 1 MiB Fetch overfills it, as a
busy CPU made the bench's 64 MiB one overfill) still reads 4 MiB from a real broker's
Kafka listener in well under a second; with the default it took a second a Fetch,
which made the bench's plaintext reads slower than its TLS ones."""

from __future__ import annotations

import asyncio
import time

import pytest
from cluster import Cluster
from confluent_kafka import OFFSET_BEGINNING
from confluent_kafka import Consumer
from confluent_kafka import Producer
from confluent_kafka import TopicPartition

from bench.tls import kafka_consumer_config
from client import AsyncAdmin
from client import NewTopic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

BATCH_BYTES = 1024 * 1024
MESSAGE = bytes(16 * 1024)
COUNT = 4 * BATCH_BYTES // len(MESSAGE)


def test_a_full_local_queue_pauses_fetching_briefly(cluster: Cluster) -> None:
    cluster.start_controller()
    broker = cluster.start_broker(1, kafka=True)

    async def create() -> None:
        async with AsyncAdmin(f"{broker.host}:{broker.port}") as admin:
            await admin.create_topics([NewTopic("bench-queue", 1, 1)], timeout_ms=20_000)

    asyncio.run(create())
    bootstrap = {"bootstrap.servers": broker.kafka_address}
    producer = Producer({**bootstrap, "linger.ms": 5, "batch.size": BATCH_BYTES})
    for _ in range(COUNT):
        producer.produce("bench-queue", MESSAGE, partition=0)
    assert producer.flush(30) == 0

    config = kafka_consumer_config(bootstrap, BATCH_BYTES)
    consumer = Consumer({**config, "queued.max.messages.kbytes": 256})
    try:
        consumer.assign([TopicPartition("bench-queue", 0, OFFSET_BEGINNING)])
        read = len(consumer.consume(1, timeout=10))  # fetching before the clock starts
        started = time.monotonic()
        while read < COUNT:
            # As the bench: it waits for all it asks for, never more than is left.
            got = consumer.consume(min(1000, COUNT - read), timeout=10)
            assert got, f"nothing more after {read} of {COUNT} messages"
            assert all(m.error() is None and m.value() == MESSAGE for m in got)
            read += len(got)
        elapsed = time.monotonic() - started
    finally:
        consumer.close()
    assert read == COUNT
    assert elapsed < 1.0, f"4 MiB took {elapsed:.2f} s: the consumer paused its fetches"
