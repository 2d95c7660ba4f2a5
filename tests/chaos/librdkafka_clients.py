"""confluent-kafka (librdkafka 2.16) behind the small part of AsyncProducer's and
AsyncConsumer's interfaces the chaos workload uses, so one workload, one history and one
checker judge runs with either client (`--client confluent`: librdkafka through the
brokers' Kafka listeners).

What each librdkafka outcome means for the history, as the workload records it:
- a delivery report without error: acknowledged (ok), with its offset;
- a delivery report with an error, or none before the ack timeout: indeterminate
  (info), since librdkafka may have written the batch before it gave up;
- produce() refused (queue full): not sent at all (fail).
Its consumer's errors are reported as failed polls (by the poll after the records that
came with them); a truncation it detects (KIP-320, "Partition log truncation detected")
replaces the consumer, which then reads from the beginning as a new process.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterable
from typing import Any
from typing import NamedTuple

from confluent_kafka import OFFSET_BEGINNING
from confluent_kafka import Consumer
from confluent_kafka import KafkaError
from confluent_kafka import KafkaException
from confluent_kafka import Producer
from confluent_kafka import TopicPartition as ConfluentTopicPartition

from client.errors import IllegalStateError
from client.errors import KafkaTimeoutError
from client.errors import MinibrokerError
from client.types import TopicPartition

POLL_INTERVAL_S = 0.05
STATS_INTERVAL_MS = 100
ID_TIMEOUT_S = 10.0
MAX_MESSAGES_PER_POLL = 10_000


class LibrdkafkaError(MinibrokerError):
    """A librdkafka error (the text is librdkafka's)."""

    retriable = True


class LibrdkafkaFatalError(IllegalStateError):
    """A fatal librdkafka error, or a partition it stopped on (a detected truncation
    under auto.offset.reset=error): the producer or consumer must be replaced."""

    retriable = False


def _error(error: KafkaError) -> MinibrokerError:
    stops = error.fatal() or error.code() == KafkaError._AUTO_OFFSET_RESET
    cls = LibrdkafkaFatalError if stops else LibrdkafkaError
    return cls(f"librdkafka: {error.str()} ({error.name()})")


async def _reach_a_broker(client: Producer | Consumer) -> None:
    """Metadata from any broker, or a LibrdkafkaError (the workload retries later)."""
    try:
        await asyncio.to_thread(client.list_topics, timeout=5)
    except KafkaException as exc:
        raise _error(exc.args[0]) from None


class Delivered(NamedTuple):
    partition: int
    offset: int
    leader_epoch: int | None


class LibrdkafkaProducer:
    def __init__(self, bootstrap: str, **config: Any) -> None:
        # librdkafka's statistics are where its idempotent producer id shows ("eos").
        self._config = {
            "bootstrap.servers": bootstrap,
            "statistics.interval.ms": STATS_INTERVAL_MS,
            "stats_cb": self._on_stats,
            **config,
        }
        self._producer: Producer | None = None
        self._closed = threading.Event()
        self._poller: threading.Thread | None = None
        self.producer_id = -1  # as the checker reads it: -1, not idempotent
        self.producer_epoch = -1
        self._got_id = threading.Event()

    def _on_stats(self, text: str) -> None:
        eos = json.loads(text).get("eos") or {}
        if eos.get("idemp_state") == "Assigned" and eos.get("producer_id", -1) >= 0:
            self.producer_id, self.producer_epoch = eos["producer_id"], eos["producer_epoch"]
            self._got_id.set()

    async def start(self) -> None:
        self._producer = Producer(self._config)
        await _reach_a_broker(self._producer)
        self._poller = threading.Thread(target=self._serve_reports, daemon=True)
        self._poller.start()
        # The history records the producer id it really got (the checker judges
        # duplicates by it): wait for librdkafka's InitProducerId to be done.
        idempotent = self._config.get("enable.idempotence")
        if idempotent and not await asyncio.to_thread(self._got_id.wait, ID_TIMEOUT_S):
            await self.close()
            raise LibrdkafkaError("librdkafka got no producer id within the timeout")

    def _serve_reports(self) -> None:
        assert self._producer is not None
        while not self._closed.is_set():
            self._producer.poll(POLL_INTERVAL_S)  # delivery reports run here

    async def send(self, topic: str, value: bytes, *, partition: int) -> asyncio.Future[Delivered]:
        if self._producer is None or self._closed.is_set():
            raise IllegalStateError("the librdkafka producer is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Delivered] = loop.create_future()

        def report(error: KafkaError | None, message: Any) -> None:
            loop.call_soon_threadsafe(_settle, future, error, message)

        try:
            self._producer.produce(topic, value, partition=partition, on_delivery=report)
        except BufferError:
            raise KafkaTimeoutError("librdkafka's queue is full") from None
        except KafkaException as exc:
            raise _error(exc.args[0]) from None
        return future

    async def close(self, timeout_ms: int | None = 0) -> None:
        self._closed.set()
        if self._poller is not None:
            await asyncio.to_thread(self._poller.join, 5)
        if self._producer is not None:
            # Outstanding reports still fire (their futures may already be abandoned).
            await asyncio.to_thread(self._producer.flush, (timeout_ms or 0) / 1000)


def _settle(future: asyncio.Future[Delivered], error: KafkaError | None, message: Any) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(_error(error))
    else:
        future.set_result(Delivered(message.partition(), message.offset(), message.leader_epoch()))


class Received(NamedTuple):
    offset: int
    value: bytes | None
    leader_epoch: int | None


class LibrdkafkaConsumer:
    def __init__(self, bootstrap: str, **config: Any) -> None:
        self._config = {
            "bootstrap.servers": bootstrap,
            "group.id": "chaos-librdkafka",  # offsets are never committed
            "enable.auto.commit": False,
            "auto.offset.reset": "error",  # librdkafka's "none": say what happened
            **config,
        }
        self._consumer: Consumer | None = None
        self._pending: MinibrokerError | None = None  # raised by the next poll

    async def start(self) -> None:
        self._consumer = Consumer(self._config)
        await _reach_a_broker(self._consumer)

    def assign(self, tps: Iterable[TopicPartition]) -> None:
        assert self._consumer is not None
        self._consumer.assign(
            [ConfluentTopicPartition(tp.topic, tp.partition, OFFSET_BEGINNING) for tp in tps]
        )

    def seek_to_beginning(self, *tps: TopicPartition) -> None:
        """Assigned at the beginning already (assign)."""

    async def poll(self, timeout_ms: int) -> dict[TopicPartition, list[Received]]:
        """The records of one consume(); an error event among them is raised by the next
        poll (the records librdkafka returned with it are this poll's: its position has
        moved past them, so they must reach the history)."""
        assert self._consumer is not None
        if self._pending is not None:
            error, self._pending = self._pending, None
            raise error
        messages = await asyncio.to_thread(
            self._consumer.consume, MAX_MESSAGES_PER_POLL, timeout_ms / 1000
        )
        out: dict[TopicPartition, list[Received]] = {}
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF and self._pending is None:
                    self._pending = _error(error)
                continue
            tp = TopicPartition(message.topic(), message.partition())
            out.setdefault(tp, []).append(
                Received(message.offset(), message.value(), message.leader_epoch())
            )
        return out

    async def position(self, tp: TopicPartition) -> int:
        assert self._consumer is not None
        (where,) = self._consumer.position([ConfluentTopicPartition(tp.topic, tp.partition)])
        return int(where.offset)

    async def close(self) -> None:
        if self._consumer is not None:
            await asyncio.to_thread(self._consumer.close)
