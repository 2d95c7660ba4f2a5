"""The idempotent producer's state: producer id and epoch (InitProducerId), sequence
numbers per partition and the epoch bump of KIP-360 when a partition's sequence state
is lost."""

from __future__ import annotations

import asyncio
import time
from collections import deque

from client.errors import BrokerResponseError
from client.errors import IllegalStateError
from client.errors import MinibrokerError
from client.errors import UnknownServerError
from client.errors import error_for
from client.producer.batches import _MAX_PRODUCER_EPOCH
from client.producer.batches import _Batch
from client.producer.batches import log
from client.types import TopicPartition
from protocol.errors import ErrorCode
from protocol.messages import InitProducerIdRequest
from protocol.messages import InitProducerIdResponse


class IdempotenceState:
    """The idempotent producer's state: producer id and epoch (InitProducerId), sequence"""

    def _on_current_epoch(self, tp: TopicPartition, queue: deque[_Batch]) -> bool:
        """KIP-360: whether `tp` may send now. After an epoch bump a partition keeps its
        old (producer id, epoch) until its in-flight batches are answered, and until no
        batch that may have been written is left: such a batch is resent under its old
        numbers, one at a time, so the leader recognises it as a duplicate (or proves,
        with a sequence error, that it is not in its log), or it fails when its delivery
        timeout expires (PossiblyWrittenError). A partition whose numbering did not
        break resends all its old-epoch retries so. Then the partition moves to the
        current epoch at sequence 0, its remaining batches renumbered in queue order
        (never reordered). A batch behind one the leader proved unwritten is not in its
        log either (a leader appends a producer's sequences only in order)."""
        current = (self._producer_id, self._producer_epoch)
        owner = self._seq_owner.get(tp)
        if owner is None or owner == current:
            return True
        if self._in_flight.get(tp):
            return False  # the answers decide what is resolved
        head = queue[0] if queue else None
        if (
            head is not None
            and head.base_sequence is not None
            and (head.maybe_written or tp not in self._resets)
        ):
            return True  # resolve the old epoch's retries first
        if head is not None and head.maybe_written:
            raise IllegalStateError(f"{tp}: renumbering a batch that may have been written")
        for batch in queue:
            batch.payload = None
            batch.base_sequence = None
            batch.maybe_written = False  # behind the head: not in the leader's log either
        self._next_seq[tp] = 0
        self._seq_owner[tp] = current
        self._resets.discard(tp)
        log.info(
            "%s: sequences restart at 0 under producer id %d epoch %d (were %d epoch %d)",
            tp,
            *current,
            *owner,
        )
        return True

    def _need_reset(self, tp: TopicPartition) -> None:
        """`tp`'s numbering broke (the leader lost our state, or a gap): bump the epoch
        and renumber its unacknowledged batches from 0 once its in-flight ones return."""
        self._resets.add(tp)
        if self._seq_owner.get(tp) == (self._producer_id, self._producer_epoch):
            self._need_bump = True

    def _start_epoch_bump(self) -> None:
        if self._bump_task is None or self._bump_task.done():
            self._bump_task = asyncio.get_running_loop().create_task(
                self._bump_epoch(), name="minibroker-producer-bump-epoch"
            )

    async def _bump_epoch(self) -> None:
        try:
            await self._init_producer_id(bump=True)
        except MinibrokerError as exc:
            log.error("cannot bump the producer epoch: %s; retrying", exc)
            await asyncio.sleep(self.retry_backoff_max_ms / 1000)
            self._wakeup.set()
            return
        self._need_bump = False
        self._wakeup.set()

    async def _init_producer_id(self, *, bump: bool = False) -> None:
        """InitProducerId, retried within max_block_ms. `bump` (KIP-360) sends the
        current producer id and epoch and gets the next epoch of the same id (a new id
        when the epoch is exhausted or the broker cannot bump). A broker that does not
        support InitProducerId makes this producer fall back to non-idempotent delivery
        (a WARNING)."""
        deadline = time.monotonic() + self.max_block_ms / 1000
        backoff = self.retry_backoff_ms / 1000
        old = (self._producer_id, self._producer_epoch)
        bump = bump and old[0] >= 0 and 0 <= old[1] < _MAX_PRODUCER_EPOCH
        while True:
            error: MinibrokerError
            request = (
                InitProducerIdRequest(producer_id=old[0], producer_epoch=old[1])
                if bump
                else InitProducerIdRequest()
            )
            try:
                response = await self._cluster.send_any(request)
                assert isinstance(response, InitProducerIdResponse)
                if response.error_code == ErrorCode.NONE:
                    new = (response.producer_id, response.producer_epoch)
                    unusable = _unusable_producer_id(old, new)
                    if unusable is None:
                        self._producer_id, self._producer_epoch = new
                        log.info(
                            "idempotent producer: producer id %d epoch %d%s",
                            *new,
                            f" (bumped from epoch {old[1]})" if new[0] == old[0] else "",
                        )
                        return
                    error = UnknownServerError(unusable)  # not retriable
                else:
                    error = error_for(response.error_code, "InitProducerId")
            except BrokerResponseError as exc:
                error = exc
            except MinibrokerError as exc:
                error = exc
            code = getattr(error, "error_code", None)
            if bump and code in (ErrorCode.INVALID_REQUEST, ErrorCode.UNSUPPORTED_VERSION):
                log.warning(
                    "the broker cannot bump the epoch (%s): getting a new producer id", error
                )
                bump = False
                continue
            if code in (ErrorCode.INVALID_REQUEST, ErrorCode.UNSUPPORTED_VERSION):
                log.warning(
                    "the broker does not support InitProducerId (%s): idempotence is off, "
                    "a retry after a lost answer may write a batch twice",
                    error,
                )
                self._idempotent = False
                return
            if not error.retriable or time.monotonic() + backoff > deadline:
                raise error
            log.info("InitProducerId failed: %s; retrying", error)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.retry_backoff_max_ms / 1000)


def _unusable_producer_id(old: tuple[int, int], new: tuple[int, int]) -> str | None:
    """Why an InitProducerId answer with no error cannot be used, or None: an id and an
    epoch are never negative, and a bump of the same id must raise the epoch (the
    leaders fence by it; an epoch that went back would be fenced or refused)."""
    if new[0] < 0 or not 0 <= new[1] <= _MAX_PRODUCER_EPOCH:
        return (
            f"InitProducerId answered producer id {new[0]} epoch {new[1]} with no error: "
            "no usable producer id (the broker's fault)"
        )
    if new[0] == old[0] and new[1] <= old[1]:
        return (
            f"InitProducerId answered producer id {new[0]} epoch {new[1]} to a bump of "
            f"epoch {old[1]}: the epoch must go up (the broker's fault)"
        )
    return None
