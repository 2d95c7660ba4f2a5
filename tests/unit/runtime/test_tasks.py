"""cancel_and_wait (runtime/tasks.py): a stop ends every background task, whether it
was waiting, had failed, or had finished, and returns only once all have ended."""

from __future__ import annotations

import asyncio

from runtime.tasks import cancel_and_wait


async def test_every_task_has_ended_when_it_returns() -> None:
    cleaned_up: list[str] = []

    async def waits_forever(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)  # clean-up that itself awaits
            cleaned_up.append(name)

    async def fails() -> None:
        raise RuntimeError("boom")

    waiting = [asyncio.create_task(waits_forever(n)) for n in ("a", "b")]
    failed = asyncio.create_task(fails())
    done = asyncio.create_task(asyncio.sleep(0))
    await asyncio.sleep(0.01)
    await cancel_and_wait([*waiting, failed, done, None])
    assert all(t.done() for t in [*waiting, failed, done])
    assert sorted(cleaned_up) == ["a", "b"]
    assert all(t.cancelled() for t in waiting)
