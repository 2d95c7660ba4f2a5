"""Stopping background tasks: cancel them, then wait until each has ended, so nothing
they hold (a socket, a file, a lock) is still in use when the caller goes on."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any] | None]) -> None:
    """Cancel every task (None: none there), then await each. Its cancellation or its
    failure is swallowed: a task that failed has logged why, and a stop must finish."""
    running = [task for task in tasks if task is not None]
    for task in running:
        task.cancel()
    for task in running:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
