"""Outgoing RPC: one asyncio connection to a peer (the controller, later a leader)
around protocol.connection.ClientConnection.

- pipelining: many requests in flight on one connection (bounded), answered in order;
- per-request timeout: a timed-out request closes the connection, as Kafka's client
  does, because every later response on it would queue behind the lost one;
- reconnect on the next request, no sooner than a bounded exponential backoff (with
  jitter) after the last failure;
- `request_with_retry` retries connection failures and timeouts until a deadline;
- test faults (broker/faults.py) act before a request is written; their waits count
  against the request timeout, and `peer_id` (the destination's node id, or
  CONTROLLER_PEER_ID) is what fault rules match.

A response with a non-zero header error code (the peer could not serve the request
at all) raises RpcErrorResponse; per-partition error codes are the caller's business.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time

from broker.faults import DROP_RESPONSE, NO_FAULTS, Faults, InjectedDrop
from protocol.connection import ClientConnection, Response
from protocol.errors import DecodeError, ErrorCode
from protocol.messages import API_BY_REQUEST_TYPE, Message

log = logging.getLogger(__name__)

INITIAL_BACKOFF_S = 0.05
MAX_BACKOFF_S = 1.0


class RpcError(Exception):
    """Base of the errors of an outgoing request."""


class RpcConnectionError(RpcError, ConnectionError):
    """Could not connect, or the connection broke before the answer came."""


class RpcTimeoutError(RpcError, TimeoutError):
    """No answer within the request timeout."""


class RpcErrorResponse(RpcError):
    """The peer answered with a whole-request error (unknown API, bad version...)."""

    def __init__(self, error: ErrorCode, message: str) -> None:
        super().__init__(f"{error.name}: {message}")
        self.error = error
        self.message = message


class _Protocol(asyncio.Protocol):
    def __init__(self, owner: RpcClient) -> None:
        self._owner = owner
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; same interface.
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._owner._on_data(self, data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._owner._on_lost(self, exc)
        if not self.closed.done():
            self.closed.set_result(None)


class RpcClient:
    """A connection to one peer. Not thread-safe; one event loop."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        name: str,
        client_id: str,
        request_timeout_s: float = 30.0,
        connect_timeout_s: float = 5.0,
        max_in_flight: int = 100,
        faults: Faults = NO_FAULTS,
        peer_id: int = -1,
    ) -> None:
        self.host = host
        self.port = port
        self.name = name  # for log lines: "controller", "leader 2"
        self.request_timeout_s = request_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._client_id = client_id
        self._faults = faults
        self.peer_id = peer_id  # what test fault rules match (-1: unknown)
        self._slots = asyncio.Semaphore(max_in_flight)
        self._connect_lock = asyncio.Lock()
        self._proto: _Protocol | None = None
        self._conn: ClientConnection | None = None
        self._pending: dict[int, asyncio.Future[Response]] = {}
        self._backoff_s = 0.0
        self._next_attempt = 0.0
        self._closed = False

    @property
    def peer(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def connected(self) -> bool:
        return self._proto is not None

    async def request(self, body: Message, *, timeout_s: float | None = None) -> Message:
        """Send one request and return the response body."""
        spec = API_BY_REQUEST_TYPE[type(body)]
        timeout = self.request_timeout_s if timeout_s is None else timeout_s
        loop = asyncio.get_running_loop()
        async with self._slots:
            fault = None
            fault_s = 0.0  # time a test fault held the request: part of its timeout
            if self._faults.enabled:
                started = loop.time()
                fault = await self._injected_fault(int(spec.key), spec.key.name, timeout)
                fault_s = loop.time() - started
            proto, conn = await self._ensure_connected()
            deadline = loop.time() + max(0.0, timeout - fault_s)
            correlation_id, data = conn.send_request(body)
            fut: asyncio.Future[Response] = loop.create_future()
            self._pending[correlation_id] = fut
            assert proto.transport is not None
            proto.transport.write(data)
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancellation
                # that races with the response, and a cancelled loop would run on.
                async with asyncio.timeout_at(deadline):
                    response = await fut
            except TimeoutError:
                self._pending.pop(correlation_id, None)
                log.warning(
                    "%s request to %s %s timed out after %.1fs; closing the connection",
                    spec.key.name,
                    self.name,
                    self.peer,
                    timeout,
                )
                self._drop(proto)
                raise RpcTimeoutError(
                    f"{spec.key.name} to {self.name} at {self.peer} timed out after {timeout:.1f}s"
                ) from None
            finally:
                self._pending.pop(correlation_id, None)
            if fault == DROP_RESPONSE:
                self._drop(proto)
                raise RpcConnectionError(
                    f"test fault: the answer to {spec.key.name} from {self.name} at "
                    f"{self.peer} was dropped"
                )
        if response.error_code != ErrorCode.NONE:
            raise RpcErrorResponse(response.error_code, response.error_message)
        assert response.body is not None
        return response.body

    async def _injected_fault(self, api_key: int, api: str, timeout: float) -> str | None:
        """Carry out a test fault before sending; its wait counts against the timeout."""
        try:
            async with asyncio.timeout(timeout):
                return await self._faults.before_send(
                    self.peer_id, api_key, f"{self.name} at {self.peer}"
                )
        except TimeoutError:
            raise RpcTimeoutError(
                f"{api} to {self.name} at {self.peer} timed out after {timeout:.1f}s "
                "(held or delayed by a test fault)"
            ) from None
        except InjectedDrop as exc:
            raise RpcConnectionError(str(exc)) from None

    async def request_with_retry(
        self, body: Message, *, deadline: float, timeout_s: float | None = None
    ) -> Message:
        """`request`, retrying connection failures and timeouts until `deadline`
        (time.monotonic()); the last error is raised once it has passed."""
        while True:
            try:
                return await self.request(body, timeout_s=timeout_s)
            except (RpcConnectionError, RpcTimeoutError):
                if time.monotonic() >= deadline:
                    raise
                # _ensure_connected sleeps out the backoff; avoid a hot loop anyway.
                await asyncio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    async def close(self) -> None:
        self._closed = True
        proto = self._proto
        if proto is not None:
            self._drop(proto)
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await asyncio.shield(proto.closed)

    # ------------------------------------------------------------------ internals

    async def _ensure_connected(self) -> tuple[_Protocol, ClientConnection]:
        if self._proto is not None and self._conn is not None:
            return self._proto, self._conn
        async with self._connect_lock:
            if self._proto is not None and self._conn is not None:
                return self._proto, self._conn
            if self._closed:
                raise RpcConnectionError(f"connection to {self.name} at {self.peer} is closed")
            wait = self._next_attempt - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            loop = asyncio.get_running_loop()
            try:
                async with asyncio.timeout(self.connect_timeout_s):
                    _transport, proto = await loop.create_connection(
                        lambda: _Protocol(self), self.host, self.port
                    )
            except (OSError, TimeoutError) as exc:
                self._backoff_s = min(MAX_BACKOFF_S, max(INITIAL_BACKOFF_S, self._backoff_s * 2))
                self._next_attempt = time.monotonic() + self._backoff_s * random.uniform(0.8, 1.2)
                raise RpcConnectionError(
                    f"cannot connect to {self.name} at {self.peer}: {exc or type(exc).__name__}"
                ) from exc
            self._backoff_s = 0.0
            self._proto = proto
            self._conn = ClientConnection(self._client_id)
            log.debug("connected to %s at %s", self.name, self.peer)
            return proto, self._conn

    def _on_data(self, proto: _Protocol, data: bytes) -> None:
        if proto is not self._proto or self._conn is None:
            return
        try:
            responses = self._conn.receive_data(data)
        except DecodeError as exc:
            log.error("bad response from %s at %s: %s; closing", self.name, self.peer, exc)
            self._drop(proto)
            return
        for response in responses:
            fut = self._pending.pop(response.correlation_id, None)
            if fut is not None and not fut.done():
                fut.set_result(response)

    def _on_lost(self, proto: _Protocol, exc: Exception | None) -> None:
        if proto is self._proto:
            self._fail_all(proto, exc)

    def _drop(self, proto: _Protocol) -> None:
        if proto.transport is not None:
            proto.transport.abort()
        if proto is self._proto:
            self._fail_all(proto, None)

    def _fail_all(self, proto: _Protocol, exc: Exception | None) -> None:
        self._proto = None
        self._conn = None
        # A broken connection backs off like a failed connect, so a peer that accepts
        # and drops at once is not hammered.
        self._backoff_s = min(MAX_BACKOFF_S, max(INITIAL_BACKOFF_S, self._backoff_s * 2))
        self._next_attempt = time.monotonic() + self._backoff_s * random.uniform(0.8, 1.2)
        pending, self._pending = self._pending, {}
        why = f": {exc}" if exc else ""
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(
                    RpcConnectionError(f"connection to {self.name} at {self.peer} lost{why}")
                )
