"""When a log writes its producer-state snapshots (format in producer_state.py).

A snapshot is written at every roll and at a clean close. Given a `SerialWriter`,
the snapshot of a roll is encoded on the event loop and written (temp file, fsync,
rename, fsync the directory, runtime/fileio.atomic_write) on the writer's thread;
every later step that reads, deletes or replaces snapshots (truncation, retention,
close) first calls `wait()`, so they keep their order. A snapshot lost to a crash
before it is written costs only a longer replay of batch headers at the next open.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future

from broker.storage.producer_state import ProducerStateManager
from runtime.fileio import SerialWriter
from runtime.fileio import atomic_write

logger = logging.getLogger(__name__)


class ProducerSnapshots:
    """The producer snapshots of one log, written now or on the writer's thread."""

    def __init__(self, state: ProducerStateManager, writer: SerialWriter | None, name: str) -> None:
        self._state = state
        self._writer = writer
        self._name = name
        self._pending: list[Future[object]] = []

    def take(self, *, in_background: bool = False) -> None:
        if in_background and self._writer is not None:
            path, data = self._state.encode_snapshot()
            self._pending = [f for f in self._pending if not f.done()]
            future = self._writer.submit(atomic_write, path, data)
            future.add_done_callback(self._written)
            self._pending.append(future)
            return
        self.wait()
        try:
            self._state.take_snapshot()
        except OSError as exc:
            self._failed(exc)

    def wait(self) -> None:
        """Block until the snapshots handed to the writer are on disk (or failed)."""
        pending, self._pending = self._pending, []
        for future in pending:
            future.exception()  # waits; a failure was logged by _written

    def _written(self, future: Future[object]) -> None:
        exc = future.exception()
        if isinstance(exc, OSError):
            self._failed(exc)
        elif exc is not None:
            logger.error("[Log %s] producer snapshot write failed: %r", self._name, exc)

    def _failed(self, exc: OSError) -> None:
        # Not fatal: the state is rebuilt from the log headers on the next open.
        logger.warning("[Log %s] could not write a producer snapshot: %s", self._name, exc)
