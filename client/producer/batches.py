"""The producer's batches: ProducerBatch (a whole batch built by the caller for
send_batch) and the accumulator's per-partition batch with its record futures, its
sequence and its attempts; acks parsing and the producer's bounds."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from client.errors import IllegalStateError
from client.types import Header
from client.types import RecordMetadata
from client.types import TopicPartition
from protocol.errors import ErrorCode
from protocol.record_batch import BatchBuilder

log = logging.getLogger(__name__)


# Per-record overhead in a batch besides key, value and headers (varints, attributes).
_RECORD_OVERHEAD = 24


_MAX_IN_FLIGHT_IDEMPOTENT = 5  # the leader remembers the last 5 batches per producer


_SEQUENCE_WRAP = 2**31


_MAX_PRODUCER_EPOCH = 2**15 - 1  # int16: at the last epoch a new producer id is needed


_SEQUENCE_ERRORS = frozenset(
    {
        ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
        ErrorCode.UNKNOWN_PRODUCER_ID,
        ErrorCode.INVALID_PRODUCER_EPOCH,
    }
)


def parse_acks(acks: int | str) -> int:
    """'all' / -1 / 0 / 1 (also as strings) -> -1, 0 or 1."""
    text = str(acks).strip().lower()
    if text in ("all", "-1"):
        return -1
    if text in ("0", "1"):
        return int(text)
    raise ValueError(f"acks must be 0, 1 or all (-1), not {acks!r}")


class ProducerBatch:
    """Records to send as one batch with `AsyncProducer.send_batch` (make it with
    `AsyncProducer.create_batch()`, as in aiokafka). Keys and values are bytes (no
    serializers). Encoded as they are appended."""

    __slots__ = ("_builder", "_max_size")

    def __init__(self, builder: BatchBuilder, max_size: int) -> None:
        self._builder = builder
        self._max_size = max_size

    def append(
        self,
        *,
        key: bytes | None = None,
        value: bytes | None = None,
        timestamp: int | None = None,
        headers: Sequence[Header] = (),
    ) -> int | None:
        """Add a record: its offset delta in the batch, or None when the batch is full
        (`max_size` bytes; the first record always fits). Timestamps default to now."""
        builder = self._builder
        if builder is None:
            raise IllegalStateError("this batch was already sent")
        if not (
            (value is None or type(value) is bytes) and (key is None or type(key) is bytes)
        ) and (not isinstance(key, bytes | None) or not isinstance(value, bytes | None)):
            raise TypeError("key and value must be bytes or None")
        size = builder.estimated_size + _RECORD_OVERHEAD
        if key is not None:
            size += len(key)
        if value is not None:
            size += len(value)
        if headers:
            size += sum(len(k) + len(v or b"") + 8 for k, v in headers)
        if size > self._max_size and len(builder):
            return None
        return builder.append(value, key, headers, timestamp)

    @property
    def sent(self) -> bool:
        return self._builder is None

    def record_count(self) -> int:
        return len(self._builder) if self._builder is not None else 0

    def size(self) -> int:
        """Bytes of the batch so far (uncompressed, header included)."""
        return self._builder.estimated_size if self._builder is not None else 0

    def _take(self) -> BatchBuilder:
        """The builder, once: a batch is sent at most once."""
        builder = self._builder
        if builder is None:
            raise IllegalStateError("this batch was already sent")
        self._builder = None  # type: ignore[assignment]
        return builder


class _Batch:
    __slots__ = (
        "attempts",
        "base_sequence",
        "builder",
        "created",
        "done",
        "facts",
        "is_full",
        "last_error",
        "leader_epoch",
        "maybe_written",
        "payload",
        "records",
        "retry_at",
        "size",
        "tp",
    )

    def __init__(self, tp: TopicPartition, builder: BatchBuilder, now: float) -> None:
        self.tp = tp
        self.builder: BatchBuilder | None = builder
        self.payload: bytes | None = None
        # One future per record (its offset delta is its index), and per record three
        # ints in a flat list: timestamp, key size, value size. No tuple per record:
        # a long-lived tuple holding a future is one more object for every GC pass
        # while the batch waits (profiled: about half of the per-record GC cost).
        self.records: list[asyncio.Future[RecordMetadata]] = []
        self.facts: list[int] = []
        self.created = now
        self.attempts = 0
        self.retry_at = 0.0
        self.size = 0
        self.is_full = False
        self.leader_epoch = -1
        self.base_sequence: int | None = None  # assigned when first sent (idempotence)
        # An attempt reached a leader and its outcome is unknown (a lost answer, or an
        # answer that may follow the append). Sticky: a later refusal says nothing about
        # that attempt. Only a sequence error from the leader clears it (not in its log).
        self.maybe_written = False
        # Why the last attempt failed (a retriable error): what an expiry reports.
        self.last_error: BaseException | None = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @property
    def record_count(self) -> int:
        return len(self.builder) if self.builder is not None else len(self.records)


def _earliest(current: float | None, candidate: float) -> float:
    candidate = max(candidate, 0.0)
    return candidate if current is None else min(current, candidate)
