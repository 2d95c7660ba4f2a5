"""The workload: producers and consumers on one topic, every operation in the history.

- Producers: P workers, each one AsyncProducer shared by `in_flight` lanes, so each
  producer has that many records in flight (batched by linger_ms, up to the client's
  max_in_flight batches per partition with idempotence), with no pause between sends.
  A lane is a logical process (worker * in_flight + lane) that sends unique values
  "p<process>-<n>" to partitions picked round-robin per worker, with the configured
  acks, and awaits each acknowledgement before its next send. A send is `ok` with its
  offset once acknowledged, `fail` when the client refused it before anything was
  sent, `info` otherwise: an error after it was queued, or no acknowledgement within
  `ack_timeout` seconds (the record may or may not be in the log; request and delivery
  timeouts are short so that pauses and kills do make such sends). After an `info`
  the lane goes on as a new process (process + stride), as in Jepsen.
- Idempotence is explicit: every producer gets enable_idempotence exactly as
  configured (the client's own default is idempotent at acks=all), and records a
  `producer-start` event with what it was given and the producer id it got (-1: not
  idempotent, it never sent InitProducerId); each send names its producer session.
- Consumers (processes L..L+C-1, L = P * in_flight) assign every partition, seek to
  the beginning and poll. auto_offset_reset is 'none', so nothing moves a position
  behind our back: a LogTruncationError (KIP-320) is recorded as a `truncation` event
  per partition with the divergent offset the client reported, and the consumer
  resumes there; an OffsetOutOfRangeError is recorded as a `seek` back to the log
  start. A consumer that fails for good is replaced by a new one (a new process,
  which seeks first).
- Group mode (`group`): the consumers are instead members of one consumer group
  (`subscribe`, issue 16), starting from the group's committed offsets (earliest when
  none) and committing after every poll; each assignment is recorded as a `seek` of
  each partition assigned to the position it starts from, and every poll carries the
  member's generation and member id, so the checker can tell that no partition was
  delivered to two members of one generation. A truncation is recorded from the
  consumer's on_truncation callback (it resumes at the divergence itself). Catching up
  is per member, over the partitions it owns. Members are replaced (closed: commit,
  leave; a new process joins) every `member_churn_s`, staggered, until catch-up.
- Bounded: the producers stop after `max_sends` sends in all or `time_limit` seconds;
  then `catch_up()` lets each consumer poll until its position is exactly the end offset
  of every partition (recorded as `caught-up`), bounded too; then `final_read()` reads
  every partition from the start to its end offset with a fresh consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from typing import TypeVar

from client import AsyncAdmin
from client import AsyncConsumer
from client import AsyncProducer
from client import TopicPartition
from client.errors import IllegalStateError
from client.errors import LogTruncationError
from client.errors import MinibrokerError
from client.errors import OffsetOutOfRangeError
from client.errors import TopicAlreadyExistsError

from .backends import ChaosTls
from .history import FAIL
from .history import FINAL
from .history import INFO
from .history import INVOKE
from .history import OK
from .history import PRODUCER_START
from .history import SEEK_BEGINNING
from .history import History
from .history import Record
from .librdkafka_clients import LibrdkafkaConsumer
from .librdkafka_clients import LibrdkafkaProducer

C = TypeVar("C")
CLIENTS = ("minibroker", "confluent")
GROUP = "chaos-group"
# A member's session, and its rebalance timeout (max_poll_interval_ms): short, so that
# a generation still waiting for a member that left before a coordinator failover
# (the new coordinator loaded it from the log) forms again within the run.
MEMBER_SESSION_MS = 6_000  # the brokers' group.min.session.timeout.ms
MEMBER_REBALANCE_TIMEOUT_MS = 10_000

log = logging.getLogger(__name__)


@dataclass
class WorkloadConfig:
    topic: str = "chaos"
    partitions: int = 3
    replication_factor: int = 3
    min_insync_replicas: int = 2
    unclean: bool = False
    acks: str = "all"
    # Passed to every producer as enable_idempotence, both ways (needs acks=all when
    # on). Without it a retry after a lost answer may write a batch twice, which the
    # checker then expects where a retry can put it.
    idempotent: bool = True
    producers: int = 2
    in_flight: int = 16  # per producer: lanes, each with one send awaiting its ack
    consumers: int = 2
    max_sends: int = 100_000
    time_limit: float = 60.0
    send_interval: float = 0.0  # per lane, between sends
    linger_ms: int = 2
    # Short, so that pauses and kills leave sends indeterminate (info): a send waits
    # `ack_timeout` seconds for its acknowledgement, a request `request_timeout_ms`.
    # The producer keeps retrying a batch for `delivery_timeout_ms` (longer than any
    # fault: a batch that fails for good makes the idempotent producer bump its epoch).
    request_timeout_ms: int = 1_500
    delivery_timeout_ms: int = 20_000
    ack_timeout: float = 2.5
    poll_timeout_ms: int = 500
    catch_up_timeout: float = 60.0
    final_read_timeout: float = 60.0
    # Whose producers and consumers: minibroker's (native listeners) or librdkafka's
    # (confluent-kafka, through the brokers' Kafka listeners). The final reads and the
    # end offsets are minibroker's either way.
    client: str = "minibroker"
    # Consumers as members of one group (subscribe) instead of each reading everything;
    # each member leaves and a new one joins every `member_churn_s` (staggered), so the
    # group rebalances under the faults as well as because of them.
    group: bool = False
    member_churn_s: float = 6.0

    @property
    def producer_processes(self) -> int:
        return self.producers * self.in_flight

    @property
    def leader_only_acks(self) -> bool:
        """acks=1 with followers: a failover may drop acknowledged records."""
        return self.acks == "1" and self.replication_factor > 1

    @property
    def stride(self) -> int:
        return self.producer_processes + self.consumers

    def problems(self) -> list[str]:
        """What makes this workload uncheckable or impossible, as messages naming the
        option and what to do (empty: fine). The CLI refuses these."""
        out: list[str] = []
        if self.client not in CLIENTS:
            out.append(f"client {self.client!r}: use one of {', '.join(CLIENTS)}")
        if self.group and self.client != "minibroker":
            out.append(
                "--group with --client confluent: group mode drives minibroker's consumers "
                "only so far; use --client minibroker"
            )
        if self.acks not in ("all", "1", "0"):
            out.append(f"acks {self.acks!r}: use 0, 1 or all")
        if self.acks == "0":
            out.append(
                "--acks 0: no write is ever acknowledged, so loss cannot be checked and "
                "every run would end unknown; use --acks 1 or --acks all"
            )
        if self.idempotent and self.acks != "all":
            out.append(
                f"--idempotent with --acks {self.acks}: an idempotent producer needs acks=all "
                "(the producer refuses it and every run would end unknown); use --acks all, "
                "or --no-idempotent"
            )
        if not 1 <= self.min_insync_replicas <= self.replication_factor:
            out.append(
                f"--min-insync {self.min_insync_replicas} with --rf {self.replication_factor}: "
                "want 1 <= min.insync.replicas <= replication factor (else no acks=all write "
                "is ever acknowledged)"
            )
        for name, value in (
            ("--partitions", self.partitions),
            ("--rf", self.replication_factor),
            ("--producers", self.producers),
            ("--in-flight", self.in_flight),
            ("--max-sends", self.max_sends),
        ):
            if value < 1:
                out.append(f"{name} {value}: want at least 1")
        if self.consumers < 0:
            out.append(f"--consumers {self.consumers}: want 0 or more")
        if self.time_limit <= 0:
            out.append(f"--time-limit {self.time_limit:g}: want more than 0 seconds")
        if self.ack_timeout <= 0 or self.request_timeout_ms <= 0 or self.delivery_timeout_ms <= 0:
            out.append("--ack-timeout, --request-timeout-ms and --delivery-timeout-ms must be > 0")
        return out


class Workload:
    def __init__(
        self,
        history: History,
        bootstrap: str,
        config: WorkloadConfig,
        kafka_bootstrap: str = "",
        tls: ChaosTls | None = None,
    ) -> None:
        self.history = history
        self.bootstrap = bootstrap
        # The clients' options for a cluster on TLS ({} when plaintext).
        self.secure = tls.library() if tls is not None else {}
        self.secure_librdkafka = tls.librdkafka() if tls is not None else {}
        self.kafka_bootstrap = kafka_bootstrap  # the Kafka listeners (client "confluent")
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
        self._sessions = 0
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
            async with AsyncAdmin(
                self.bootstrap, request_timeout_ms=10_000, **self.secure
            ) as admin:
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
                            if cfg.group:
                                # The group's coordinator (and __consumer_offsets) up
                                # before the faults start, as on a cluster in service.
                                await admin.describe_group(GROUP)
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
        """Let the consumers poll until each position reaches `ends` (bounded by
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

    def new_session(self) -> int:
        self._sessions += 1
        return self._sessions - 1

    def _producer_should_stop(self) -> bool:
        return (
            self._stop_producers.is_set()
            or self._sends_left <= 0
            or time.monotonic() >= self._deadline
        )

    async def _new_producer(self) -> Any:
        cfg = self.config
        if cfg.client == "confluent":
            librdkafka = LibrdkafkaProducer(
                self.kafka_bootstrap,
                **{
                    **self.secure_librdkafka,
                    "client.id": "chaos-producer",
                    "acks": cfg.acks,
                    "enable.idempotence": cfg.idempotent,
                    "linger.ms": cfg.linger_ms,
                    "request.timeout.ms": cfg.request_timeout_ms,
                    "delivery.timeout.ms": cfg.delivery_timeout_ms,
                    "retry.backoff.ms": 100,
                    "topic.metadata.refresh.interval.ms": 5_000,
                },
            )
            return await self._started(librdkafka, librdkafka.close)
        producer = AsyncProducer(
            self.bootstrap,
            client_id="chaos-producer",
            acks=cfg.acks,
            # Explicit both ways: the client's default is idempotent at acks=all.
            enable_idempotence=cfg.idempotent,
            linger_ms=cfg.linger_ms,
            request_timeout_ms=cfg.request_timeout_ms,
            delivery_timeout_ms=cfg.delivery_timeout_ms,
            max_block_ms=cfg.request_timeout_ms,
            retry_backoff_ms=100,
            metadata_max_age_ms=5_000,
            **self.secure,
        )
        return await self._started(producer, lambda: producer.close(timeout_ms=0))

    async def _started(self, client: C, close: Callable[[], Awaitable[None]]) -> C:
        """`client` started within three request timeouts; closed (a failure to close
        ignored) when it does not start."""
        try:
            async with asyncio.timeout(self.config.request_timeout_ms / 1000 * 3):
                await client.start()
        except BaseException:
            with contextlib.suppress(Exception):
                await close()
            raise
        return client

    async def _producer(self, worker: int) -> None:
        """One producer shared by `in_flight` lanes (each a logical process)."""
        slot = _ProducerSlot(self, worker)
        lanes = [
            asyncio.get_running_loop().create_task(
                self._lane(slot, worker * self.config.in_flight + lane),
                name=f"chaos-producer-{worker}-lane-{lane}",
            )
            for lane in range(self.config.in_flight)
        ]
        try:
            results = await asyncio.gather(*lanes, return_exceptions=True)
        finally:
            for t in lanes:
                t.cancel()
            await asyncio.gather(*lanes, return_exceptions=True)
            await slot.close()
        for r in results:
            if isinstance(r, BaseException):
                raise r

    async def _lane(self, slot: _ProducerSlot, process: int) -> None:
        cfg = self.config
        n = 0
        while not self._producer_should_stop():
            producer = await slot.get()
            if producer is None:
                continue
            self._sends_left -= 1
            value = f"p{process}-{n}"
            n += 1
            partition = slot.next_partition()
            self.history.record(
                process,
                INVOKE,
                "send",
                value=value,
                partition=partition,
                extra={"session": slot.session},
            )
            try:
                async with asyncio.timeout(cfg.request_timeout_ms / 1000 * 2):
                    future = await producer.send(cfg.topic, value.encode(), partition=partition)
            except Exception as exc:
                # Not queued: nothing was sent.
                self.history.record(process, FAIL, "send", value=value, error=_why(exc))
                if not isinstance(exc, MinibrokerError | TimeoutError):
                    log.exception("producer %s: send() failed unexpectedly", process)
                if not isinstance(exc, MinibrokerError) or isinstance(exc, IllegalStateError):
                    await slot.discard(producer)
                continue
            # asyncio.wait does not cancel the record's future on timeout: the client
            # still owns it, and it may yet land (so the send is indeterminate).
            await asyncio.wait({future}, timeout=cfg.ack_timeout)
            if not future.done():
                future.add_done_callback(_retrieve)
                self.history.record(
                    process,
                    INFO,
                    "send",
                    value=value,
                    error=f"no acknowledgement within {cfg.ack_timeout:g}s",
                )
                process += cfg.stride
                continue
            exc = asyncio.CancelledError() if future.cancelled() else future.exception()
            if exc is not None:
                # Failed after it was queued: it may have been written (info).
                self.history.record(process, INFO, "send", value=value, error=_why(exc))
                if not isinstance(exc, MinibrokerError):
                    log.error("producer %s: a send failed unexpectedly: %s", process, _why(exc))
                process += cfg.stride
                if not isinstance(exc, MinibrokerError) or isinstance(exc, IllegalStateError):
                    await slot.discard(producer)
                continue
            md = future.result()
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

    # -------------------------------------------------------------- consumers

    async def _new_consumer(self, process: int) -> Any:
        cfg = self.config
        if cfg.group:
            return await self._new_member(process)
        if cfg.client == "confluent":
            librdkafka = LibrdkafkaConsumer(
                self.kafka_bootstrap,
                **{
                    **self.secure_librdkafka,
                    "client.id": f"chaos-consumer-{process}",
                    "fetch.wait.max.ms": 200,
                },
            )
            await self._started(librdkafka, librdkafka.close)
            return self._assigned_from_the_beginning(librdkafka, process)
        consumer = AsyncConsumer(
            self.bootstrap,
            client_id=f"chaos-consumer-{process}",
            auto_offset_reset="none",
            fetch_max_wait_ms=200,
            request_timeout_ms=cfg.request_timeout_ms,
            retry_backoff_ms=100,
            **self.secure,
        )
        await self._started(consumer, consumer.close)
        return self._assigned_from_the_beginning(consumer, process)

    async def _new_member(self, process: int) -> AsyncConsumer:
        cfg = self.config
        history = self.history

        def truncated(tp: TopicPartition, position: int, where: Any) -> None:
            history.record(
                process,
                INFO,
                "truncation",
                partition=tp.partition,
                offset=int(where.offset),
                extra={"position": position, "leader_epoch": where.leader_epoch},
            )

        consumer = AsyncConsumer(
            self.bootstrap,
            client_id=f"chaos-member-{process}",
            group_id=GROUP,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=200,
            request_timeout_ms=cfg.request_timeout_ms,
            retry_backoff_ms=100,
            session_timeout_ms=MEMBER_SESSION_MS,
            heartbeat_interval_ms=MEMBER_SESSION_MS // 6,
            max_poll_interval_ms=MEMBER_REBALANCE_TIMEOUT_MS,
            on_truncation=truncated,
            **self.secure,
        )
        await self._started(consumer, consumer.close)

        class RecordAssignments:
            async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
                # Where each partition starts (the committed offset, or the log start):
                # a seek for the checker, tagged with the generation.
                generation, member = _membership(consumer)
                for tp in sorted(assigned):
                    position = await consumer.position(tp)
                    history.record(
                        process,
                        OK,
                        "seek",
                        partition=tp.partition,
                        offset=position,
                        extra={"why": "assigned", "generation": generation, "member": member},
                    )

            def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
                generation, member = _membership(consumer)
                for tp in sorted(revoked):
                    history.record(
                        process,
                        OK,
                        "revoke",
                        partition=tp.partition,
                        extra={"generation": generation, "member": member},
                    )

        consumer.subscribe([cfg.topic], listener=RecordAssignments())
        return consumer

    def _assigned_from_the_beginning(self, consumer: Any, process: int) -> Any:
        consumer.assign(self.tps)
        consumer.seek_to_beginning(*self.tps)
        for tp in self.tps:
            self.history.record(process, OK, "seek", partition=tp.partition, offset=SEEK_BEGINNING)
        return consumer

    async def _consumer(self, worker: int) -> None:
        cfg = self.config
        process = cfg.producer_processes + worker
        consumer: AsyncConsumer | None = None
        churn = cfg.member_churn_s if cfg.group else 0.0
        # Staggered: the members do not all leave at once.
        replace_at = time.monotonic() + churn * (1 + worker / max(1, cfg.consumers))
        try:
            while not self._stop_consumers.is_set():
                churning = churn and self._targets is None and time.monotonic() >= replace_at
                if consumer is not None and churning:
                    await _close(consumer)  # commits, leaves: the group rebalances
                    consumer = None
                    process += cfg.stride
                    replace_at = time.monotonic() + churn
                if consumer is None:
                    try:
                        consumer = await self._new_consumer(process)
                    except (MinibrokerError, TimeoutError, OSError) as exc:
                        log.info("consumer %d cannot start yet: %s", worker, exc)
                        await asyncio.sleep(0.5)
                        continue
                if self._targets is not None and await self._caught_up(consumer):
                    ends = {
                        tp.partition: self._targets[tp.partition] for tp in self._mine(consumer)
                    }
                    self.history.record(process, OK, "caught-up", ends=ends)
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

    def _mine(self, consumer: AsyncConsumer) -> list[TopicPartition]:
        """The partitions a consumer answers for: all, or in a group what it owns."""
        return sorted(consumer.assignment()) if self.config.group else self.tps

    async def _caught_up(self, consumer: AsyncConsumer) -> bool:
        assert self._targets is not None
        if self.config.group:
            group = consumer._group
            if group is None or group.needs_rejoin or not group.owned:
                return False  # a member between generations has caught up with nothing
        try:
            async with asyncio.timeout(self.config.request_timeout_ms / 1000):
                for tp in self._mine(consumer):
                    # Past the target is caught up too: a send acknowledged late (a
                    # retry in flight when the ends were read) moves the end on.
                    if await consumer.position(tp) < self._targets[tp.partition]:
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
        if not cfg.group:
            self.history.record(process, OK, "poll", values=values)
            return False
        generation, member = _membership(consumer)
        self.history.record(
            process, OK, "poll", values=values, extra={"generation": generation, "member": member}
        )
        if values:
            try:
                await consumer.commit()
            except MinibrokerError as exc:  # refused (a rebalance) or unreachable
                log.info("member %d: commit failed: %s", process, exc)
        return False

    # -------------------------------------------------------------- end of run

    async def end_offsets(self, timeout: float = 60.0) -> dict[int, int] | None:
        """Every partition's high watermark, retried until `timeout` (None: failed)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            consumer = AsyncConsumer(
                self.bootstrap, request_timeout_ms=self.config.request_timeout_ms, **self.secure
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
        # A high watermark never moves back, so ends below the catch-up targets (read
        # earlier from the leaders) were answered by a broker that has not yet learned
        # it lost a leadership (its metadata stale after a partition healed): asked
        # again until they are not, within the bound; past it, read to what is known
        # and let the checker judge.
        floor = self._targets or {}
        settle_by = time.monotonic() + cfg.final_read_timeout / 2
        while (
            ends is not None
            and any(end < floor.get(p, 0) for p, end in ends.items())
            and time.monotonic() < settle_by
        ):
            log.info("final read: end offsets %s below the caught-up ones %s; again", ends, floor)
            await asyncio.sleep(1.0)
            ends = await self.end_offsets(max(1.0, settle_by - time.monotonic()))
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
            **self.secure,
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
                        values: list[Record] = []
                        for tp, records in sorted(batch.items()):
                            for r in records:
                                if r.offset < ends[tp.partition]:
                                    value = (r.value or b"").decode(errors="replace")
                                    values.append((tp.partition, r.offset, value, r.leader_epoch))
                        if values:
                            self.history.record(FINAL, OK, "final-read", values=values)
                        # position() may need a ListOffsets (after seek_to_beginning),
                        # which a leader change in progress answers with a retriable
                        # error: retried like a poll, not the end of the final read.
                        for tp in self.tps:
                            positions[tp.partition] = await consumer.position(tp)
                            if positions[tp.partition] >= ends[tp.partition]:
                                reached[tp.partition] = True
                    except MinibrokerError as exc:
                        log.info("final read: %s", exc)
                        error = _why(exc)
                        if not exc.retriable:
                            break
                        await asyncio.sleep(0.5)
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


class _ProducerSlot:
    """A worker's producer, shared by its lanes: made on first use and again after it
    failed for good, each time a new session recorded as a producer-start event."""

    def __init__(self, workload: Workload, worker: int) -> None:
        self.workload = workload
        self.worker = worker
        self.producer: AsyncProducer | None = None
        self.session = -1
        self._sent = 0
        self._lock = asyncio.Lock()

    def next_partition(self) -> int:
        self._sent += 1
        return (self.worker + self._sent) % self.workload.config.partitions

    async def get(self) -> AsyncProducer | None:
        """The producer (None: it cannot start yet; a pause was taken)."""
        if self.producer is not None:
            return self.producer
        async with self._lock:
            if self.producer is not None:
                return self.producer
            try:
                producer = await self.workload._new_producer()
            except (MinibrokerError, TimeoutError, OSError) as exc:
                log.info("producer %d cannot start yet: %s", self.worker, exc)
                await asyncio.sleep(0.5)
                return None
            self.session = self.workload.new_session()
            self.producer = producer
            cfg = self.workload.config
            self.workload.history.record(
                f"producer-{self.worker}",
                OK,
                PRODUCER_START,
                extra={
                    "session": self.session,
                    "enable_idempotence": cfg.idempotent,
                    "producer_id": producer.producer_id,
                    "producer_epoch": producer.producer_epoch,
                    "acks": cfg.acks,
                },
            )
            return producer

    async def discard(self, producer: AsyncProducer) -> None:
        """Drop a producer that failed for good (once, whichever lane saw it)."""
        if self.producer is producer:
            self.producer = None
            await _close(producer)

    async def close(self) -> None:
        if self.producer is not None:
            producer, self.producer = self.producer, None
            await _close(producer)


def _membership(consumer: AsyncConsumer) -> tuple[int, str]:
    """(generation, member id) of a group member now."""
    group = consumer._group
    return (group.generation, group.member_id) if group is not None else (-1, "")


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Consume an abandoned send's outcome (asyncio would log it as never retrieved)."""
    if not future.cancelled():
        future.exception()


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
