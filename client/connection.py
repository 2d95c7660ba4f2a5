"""One TCP connection to a broker (or the controller): the asyncio glue around the
sans-I/O `protocol.connection.ClientConnection`.

Requests are pipelined: each gets a future keyed by its correlation id and the
responses (which come back in request order) resolve them. Bounded: at most
`max_in_flight` requests wait for an answer; a request that gets no answer within its
timeout fails with RequestTimedOutError and closes the connection (as Kafka's client
does: the broker is wedged or the stream is out of step, and a fresh connection is the
only safe state). A dropped connection fails every pending request with
ConnectionFailedError, so no caller waits forever.
"""

from __future__ import annotations

import asyncio
import logging
from typing import NamedTuple

from client.errors import (
    START_HINT,
    ConnectionFailedError,
    MinibrokerError,
    RequestTimedOutError,
    error_for,
)
from protocol.connection import ClientConnection
from protocol.errors import DecodeError, ErrorCode
from protocol.framing import DEFAULT_MAX_FRAME_SIZE
from protocol.messages import Message

log = logging.getLogger(__name__)


class _Pending(NamedTuple):
    future: asyncio.Future[Message]
    timer: asyncio.TimerHandle | None
    holds_slot: bool


class _Protocol(asyncio.Protocol):
    def __init__(self, owner: BrokerConnection) -> None:
        self._owner = owner

    def data_received(self, data: bytes) -> None:
        self._owner._on_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._owner._on_lost(exc)

    def pause_writing(self) -> None:
        self._owner._paused = True

    def resume_writing(self) -> None:
        self._owner._on_resume()


class BrokerConnection:
    """A pipelined request/response connection to one server."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        node_id: int = -1,
        client_id: str | None = "minibroker",
        request_timeout_ms: int = 30_000,
        connect_timeout_ms: int = 10_000,
        max_in_flight: int = 100,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        self.host = host
        self.port = port
        self.node_id = node_id
        self.request_timeout_ms = request_timeout_ms
        self.connect_timeout_ms = connect_timeout_ms
        self._protocol = ClientConnection(client_id, max_frame_size=max_frame_size)
        self._transport: asyncio.Transport | None = None
        self._pending: dict[int, _Pending] = {}
        self._slots = asyncio.Semaphore(max_in_flight)
        self._paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._closed = False
        self._lost = asyncio.Event()
        self._close_reason: MinibrokerError | None = None

    def __repr__(self) -> str:
        return f"<BrokerConnection {self.describe()} {'open' if self.connected else 'closed'}>"

    def describe(self) -> str:
        where = f"{self.host}:{self.port}"
        return f"broker {self.node_id} at {where}" if self.node_id >= 0 else where

    @property
    def connected(self) -> bool:
        return self._transport is not None and not self._closed

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    # ---------------------------------------------------------------- lifecycle

    async def connect(self) -> None:
        if self._transport is not None or self._closed:
            raise ConnectionFailedError(
                f"connection to {self.describe()} was already used; open a new one",
                host=self.host,
                port=self.port,
                node_id=self.node_id,
            )
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_ms / 1000):
                transport, _ = await loop.create_connection(
                    lambda: _Protocol(self), self.host, self.port
                )
        except TimeoutError:
            self._closed = True
            raise self._failure(f"timed out after {self.connect_timeout_ms} ms") from None
        except OSError as exc:
            self._closed = True
            raise self._failure(exc.strerror or str(exc)) from exc
        # uvloop's transports are not asyncio.Transport subclasses; same interface.
        self._transport = transport  # type: ignore[assignment]
        log.debug("connected to %s", self.describe())

    def _failure(self, why: str) -> ConnectionFailedError:
        return ConnectionFailedError(
            f"cannot connect to {self.describe()}: {why}; {START_HINT}",
            host=self.host,
            port=self.port,
            node_id=self.node_id,
            reason=why,
        )

    async def close(self) -> None:
        """Close, failing pending requests; waits (bounded) until the socket is gone."""
        if self._transport is None:
            self._closed = True
            return
        self._shutdown(
            ConnectionFailedError(
                f"connection to {self.describe()} was closed by the client",
                host=self.host,
                port=self.port,
                node_id=self.node_id,
            )
        )
        try:
            async with asyncio.timeout(1.0):
                await self._lost.wait()
        except TimeoutError:
            self._transport.abort()

    def _shutdown(self, reason: MinibrokerError) -> None:
        if self._closed:
            return
        self._closed = True
        self._close_reason = reason
        if self._transport is not None:
            self._transport.close()
        self._fail_all(reason)

    def _fail_all(self, reason: MinibrokerError) -> None:
        pending, self._pending = self._pending, {}
        for entry in pending.values():
            self._finish(entry)
            if not entry.future.done():
                entry.future.set_exception(reason)
                if not entry.holds_slot:  # fire-and-forget (acks=0): nobody awaits it
                    entry.future.exception()
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_exception(reason)
        self._drain_waiters.clear()

    def _finish(self, entry: _Pending) -> None:
        if entry.timer is not None:
            entry.timer.cancel()
        if entry.holds_slot:
            self._slots.release()

    # ---------------------------------------------------------------- requests

    async def send(
        self, request: Message, *, timeout_ms: int | None = None, expect_response: bool = True
    ) -> Message | None:
        """Send `request` and return the decoded response body.

        A whole-request error code raises its BrokerResponseError; per-partition
        error codes stay in the body for the caller. `expect_response=False` (Produce
        with acks=0) returns None as soon as the bytes are written."""
        if not self.connected:
            raise self._closed_error()
        timeout = (self.request_timeout_ms if timeout_ms is None else timeout_ms) / 1000
        loop = asyncio.get_running_loop()
        holds_slot = expect_response
        if holds_slot:
            try:
                async with asyncio.timeout(timeout):
                    await self._slots.acquire()
            except TimeoutError:
                raise RequestTimedOutError(
                    f"{self.in_flight} requests to {self.describe()} still unanswered "
                    f"after {int(timeout * 1000)} ms; the broker may be overloaded"
                ) from None
            if not self.connected:
                self._slots.release()
                raise self._closed_error()
        correlation_id, data = self._protocol.send_request(request)
        future: asyncio.Future[Message] = loop.create_future()
        timer = (
            loop.call_later(timeout, self._on_timeout, correlation_id, timeout)
            if holds_slot
            else None
        )
        self._pending[correlation_id] = _Pending(future, timer, holds_slot)
        assert self._transport is not None
        self._transport.write(data)
        if self._paused:
            await self._wait_drained()
        if not expect_response:
            return None
        return await future

    def _closed_error(self) -> MinibrokerError:
        if self._close_reason is not None:
            return ConnectionFailedError(
                f"connection to {self.describe()} is closed ({self._close_reason})",
                host=self.host,
                port=self.port,
                node_id=self.node_id,
            )
        return ConnectionFailedError(
            f"connection to {self.describe()} is not open",
            host=self.host,
            port=self.port,
            node_id=self.node_id,
        )

    async def _wait_drained(self) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._drain_waiters.append(waiter)
        await waiter

    def _on_resume(self) -> None:
        self._paused = False
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _on_timeout(self, correlation_id: int, timeout: float) -> None:
        entry = self._pending.pop(correlation_id, None)
        if entry is None:
            return
        self._finish(entry)
        error = RequestTimedOutError(
            f"no answer from {self.describe()} within {int(timeout * 1000)} ms "
            f"(correlation id {correlation_id}); closing the connection"
        )
        if not entry.future.done():
            entry.future.set_exception(error)
        log.warning("%s", error)
        # Responses come in order: the ones behind this request are stuck too.
        self._shutdown(
            ConnectionFailedError(
                f"connection to {self.describe()} closed: an earlier request got no answer "
                f"within {int(timeout * 1000)} ms",
                host=self.host,
                port=self.port,
                node_id=self.node_id,
            )
        )

    # ---------------------------------------------------------------- transport events

    def _on_data(self, data: bytes) -> None:
        try:
            responses = self._protocol.receive_data(data)
        except DecodeError as exc:
            log.warning("bad response stream from %s: %s; closing", self.describe(), exc)
            self._shutdown(
                ConnectionFailedError(
                    f"undecodable response from {self.describe()}: {exc}",
                    host=self.host,
                    port=self.port,
                    node_id=self.node_id,
                )
            )
            return
        for response in responses:
            entry = self._pending.pop(response.correlation_id, None)
            if entry is None:  # timed out already
                continue
            self._finish(entry)
            if entry.future.done():  # the caller was cancelled
                continue
            if response.error_code != ErrorCode.NONE:
                entry.future.set_exception(
                    error_for(
                        response.error_code,
                        f"{response.error_message} (from {self.describe()})",
                    )
                )
                if not entry.holds_slot:
                    entry.future.exception()
            else:
                assert response.body is not None
                entry.future.set_result(response.body)

    def _on_lost(self, exc: Exception | None) -> None:
        self._lost.set()
        if self._closed:
            return
        why = f": {exc}" if exc else " by the server"
        log.info("connection to %s lost%s", self.describe(), why)
        self._shutdown(
            ConnectionFailedError(
                f"connection to {self.describe()} lost{why}",
                host=self.host,
                port=self.port,
                node_id=self.node_id,
            )
        )
