"""Purgatory: wake-ups, timeouts, the bound, shutdown."""

from __future__ import annotations

import asyncio

from broker.delayed import DelayedOperation
from broker.delayed import Purgatory


class Flag(DelayedOperation):
    def __init__(self, key: str) -> None:
        super().__init__([key])
        self.ready = False
        self.checks = 0

    def try_complete(self) -> bool:
        self.checks += 1
        return self.ready


async def test_completes_on_notify() -> None:
    purgatory = Purgatory("test")
    op = Flag("a")
    waiter = asyncio.create_task(purgatory.wait(op, 5))
    await asyncio.sleep(0)
    assert len(purgatory) == 1
    purgatory.notify("b")  # another key: not even checked
    assert op.checks == 1
    purgatory.notify("a")  # checked, not ready
    assert not waiter.done()
    op.ready = True
    purgatory.notify("a")
    assert await waiter is True
    assert len(purgatory) == 0


async def test_times_out_and_unregisters() -> None:
    purgatory = Purgatory("test")
    assert await purgatory.wait(Flag("a"), 0.01) is False
    assert len(purgatory) == 0
    purgatory.notify("a")


async def test_ready_at_once_and_zero_timeout() -> None:
    purgatory = Purgatory("test")
    op = Flag("a")
    op.ready = True
    assert await purgatory.wait(op, 5) is True
    assert await purgatory.wait(Flag("a"), 0) is False


async def test_bounded() -> None:
    purgatory = Purgatory("test", max_size=1)
    first = asyncio.create_task(purgatory.wait(Flag("a"), 5))
    await asyncio.sleep(0)
    assert await purgatory.wait(Flag("a"), 5) is False  # full: answers at once
    purgatory.close()
    assert await first is False


async def test_cancelled_waiter_unregisters() -> None:
    purgatory = Purgatory("test")
    task = asyncio.create_task(purgatory.wait(Flag("a"), 5))
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert len(purgatory) == 0
