"""The delayed operations of the data path (a long-poll Fetch waiting for bytes, an
acks=all Produce waiting for the high watermark), the Fetch size bound, the
replication clocks, and the AlterPartition refusals after which a leader waits for
the metadata log."""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable

from broker.config import BrokerConfig
from broker.delayed import DelayedOperation
from broker.partition import Partition
from broker.partition import Role
from protocol.errors import ErrorCode
from protocol.messages import FetchRequest

log = logging.getLogger(__name__)


def now_ms() -> int:
    return int(time.time() * 1000)


def mono_ms() -> int:
    """Clock of the replication timers (lag, ISR retries): never jumps."""
    return int(time.monotonic() * 1000)


# AlterPartition refusals after which the leader waits for the metadata log (its view
# of the partition or of itself is stale); the pending change keeps counting in the
# high watermark meanwhile, as Kafka keeps it in flight.
_AWAIT_METADATA = frozenset(
    {
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.INVALID_UPDATE_VERSION,
        ErrorCode.STALE_BROKER_EPOCH,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.NEW_LEADER_ELECTED,
    }
)


class _FetchWatch:
    __slots__ = ("appended_at_start", "epoch", "fetch_offset", "partition")

    def __init__(self, partition: Partition, fetch_offset: int) -> None:
        self.partition = partition
        self.fetch_offset = fetch_offset
        self.epoch = partition.leader_epoch
        self.appended_at_start = partition.appended_bytes


class DelayedFetch(DelayedOperation):
    """Completes when about `min_bytes` are readable, or a watched partition changed
    role or epoch or was truncated (the answer then carries the error).

    Bytes are estimated from what was appended since the fetch started, so no read
    happens until the answer is built; the estimate can only make a fetch answer
    early, never late."""

    def __init__(
        self, watches: list[_FetchWatch], *, min_bytes: int, have_bytes: int, to_leo: bool
    ) -> None:
        super().__init__(w.partition.tp for w in watches)
        self.watches = watches
        self.min_bytes = min_bytes
        self.have_bytes = have_bytes
        self.to_leo = to_leo
        # Per partition, the bytes it counts toward min_bytes, and their sum: a notify
        # re-checks one partition, not all (a follower's fetch watches thousands).
        self._by_tp = {w.partition.tp: w for w in watches}
        self._counted: dict[Hashable, int] = {}
        self._total = have_bytes

    def _check(self, w: _FetchWatch) -> int | None:
        """None: the partition changed so the fetch must answer now; else the bytes it
        has readable for this fetch (an estimate, never late)."""
        p = w.partition
        if p.role is not Role.LEADER or p.leader_epoch != w.epoch:
            return None
        end = p.log_end_offset if self.to_leo else p.high_watermark
        if end < w.fetch_offset or p.log_start_offset > w.fetch_offset:
            return None  # out of range now: answer with the error
        return max(1, p.appended_bytes - w.appended_at_start) if end > w.fetch_offset else 0

    def try_complete(self) -> bool:
        self._counted.clear()
        self._total = self.have_bytes
        for w in self.watches:
            readable = self._check(w)
            if readable is None:
                return True
            self._counted[w.partition.tp] = readable
            self._total += readable
        return self._total >= self.min_bytes

    def try_complete_key(self, key: Hashable) -> bool:
        w = self._by_tp.get(key)
        if w is None or len(self._by_tp) != len(self.watches):
            return self.try_complete()
        readable = self._check(w)
        if readable is None:
            return True
        self._total += readable - self._counted.get(key, 0)
        self._counted[key] = readable
        return self._total >= self.min_bytes


class DelayedProduce(DelayedOperation):
    """acks=all: completes when, for every appended batch, the high watermark passed
    it or the partition lost its leadership. Each partition's outcome is fixed the
    moment it is decided (a leader that is deposed and re-elected meanwhile must not
    count a batch it may have truncated): NONE, NOT_ENOUGH_REPLICAS_AFTER_APPEND
    (the maximal ISR shrank below min.insync.replicas, as Kafka counts it) or
    NOT_LEADER_OR_FOLLOWER. Undecided at the timeout: REQUEST_TIMED_OUT.

    A leader epoch bump without a change of leader (the controller re-elected us)
    keeps the wait going, as in Kafka: the batch stays in our log, and the high
    watermark of the new epoch passing it means the ISR has it."""

    def __init__(self, waits: list[tuple[Partition, int, int]]) -> None:
        super().__init__(p.tp for p, _, _ in waits)
        self.waits = waits  # (partition, required high watermark, leader generation)
        self.outcomes: list[ErrorCode | None] = [None] * len(waits)
        self._undecided = len(waits)
        self._by_tp: dict[Hashable, list[int]] = {}
        for i, (p, _, _) in enumerate(waits):
            self._by_tp.setdefault(p.tp, []).append(i)

    def _decide(self, i: int) -> None:
        if self.outcomes[i] is not None:
            return
        p, required, generation = self.waits[i]
        if p.role is not Role.LEADER or p.leader_generation != generation:
            self.outcomes[i] = ErrorCode.NOT_LEADER_OR_FOLLOWER
        elif p.high_watermark >= required:
            self.outcomes[i] = (
                ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
                if len(p.maximal_isr) < p.min_insync_replicas
                else ErrorCode.NONE
            )
        else:
            return
        self._undecided -= 1

    def try_complete(self) -> bool:
        for i in range(len(self.waits)):
            self._decide(i)
        return self._undecided == 0

    def try_complete_key(self, key: Hashable) -> bool:
        for i in self._by_tp.get(key, ()):
            self._decide(i)
        return self._undecided == 0


def fetch_response_max_bytes(config: BrokerConfig, request: FetchRequest) -> int:
    """The record bytes one Fetch may return, all partitions together: its max_bytes,
    capped by fetch.max.bytes for a consumer and by replica.fetch.response.max.bytes
    for a follower (Kafka caps both at fetch.max.bytes; the follower's own setting is
    the tighter bound). The first batch is returned whole even when larger (KIP-74);
    a batch is at most the max.message.bytes it was accepted under."""
    cap = (
        config.replica_fetch_response_max_bytes
        if request.replica_id >= 0
        else config.fetch_max_bytes
    )
    return max(0, min(request.max_bytes, cap))
