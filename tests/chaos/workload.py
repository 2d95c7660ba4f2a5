"""The workload: producers and consumers on one topic, every operation in the history.

- Producers (processes 0..P-1) send unique values "p<process>-<n>", one at a time, to
  partitions picked round-robin, with the configured acks (all by default). A send is
  `ok` with its offset once acknowledged, `fail` when the client refused it before
  anything was sent, `info` otherwise (a timeout: it may be in the log). After an
  `info` the worker goes on as a new process (process + P + C), as in Jepsen.
- Consumers (processes P..P+C-1) assign every partition, seek to the beginning and
  poll. auto_offset_reset is 'none', so nothing moves a position behind our back: a
  LogTruncationError (KIP-320) is recorded as a `truncation` event per partition with
  the divergent offset the client reported, and the consumer resumes there; an
  OffsetOutOfRangeError is recorded as a `seek` back to the log start. A consumer that
  fails for good is replaced by a new one (a new process, which seeks first).
- Bounded: the producers stop after `max_sends` sends in all or `time_limit` seconds;
  then `catch_up()` lets each consumer poll until its position is exactly the end offset
  of every partition (recorded as `caught-up`), bounded too; then `final_read()` reads
  every partition from the start to its end offset with a fresh consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from dataclasses import dataclass
from typing import Any

from client import AsyncAdmin, AsyncConsumer, AsyncProducer, TopicPartition
from client.errors import (
    IllegalStateError,
    LogTruncationError,
    MinibrokerError,
    OffsetOutOfRangeError,
    TopicAlreadyExistsError,
)

from .history import FAIL, FINAL, INFO, INVOKE, OK, SEEK_BEGINNING, History, Record

log = logging.getLogger(__name__)


@dataclass
class WorkloadConfig:
    topic: str = "chaos"
    partitions: int = 3
    replication_factor: int = 3
    min_insync_replicas: int = 2
    unclean: bool = False
    acks: str = "all"
    # Issue 4's idempotent producer (enable_idempotence); without it a retry after a
    # lost answer may write a batch twice, which the checker then expects.
    idempotent: bool = False
    producers: int = 2
    consumers: int = 2
    max_sends: int = 100_000
    time_limit: float = 60.0
    send_interval: float = 0.005  # per producer, between sends
    request_timeout_ms: int = 5_000
    delivery_timeout_ms: int = 15_000
    poll_timeout_ms: int = 500
    catch_up_timeout: float = 60.0
    final_read_timeout: float = 60.0

    @property
    def stride(self) -> int:
        return self.producers + self.consumers


class Workload:
    def __init__(self, history: History, bootstrap: str, config: WorkloadConfig) -> None:
        self.history = history
        self.bootstrap = bootstrap
        self.config = config
        self.tps = [TopicPartition(config.topic, p) for p in range(config.partitions)]
        self._sends_left = config.max_sends
        self._stop_producers = asyncio.Event()
        self._stop_consumers = asyncio.Event()
        self._targets: dict[int, int] | None = None  # catch-up: partition -> end offset
        self._deadline = 0.0  # producers stop here (set by start())
        self._producer_tasks: list[asyncio.Task[None]] = []
        self._consumer_tasks: list[asyncio.Task[None]] = []
        self.caught_up: set[int] = set()
        self.errors: list[str] = []  # workers that died (client bugs), for the results

    # -------------------------------------------------------------- setup

    async def create_topic(self, timeout: float = 60.0) -> None:
        """Create the topic and wait until every partition has a leader."""
        cfg = self.config
        configs = {
            "min.insync.replicas": str(cfg.min_insync_replicas),
            "unclean.leader.election.enable": "true" if cfg.unclean else "false",
        }
        async with asyncio.timeout(timeout):
            async with AsyncAdmin(self.bootstrap, request_timeout_ms=10_000) as admin:
                with contextlib.suppress(TopicAlreadyExistsError):
                    await admin.create_topic(
                        cfg.topic, cfg.partitions, cfg.replication_factor, configs
                    )
                while True:
                    try:
                        (desc,) = await admin.describe_topics([cfg.topic], include_offsets=False)
                        if len(desc.partitions) == cfg.partitions and all(
                            p.leader >= 0 for p in desc.partitions
                        ):
                            return
                    except MinibrokerError as exc:
                        log.info("waiting for topic %s: %s", cfg.topic, exc)
                    await asyncio.sleep(0.2)

    # -------------------------------------------------------------- run

    def start(self) -> None:
        cfg = self.config
        loop = asyncio.get_running_loop()
        self._deadline = time.monotonic() + cfg.time_limit
        self._producer_tasks = [
            loop.create_task(self._producer(w), name=f"chaos-producer-{w}")
            for w in range(cfg.producers)
        ]
        self._consumer_tasks = [
            loop.create_task(self._consumer(w), name=f"chaos-consumer-{w}")
            for w in range(cfg.consumers)
        ]

    async def wait_producers(self) -> None:
        """Until every producer is done (max_sends or time_limit), bounded."""
        if not self._producer_tasks:
            return
        limit = self.config.time_limit + self.config.delivery_timeout_ms / 1000 + 30
        done, pending = await asyncio.wait(self._producer_tasks, timeout=limit)
        for t in pending:
            t.cancel()
        await asyncio.gather(*self._producer_tasks, return_exceptions=True)
        for t in done:
            if t.exception() is not None:
                raise t.exception()  # type: ignore[misc]

    async def catch_up(self, ends: dict[int, int]) -> set[int]:
        """Let the consumers poll until each position equals `ends` (bounded by
        catch_up_timeout); then stop them. Returns the processes that caught up."""
        self._targets = dict(ends)
        if self._consumer_tasks:
            await asyncio.wait(self._consumer_tasks, timeout=self.config.catch_up_timeout)
        await self.stop()
        return set(self.caught_up)

    async def stop(self) -> None:
        self._stop_producers.set()
        self._stop_consumers.set()
        tasks = self._producer_tasks + self._consumer_tasks
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.config.delivery_timeout_ms / 1000)
            for t in pending:
                t.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            for task, r in zip(tasks, results, strict=True):
                if isinstance(r, Exception):
                    log.error("%s died: %s", task.get_name(), _why(r), exc_info=r)
                    self.errors.append(f"{task.get_name()}: {_why(r)}")

    # -------------------------------------------------------------- producers

    def _producer_should_stop(self) -> bool:
        return (
            self._stop_producers.is_set()
            or self._sends_left <= 0
            or time.monotonic() >= self._deadline
        )

    async def _new_producer(self) -> AsyncProducer:
        cfg = self.config
        extra: dict[str, Any] = {}
        if cfg.idempotent:
            if not producer_supports_idempotence():
                raise IllegalStateError(
                    "AsyncProducer has no enable_idempotence yet (issue 4): run without "
                    "idempotent (the checker then expects retry duplicates)"
                )
            extra["enable_idempotence"] = True
        producer = AsyncProducer(
            self.bootstrap,
            client_id="chaos-producer",
            acks=cfg.acks,
            linger_ms=0,
            request_timeout_ms=cfg.request_timeout_ms,
            delivery_timeout_ms=cfg.delivery_timeout_ms,
            max_block_ms=cfg.request_timeout_ms,
            retry_backoff_ms=100,
            metadata_max_age_ms=5_000,
            **extra,
        )
        try:
            async with asyncio.timeout(cfg.request_timeout_ms / 1000 * 3):
                await producer.start()
        except BaseException:
            with contextlib.suppress(Exception):
                await producer.close(timeout_ms=0)
            raise
        return producer

    async def _producer(self, worker: int) -> None:
        cfg = self.config
        process = worker
        n = 0
        producer: AsyncProducer | None = None
        try:
            while not self._producer_should_stop():
                if producer is None:
                    try:
                        producer = await self._new_producer()
                    except (MinibrokerError, TimeoutError, OSError) as exc:
                        log.info("producer %d cannot start yet: %s", worker, exc)
                        await asyncio.sleep(0.5)
                        continue
                self._sends_left -= 1
                value = f"p{process}-{n}"
                partition = (worker + n) % cfg.partitions
                n += 1
                self.history.record(process, INVOKE, "send", value=value, partition=partition)
                try:
                    async with asyncio.timeout(cfg.request_timeout_ms / 1000 * 2):
                        future = await producer.send(cfg.topic, value.encode(), partition=partition)
                except Exception as exc:
                    # Not queued: nothing was sent.
                    self.history.record(process, FAIL, "send", value=value, error=_why(exc))
                    if not isinstance(exc, MinibrokerError | TimeoutError):
                        log.exception("producer %d: send() failed unexpectedly", worker)
                    if not isinstance(exc, MinibrokerError) or isinstance(exc, IllegalStateError):
                        await _close(producer)
                        producer = None
                    continue
                try:
                    async with asyncio.timeout(cfg.delivery_timeout_ms / 1000 + 10):
                        md = await future
                except Exception as exc:
                    self.history.record(process, INFO, "send", value=value, error=_why(exc))
                    process += cfg.stride
                    if not isinstance(exc, MinibrokerError | TimeoutError):
                        log.exception("producer %d: a send failed unexpectedly", worker)
                    if not isinstance(exc, MinibrokerError) or isinstance(exc, IllegalStateError):
                        await _close(producer)
                        producer = None
                    continue
                if md.offset < 0:  # acks=0: sent, never acknowledged
                    self.history.record(process, INFO, "send", value=value, error="acks=0")
                    process += cfg.stride
                else:
                    self.history.record(
                        process,
                        OK,
                        "send",
                        value=value,
                        partition=md.partition,
                        offset=md.offset,
                        extra={"leader_epoch": md.leader_epoch},
                    )
                if cfg.send_interval > 0:
                    await asyncio.sleep(cfg.send_interval)
        finally:
            if producer is not None:
                await _close(producer)

    # -------------------------------------------------------------- consumers

    async def _new_consumer(self, process: int) -> AsyncConsumer:
        cfg = self.config
        consumer = AsyncConsumer(
            self.bootstrap,
            client_id=f"chaos-consumer-{process}",
            auto_offset_reset="none",
            fetch_max_wait_ms=200,
            request_timeout_ms=cfg.request_timeout_ms,
            retry_backoff_ms=100,
        )
        try:
            async with asyncio.timeout(cfg.request_timeout_ms / 1000 * 3):
                await consumer.start()
        except BaseException:
            with contextlib.suppress(Exception):
                await consumer.close()
            raise
        consumer.assign(self.tps)
        consumer.seek_to_beginning(*self.tps)
        for tp in self.tps:
            self.history.record(process, OK, "seek", partition=tp.partition, offset=SEEK_BEGINNING)
        return consumer

    async def _consumer(self, worker: int) -> None:
        cfg = self.config
        process = cfg.producers + worker
        consumer: AsyncConsumer | None = None
        try:
            while not self._stop_consumers.is_set():
                if consumer is None:
                    try:
                        consumer = await self._new_consumer(process)
                    except (MinibrokerError, TimeoutError, OSError) as exc:
                        log.info("consumer %d cannot start yet: %s", worker, exc)
                        await asyncio.sleep(0.5)
                        continue
                if self._targets is not None and await self._caught_up(consumer):
                    self.history.record(process, OK, "caught-up", ends=dict(self._targets))
                    self.caught_up.add(process)
                    return
                replace = await self._poll_once(consumer, process)
                if replace:
                    await _close(consumer)
                    consumer = None
                    process += cfg.stride
        finally:
            if consumer is not None:
                await _close(consumer)

    async def _caught_up(self, consumer: AsyncConsumer) -> bool:
        assert self._targets is not None
        try:
            async with asyncio.timeout(self.config.request_timeout_ms / 1000):
                for tp in self.tps:
                    if await consumer.position(tp) != self._targets[tp.partition]:
                        return False
        except (MinibrokerError, TimeoutError):
            return False
        return True

    async def _poll_once(self, consumer: AsyncConsumer, process: int) -> bool:
        """One poll, recorded; True when the consumer must be replaced."""
        cfg = self.config
        self.history.record(process, INVOKE, "poll")
        try:
            async with asyncio.timeout(cfg.poll_timeout_ms / 1000 + cfg.request_timeout_ms / 1000):
                batch = await consumer.poll(timeout_ms=cfg.poll_timeout_ms)
        except LogTruncationError as exc:
            self.history.record(process, FAIL, "poll", error=_why(exc))
            for tp, where in exc.divergent_offsets.items():
                # An OffsetAndMetadata (offset, metadata, leader epoch), or a bare offset
                # from clients before KIP-320 validation.
                offset = getattr(where, "offset", where)
                epoch = getattr(where, "leader_epoch", None)
                self.history.record(
                    process,
                    INFO,
                    "truncation",
                    partition=tp.partition,
                    offset=int(offset),
                    extra={"position": exc.positions.get(tp), "leader_epoch": epoch},
                )
                consumer.seek(tp, where)
            return False
        except OffsetOutOfRangeError as exc:
            self.history.record(process, FAIL, "poll", error=_why(exc))
            for tp, offset in (exc.offsets or {}).items():
                consumer.seek_to_beginning(tp)
                self.history.record(
                    process,
                    OK,
                    "seek",
                    partition=tp.partition,
                    offset=SEEK_BEGINNING,
                    extra={"why": "offset out of range", "position": offset},
                )
            return not exc.offsets  # no partition named: start over with a new consumer
        except (MinibrokerError, TimeoutError) as exc:
            self.history.record(process, FAIL, "poll", error=_why(exc))
            if isinstance(exc, TimeoutError):
                return False
            return not exc.retriable
        except Exception as exc:  # a client bug: keep going with a new consumer
            log.exception("consumer %d: poll failed unexpectedly", process)
            self.history.record(process, FAIL, "poll", error=_why(exc))
            return True
        values: list[Record] = [
            (tp.partition, r.offset, (r.value or b"").decode(errors="replace"), r.leader_epoch)
            for tp, records in sorted(batch.items())
            for r in records
        ]
        self.history.record(process, OK, "poll", values=values)
        return False

    # -------------------------------------------------------------- end of run

    async def end_offsets(self, timeout: float = 60.0) -> dict[int, int] | None:
        """Every partition's high watermark, retried until `timeout` (None: failed)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            consumer = AsyncConsumer(
                self.bootstrap, request_timeout_ms=self.config.request_timeout_ms
            )
            try:
                async with asyncio.timeout(max(1.0, deadline - time.monotonic())):
                    await consumer.start()
                    ends = await consumer.end_offsets(self.tps)
                    return {tp.partition: off for tp, off in ends.items()}
            except (MinibrokerError, TimeoutError, OSError) as exc:
                log.info("end offsets not available yet: %s", exc)
            finally:
                await _close(consumer)
            await asyncio.sleep(1.0)
        return None

    async def final_read(self) -> dict[int, int] | None:
        """Read every partition from its start to its end offset; recorded as process
        `final`. Returns the end offsets (None: could not even get them)."""
        cfg = self.config
        ends = await self.end_offsets(cfg.final_read_timeout / 2)
        if ends is None:
            self.history.record(FINAL, INFO, "final-read-end", error="no end offsets")
            return None
        reached = {p: end == 0 for p, end in ends.items()}
        positions = dict.fromkeys(ends, 0)
        deadline = time.monotonic() + cfg.final_read_timeout
        consumer = AsyncConsumer(
            self.bootstrap,
            client_id="chaos-final-read",
            auto_offset_reset="none",
            request_timeout_ms=cfg.request_timeout_ms,
            fetch_max_wait_ms=200,
        )
        error: str | None = None
        try:
            async with asyncio.timeout(cfg.final_read_timeout):
                await consumer.start()
                consumer.assign(self.tps)
                consumer.seek_to_beginning(*self.tps)
                while not all(reached.values()) and time.monotonic() < deadline:
                    try:
                        batch = await consumer.poll(timeout_ms=500)
                    except MinibrokerError as exc:
                        log.info("final read: %s", exc)
                        error = _why(exc)
                        if not exc.retriable:
                            break
                        await asyncio.sleep(0.5)
                        continue
                    values: list[Record] = []
                    for tp, records in sorted(batch.items()):
                        for r in records:
                            if r.offset < ends[tp.partition]:
                                value = (r.value or b"").decode(errors="replace")
                                values.append((tp.partition, r.offset, value, r.leader_epoch))
                    if values:
                        self.history.record(FINAL, OK, "final-read", values=values)
                    for tp in self.tps:
                        positions[tp.partition] = await consumer.position(tp)
                        if positions[tp.partition] >= ends[tp.partition]:
                            reached[tp.partition] = True
        except (MinibrokerError, TimeoutError, OSError) as exc:
            error = _why(exc)
        finally:
            await _close(consumer)
        complete = all(reached.values())
        self.history.record(
            FINAL,
            OK if complete else INFO,
            "final-read-end",
            ends=ends,
            error=None if complete else (error or "did not reach the end offsets in time"),
            extra={"complete": reached, "positions": positions},
        )
        return ends


def producer_supports_idempotence() -> bool:
    return "enable_idempotence" in inspect.signature(AsyncProducer).parameters


def _why(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]


async def _close(client: AsyncProducer | AsyncConsumer) -> None:
    with contextlib.suppress(Exception):
        async with asyncio.timeout(10):
            if isinstance(client, AsyncProducer):
                await client.close(timeout_ms=0)
            else:
                await client.close()
