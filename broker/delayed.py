"""Purgatory: requests that wait for something to happen on some partitions.

A `DelayedOperation` watches keys (topic-partitions). Whoever changes a partition
(append, high watermark moved, role change, removal) calls `Purgatory.notify(tp)`;
every operation watching it re-checks its condition with `try_complete`, which must
be cheap (no reads). A waiting request ends when its condition holds, its timeout
fires, or the purgatory closes (shutdown).

Bounded: at most `max_size` operations wait at once; past that `wait` returns False
at once and the request is answered with what it has (as on a timeout).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable
from collections.abc import Iterable

log = logging.getLogger(__name__)


class DelayedOperation:
    """Subclass and implement `try_complete`."""

    def __init__(self, keys: Iterable[Hashable]) -> None:
        self.keys = tuple(dict.fromkeys(keys))
        self.future: asyncio.Future[bool] | None = None

    def try_complete(self) -> bool:
        raise NotImplementedError

    def try_complete_key(self, key: Hashable) -> bool:
        """What `notify(key)` checks: only what `key` changed can complete the operation
        now. Override when the full check costs more than that key's part (a fetch of
        thousands of partitions, notified for each of them, is quadratic otherwise)."""
        return self.try_complete()


class Purgatory:
    def __init__(self, name: str, *, max_size: int = 10_000) -> None:
        self.name = name
        self.max_size = max_size
        self._watchers: dict[Hashable, set[DelayedOperation]] = {}
        self._count = 0
        self._closed = False

    def __len__(self) -> int:
        return self._count

    async def wait(self, op: DelayedOperation, timeout_s: float) -> bool:
        """Wait until `op` completes (True) or the timeout / shutdown / the bound (False)."""
        if op.try_complete():
            return True
        if timeout_s <= 0 or self._closed:
            return False
        if self._count >= self.max_size:
            log.warning(
                "%s purgatory full (%d waiting); answering a request without waiting",
                self.name,
                self._count,
            )
            return False
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        op.future = fut
        for key in op.keys:
            self._watchers.setdefault(key, set()).add(op)
        self._count += 1
        try:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
            # that races with the future's completion.
            async with asyncio.timeout(timeout_s):
                return await fut
        except TimeoutError:
            return False
        finally:
            self._unwatch(op)

    def notify(self, key: Hashable) -> None:
        ops = self._watchers.get(key)
        if not ops:
            return
        for op in list(ops):
            fut = op.future
            if fut is None or fut.done():
                continue
            try:
                done = op.try_complete_key(key)
            except Exception:
                log.exception("%s: delayed operation check failed; completing it", self.name)
                done = True
            if done:
                fut.set_result(True)

    def notify_all(self, keys: Iterable[Hashable]) -> None:
        for key in keys:
            self.notify(key)

    def close(self) -> None:
        """Release every waiter (they answer with what they have)."""
        self._closed = True
        for ops in list(self._watchers.values()):
            for op in list(ops):
                if op.future is not None and not op.future.done():
                    op.future.set_result(False)

    def _unwatch(self, op: DelayedOperation) -> None:
        if op.future is None:
            return
        op.future = None
        self._count -= 1
        for key in op.keys:
            ops = self._watchers.get(key)
            if ops is not None:
                ops.discard(op)
                if not ops:
                    del self._watchers[key]
