"""Producer ids for InitProducerId (KIP-98 idempotence, KIP-730 blocks).

The broker hands out ids from a block the controller allocated to it
(AllocateProducerIds, durable in the metadata log before it is answered, so no id
is ever handed out twice, by any broker, even across restarts). When the block is
used up one request fetches the next; the others wait for it. Fetching is retried a
bounded number of times; after that InitProducerId answers a retriable error.

KIP-360 epoch bump: an idempotent producer whose sequences broke on some partition
(its state there was lost, or a batch failed and left a gap) sends InitProducerId with
its producer id and epoch and gets the same id at the next epoch (`bump`); at the
last epoch (int16) it gets a new id at epoch 0 instead. Idempotent producer ids are not
registered anywhere (as in Kafka, whose idempotent producer even bumps locally), so
nothing else is checked here: the partition leaders fence the older epoch
(INVALID_PRODUCER_EPOCH, broker/storage/producer_state.py) and take the new one from
sequence 0.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from collections.abc import Callable

from protocol.errors import ErrorCode
from protocol.invariants import invariant
from protocol.messages import AllocateProducerIdsResponse
from runtime.peer_rpc import RpcError

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 5
BACKOFF_S = 0.1
MAX_BACKOFF_S = 1.0
MAX_PRODUCER_EPOCH = 2**15 - 1  # int16 on the wire

Allocate = Callable[[], Awaitable[AllocateProducerIdsResponse]]


class ProducerIdUnavailableError(Exception):
    def __init__(self, error_code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


class ProducerIdManager:
    def __init__(
        self,
        allocate: Allocate,
        *,
        max_attempts: int = MAX_ATTEMPTS,
        backoff_s: float = BACKOFF_S,
    ) -> None:
        self._allocate = allocate
        self._max_attempts = max_attempts
        self._backoff_s = backoff_s
        self._next = 0
        self._end = 0  # exclusive: the block is [_next, _end)
        self._lock = asyncio.Lock()

    async def next_id(self) -> int:
        """A producer id never handed out before. Raises ProducerIdUnavailableError."""
        async with self._lock:  # one block fetch at a time; the others wait for it
            if self._next >= self._end:
                await self._fetch_block()
            pid = self._next
            self._next += 1
            return pid

    async def bump(self, producer_id: int, producer_epoch: int) -> tuple[int, int]:
        """(producer id, epoch) after a KIP-360 bump of `producer_id` at
        `producer_epoch`. Raises ValueError for ids/epochs that cannot be bumped and
        ProducerIdUnavailableError when a new id is needed but none can be had."""
        if producer_id < 0 or not 0 <= producer_epoch <= MAX_PRODUCER_EPOCH:
            raise ValueError(
                f"cannot bump producer id {producer_id} epoch {producer_epoch}: give both, "
                f"id >= 0 and 0 <= epoch <= {MAX_PRODUCER_EPOCH} (or neither, for a new id)"
            )
        if producer_epoch + 1 < MAX_PRODUCER_EPOCH:
            return producer_id, producer_epoch + 1
        log.info("producer id %d used up its epochs: handing out a new id", producer_id)
        return await self.next_id(), 0

    async def _fetch_block(self) -> None:
        backoff = self._backoff_s
        problem = "no attempt made"
        for attempt in range(1, self._max_attempts + 1):
            try:
                resp = await self._allocate()
            except (RpcError, OSError) as exc:
                problem = f"controller unreachable: {exc}"
            else:
                if resp.error_code == ErrorCode.NONE and resp.producer_id_len > 0:
                    invariant(
                        resp.producer_id_start >= self._end,
                        f"producer id block went back: {resp.producer_id_start} < {self._end}",
                    )
                    self._next = resp.producer_id_start
                    self._end = resp.producer_id_start + resp.producer_id_len
                    log.info("producer id block [%d, %d) received", self._next, self._end)
                    return
                problem = f"controller answered {resp.error_code}: {resp.error_message}"
            log.warning(
                "AllocateProducerIds attempt %d/%d failed (%s)",
                attempt,
                self._max_attempts,
                problem,
            )
            if attempt < self._max_attempts:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
        raise ProducerIdUnavailableError(
            ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
            f"no producer id block from the controller after {self._max_attempts} "
            f"attempts ({problem}); retry later",
        )
