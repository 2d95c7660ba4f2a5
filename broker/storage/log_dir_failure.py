"""LogDirFailureChannel: whether a data directory may still be used, and the one place
where a failed file operation turns into the directory going offline.

Kafka's rule (LogDirFailureChannel, KIP-112): an I/O error on a log directory means
its state can no longer be trusted (a torn write, an index that could not be
extended, a checkpoint half replaced), so every log in it stops being read or
written and the broker gives up the replicas it holds there. Here a broker has one
data directory, so "offline" means: no append, read, roll, truncation, flush or
checkpoint touches the directory again until the process restarts, and the broker
asks the controller to fence it so that its leaderships move to other replicas.

Running out of file descriptors (EMFILE, ENFILE) is not a failure of the directory:
the operation that needed a descriptor fails alone (FileOpenError, answered
KAFKA_STORAGE_ERROR for its partition) and the directory stays online.

Thread-safe: failures are reported from the event loop and from worker threads
(fsyncs, checkpoints). Listeners run on the reporting thread, once, after the
state is set; they must only hand the news over (e.g. `call_soon_threadsafe`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from collections.abc import Iterator
from pathlib import Path

from broker.storage.errors import OUT_OF_DESCRIPTORS
from broker.storage.errors import FileOpenError
from broker.storage.errors import LogDirFailureError
from broker.storage.errors import StorageError
from broker.storage.file_handles import OPEN_FAILURES

logger = logging.getLogger(__name__)

OfflineListener = Callable[[LogDirFailureError], None]


class LogDirFailureChannel:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = Path(data_dir)
        self._failure: LogDirFailureError | None = None
        self._lock = threading.Lock()
        self._listeners: list[OfflineListener] = []

    @property
    def failure(self) -> LogDirFailureError | None:
        """The first failure, once the directory is offline; None while it is usable."""
        return self._failure

    def add_listener(self, listener: OfflineListener) -> None:
        """Call `listener(failure)` once when the directory goes offline (at once if it
        already is)."""
        with self._lock:
            failure = self._failure
            if failure is None:
                self._listeners.append(listener)
        if failure is not None:
            listener(failure)

    def check(self) -> None:
        """Raise the directory's failure if it is offline."""
        failure = self._failure
        if failure is not None:
            raise failure

    def fail(self, operation: str, cause: OSError) -> LogDirFailureError:
        """Take the directory offline because `operation` failed with `cause`; returns
        the error for the caller to raise. Only the first failure is logged and
        announced: later ones are consequences."""
        error = LogDirFailureError(self.data_dir, operation, cause)
        with self._lock:
            if self._failure is not None:
                return error
            self._failure = error
            listeners, self._listeners = self._listeners, []
        logger.error("%s", error)
        for listener in listeners:
            try:
                listener(error)
            except Exception:
                logger.exception("a log directory failure listener failed")
        return error

    def error_for(self, operation: str, cause: OSError) -> StorageError:
        """What a failed file operation raises. Running out of file descriptors
        (EMFILE, ENFILE) fails only that operation (FileOpenError): the disk is fine
        and it may succeed once descriptors are free. Any other OSError takes the
        directory offline."""
        if cause.errno in OUT_OF_DESCRIPTORS:
            return OPEN_FAILURES.failed(FileOpenError(cause.filename, cause))
        return self.fail(operation, cause)

    @contextlib.contextmanager
    def guard(self, operation: str) -> Iterator[None]:
        """Run a file operation on the directory: refused while it is offline, and an
        OSError takes it offline (raised as LogDirFailureError), except running out
        of descriptors (`error_for`)."""
        self.check()
        try:
            yield
        except OSError as exc:
            raise self.error_for(operation, exc) from exc
