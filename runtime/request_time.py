"""The time a request's handler spends on the event loop (Kafka's request quota counts
the time network and I/O threads spend on a client's requests; our one thread is the
event loop). The handler's coroutine is driven step by step and each step timed, so the
time it is parked (a long-polling Fetch waiting for data, a write waiting for its
replicas) is not counted: only the work it did."""

from __future__ import annotations

import time
from collections.abc import Coroutine
from collections.abc import Generator
from typing import Any
from typing import Generic
from typing import TypeVar

T = TypeVar("T")


class TimedSteps(Generic[T]):
    """`await TimedSteps(coro)` is `await coro`; `seconds` is then its steps' total."""

    __slots__ = ("_coro", "seconds")

    def __init__(self, coro: Coroutine[Any, Any, T]) -> None:
        self._coro = coro
        self.seconds = 0.0

    def __await__(self) -> Generator[Any, Any, T]:
        coro = self._coro
        sent: Any = None
        thrown: BaseException | None = None
        while True:
            start = time.perf_counter()
            try:
                yielded = coro.send(sent) if thrown is None else coro.throw(thrown)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            finally:
                self.seconds += time.perf_counter() - start
            try:
                sent, thrown = (yield yielded), None
            except BaseException as exc:  # a cancellation goes into the handler
                sent, thrown = None, exc
