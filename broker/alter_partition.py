"""Sends the leader's ISR changes to the controller (AlterPartition, KIP-903), in the
manner of Kafka's AlterPartitionManager.

- At most one change per partition is queued or in flight (the partition's
  `pending_isr`); the caller submits a new one only when none is pending.
- One request at a time carries every queued change (batched by topic); changes
  submitted while it is in flight go in the next one.
- A network failure or timeout re-queues the request's changes after a bounded
  exponential backoff with jitter (the same proposals: the controller's partition
  epoch check makes a retry of a committed change fail harmlessly with
  INVALID_UPDATE_VERSION, and the metadata log then brings the committed state).
- A change whose `is_current()` turned False while queued (the metadata log
  superseded it, leadership moved) is dropped without being sent.
- Each answer (or a whole-request error such as STALE_BROKER_EPOCH) is handed to the
  change's `on_result(error, result)`; the caller decides what the codes mean.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field

from broker.answers import MatchedAnswers
from protocol.errors import ErrorCode
from protocol.messages import AlterPartitionPartition
from protocol.messages import AlterPartitionPartitionResult
from protocol.messages import AlterPartitionRequest
from protocol.messages import AlterPartitionResponse
from protocol.messages import AlterPartitionTopic
from protocol.messages import BrokerState
from runtime.peer_rpc import RpcError
from runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
SendAlterPartition = Callable[[AlterPartitionRequest], Awaitable[AlterPartitionResponse]]
ResultCallback = Callable[[ErrorCode, AlterPartitionPartitionResult | None], None]

INITIAL_BACKOFF_S = 0.1
MAX_BACKOFF_S = 5.0


@dataclass
class IsrChange:
    tp: TopicPartition
    leader_epoch: int
    partition_epoch: int
    new_isr_with_epochs: list[BrokerState]
    leader_recovery_state: int
    on_result: ResultCallback
    is_current: Callable[[], bool] = field(default=lambda: True)


class AlterPartitionManager:
    def __init__(
        self,
        *,
        node_id: int,
        broker_epoch: Callable[[], int],
        send: SendAlterPartition,
        max_backoff_s: float = MAX_BACKOFF_S,
    ) -> None:
        self.node_id = node_id
        self._broker_epoch = broker_epoch
        self._send = send
        self._max_backoff_s = max_backoff_s
        self._queued: dict[TopicPartition, IsrChange] = {}
        self._in_flight: dict[TopicPartition, IsrChange] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failures = 0
        self._closed = False

    def __len__(self) -> int:
        return len(self._queued) + len(self._in_flight)

    def submit(self, change: IsrChange) -> bool:
        """Queue `change`; False when one is already queued or in flight for its
        partition (one at a time, as the partition's pending state says)."""
        if self._closed or change.tp in self._queued or change.tp in self._in_flight:
            return False
        self._queued[change.tp] = change
        self._wake.set()
        return True

    def start(self) -> None:
        if self._task is None and not self._closed:
            self._task = asyncio.create_task(self._run(), name="alter-partition")

    async def close(self) -> None:
        self._closed = True
        await cancel_and_wait([self._task])
        self._queued.clear()
        self._in_flight.clear()

    # ------------------------------------------------------------------ the sender

    async def _run(self) -> None:
        while not self._closed:
            if not self._queued:
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = {tp: c for tp, c in self._queued.items() if c.is_current()}
            self._queued.clear()
            if not batch:
                continue
            self._in_flight = batch
            ok = await self._send_batch(batch)
            self._in_flight = {}
            if ok:
                self._failures = 0
                continue
            # Re-queue (newer submissions for the same partition cannot exist: one at
            # a time), then back off before the next attempt.
            for tp, change in batch.items():
                self._queued.setdefault(tp, change)
            self._failures += 1
            backoff = min(self._max_backoff_s, INITIAL_BACKOFF_S * 2 ** (self._failures - 1))
            await asyncio.sleep(backoff * random.uniform(0.8, 1.2))

    async def _send_batch(self, batch: dict[TopicPartition, IsrChange]) -> bool:
        topics: dict[str, list[AlterPartitionPartition]] = {}
        for (topic, index), change in batch.items():
            topics.setdefault(topic, []).append(
                AlterPartitionPartition(
                    partition_index=index,
                    leader_epoch=change.leader_epoch,
                    new_isr_with_epochs=change.new_isr_with_epochs,
                    leader_recovery_state=change.leader_recovery_state,
                    partition_epoch=change.partition_epoch,
                )
            )
        request = AlterPartitionRequest(
            broker_id=self.node_id,
            broker_epoch=self._broker_epoch(),
            topics=[AlterPartitionTopic(topic_name=t, partitions=ps) for t, ps in topics.items()],
        )
        try:
            response = await self._send(request)
        except RpcError as exc:
            log.warning(
                "AlterPartition for %d partition(s) failed: %s; will retry", len(batch), exc
            )
            return False
        top = ErrorCode.of(response.error_code)
        if top != ErrorCode.NONE:
            log.info("AlterPartition refused as a whole: %s", top.name)
            for change in batch.values():
                self._deliver(change, top, None)
            return True
        matched = MatchedAnswers(
            batch,
            (((t.topic_name, r.partition_index), r) for t in response.topics for r in t.partitions),
        )
        for change, result in matched:
            self._deliver(change, ErrorCode.of(result.error_code), result)
        for tp, change in matched.unanswered:
            log.warning("AlterPartition answer left out %s-%d", *tp)
            self._deliver(change, ErrorCode.UNKNOWN_SERVER_ERROR, None)
        return True

    def _deliver(
        self, change: IsrChange, error: ErrorCode, result: AlterPartitionPartitionResult | None
    ) -> None:
        try:
            change.on_result(error, result)
        except Exception:
            log.exception("AlterPartition result handler for %s-%d failed", *change.tp)
