"""Outgoing RPC between processes: a reconnecting client for one peer (a broker's
controller channel and follower fetches, a controller's quorum peers) over
`runtime.rpc.PipelinedConnection` (the connection the client library uses too:
pipelining with a bounded number in flight, a timed-out request closes the
connection, a dropped connection fails every pending request, write backpressure).

What this client adds:
- reconnect on the next request, no sooner than a bounded exponential backoff (with
  jitter) after the last failure;
- `request_with_retry` retries connection failures and timeouts until a deadline;
- test faults (runtime/faults.py) act before a request is written; their waits count
  against the request timeout, and `peer_id` (the destination's node id, or
  CONTROLLER_PEER_ID) is what fault rules match;
- the error types: RpcConnectionError, RpcTimeoutError, and RpcErrorResponse for a
  response with a non-zero header error code (the peer could not serve the request at
  all); per-partition error codes are the caller's business;
- SASL (issue 18): with `sasl`, every connection authenticates as this server's user
  first. A refusal is RpcAuthenticationError, a connection error (so every caller's
  retry covers it), logged as one line naming the peer, the user and what to check,
  at most every AUTH_LOG_INTERVAL_S, and retried no sooner than AUTH_BACKOFF_S: a
  wrong password is a slow, loud retry, never a crash or a flood.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
import time
from collections.abc import Awaitable
from collections.abc import Callable

from protocol.errors import ErrorCode
from protocol.invariants import invariant
from protocol.messages import API_BY_REQUEST_TYPE
from protocol.messages import Message
from runtime.faults import DROP_RESPONSE
from runtime.faults import Faults
from runtime.faults import InjectedDrop
from runtime.rpc import PipelinedConnection
from runtime.sasl import SaslCredentials
from runtime.sasl_settings import SERVER_PASSWORD_ENV

log = logging.getLogger(__name__)

INITIAL_BACKOFF_S = 0.05
MAX_BACKOFF_S = 1.0
# After a refused SASL authentication: the password will not fix itself in 50 ms.
AUTH_BACKOFF_S = 5.0
AUTH_LOG_INTERVAL_S = 30.0
_SASL_REFUSALS = frozenset(
    {
        ErrorCode.SASL_AUTHENTICATION_FAILED,
        ErrorCode.UNSUPPORTED_SASL_MECHANISM,
        ErrorCode.ILLEGAL_SASL_STATE,
    }
)

# The default: no test faults. A process passes its own (the broker's, the
# controller's); only `before_send` is used here, so the process name is moot.
NO_FAULTS = Faults()


class RpcError(Exception):
    """Base of the errors of an outgoing request."""


class RpcConnectionError(RpcError, ConnectionError):
    """Could not connect, or the connection broke before the answer came."""


class RpcTimeoutError(RpcError, TimeoutError):
    """No answer within the request timeout."""


class RpcAuthenticationError(RpcConnectionError):
    """The peer refused this server's SASL authentication (wrong user name or
    password, a mechanism it does not offer)."""

    def __init__(self, error: ErrorCode, message: str) -> None:
        super().__init__(f"{error.name}: {message}")
        self.error = error


class RpcErrorResponse(RpcError):
    """The peer answered with a whole-request error (unknown API, bad version...)."""

    def __init__(self, error: ErrorCode, message: str) -> None:
        super().__init__(f"{error.name}: {message}")
        self.error = error
        self.message = message


class _BrokerFailures:
    """The exception for each failure of an outgoing peer connection (brokers and
    controllers alike)."""

    def connection(self, message: str, *, reason: str | None = None) -> Exception:
        return RpcConnectionError(message)

    def timeout(self, message: str) -> Exception:
        return RpcTimeoutError(message)

    def answer(self, error: ErrorCode, message: str) -> Exception:
        if error in _SASL_REFUSALS:  # only the SASL exchange answers these
            return RpcAuthenticationError(error, message)
        return RpcErrorResponse(error, message)


RPC_FAILURES = _BrokerFailures()  # outgoing peer connections raise Rpc* errors
# "name at host:port" -> when its refused SASL authentication was last logged.
_auth_logged_at: dict[str, float] = {}


async def retry_until(deadline: float, send: Callable[[], Awaitable[Message]]) -> Message:
    """`send()`, retried on connection failures and timeouts until `deadline`
    (time.monotonic()); the last error is raised once it has passed."""
    while True:
        try:
            return await send()
        except (RpcConnectionError, RpcTimeoutError):
            if time.monotonic() >= deadline:
                raise
            # A reconnect sleeps out its backoff; avoid a hot loop anyway.
            await asyncio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))


class RpcClient:
    """A connection to one peer, reopened after a failure. Not thread-safe; one event loop."""

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
        tls: ssl.SSLContext | None = None,
        sasl: SaslCredentials | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.name = name  # for log lines: "controller", "leader 2"
        self.request_timeout_s = request_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._client_id = client_id
        self._max_in_flight = max_in_flight
        self._faults = faults
        self.peer_id = peer_id  # what test fault rules match (-1: unknown)
        self._tls = tls
        self._sasl = sasl  # this server's user, or None: no SASL
        self._connect_lock = asyncio.Lock()
        self._conn: PipelinedConnection | None = None
        self._backoff_s = 0.0
        self._next_attempt = 0.0
        self._closed = False

    @property
    def peer(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def connected(self) -> bool:
        return self._conn is not None and self._conn.connected

    async def request(self, body: Message, *, timeout_s: float | None = None) -> Message:
        """Send one request and return the response body."""
        spec = API_BY_REQUEST_TYPE[type(body)]
        timeout = self.request_timeout_s if timeout_s is None else timeout_s
        loop = asyncio.get_running_loop()
        fault = None
        fault_s = 0.0  # time a test fault held the request: part of its timeout
        if self._faults.enabled:
            started = loop.time()
            fault = await self._injected_fault(int(spec.key), spec.key.name, timeout)
            fault_s = loop.time() - started
        conn = await self._ensure_connected()
        response = await conn.send(body, timeout_s=max(0.0, timeout - fault_s))
        if fault == DROP_RESPONSE:
            conn.abort(f"test fault: dropped the connection to {conn.peer}")
            raise RpcConnectionError(
                f"test fault: the answer to {spec.key.name} from {self.name} at "
                f"{self.peer} was dropped"
            )
        invariant(response is not None, "a request expecting an answer got one")
        return response  # type: ignore[return-value]

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
        return await retry_until(deadline, lambda: self.request(body, timeout_s=timeout_s))

    def drop_connection(self, reason: str) -> bool:
        """Abort the open connection (its pending requests fail with `reason`); the
        next request reconnects, after the usual backoff. True if one was open."""
        conn = self._conn
        if conn is None or not conn.connected:
            return False
        conn.abort(reason)
        return True

    async def close(self) -> None:
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    # ------------------------------------------------------------------ internals

    async def _ensure_connected(self) -> PipelinedConnection:
        conn = self._conn
        if conn is not None and conn.connected:
            return conn
        async with self._connect_lock:
            conn = self._conn
            if conn is not None and conn.connected:
                return conn
            if conn is not None:
                # The last connection broke: back off as after a failed connect, so a
                # peer that accepts and drops at once is not hammered.
                self._back_off(conn.closed_at)
                self._conn = None
            if self._closed:
                raise RpcConnectionError(f"connection to {self.name} at {self.peer} is closed")
            wait = self._next_attempt - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            conn = PipelinedConnection(
                self.host,
                self.port,
                peer=f"{self.name} at {self.peer}",
                failures=RPC_FAILURES,
                client_id=self._client_id,
                request_timeout_s=self.request_timeout_s,
                connect_timeout_s=self.connect_timeout_s,
                max_in_flight=self._max_in_flight,
                tls=self._tls,
                sasl=self._sasl,
            )
            try:
                await conn.connect()
            except RpcAuthenticationError as exc:
                self._auth_refused(exc)
                raise
            except RpcConnectionError:
                self._back_off(conn.closed_at)
                raise
            self._backoff_s = 0.0
            self._conn = conn
            return conn

    def _auth_refused(self, exc: RpcAuthenticationError) -> None:
        self._backoff_s = MAX_BACKOFF_S
        now = time.monotonic()
        self._next_attempt = now + AUTH_BACKOFF_S
        # Per peer, not per client: a broker opens several clients to one controller.
        where = f"{self.name} at {self.peer}"
        if now - _auth_logged_at.get(where, -AUTH_LOG_INTERVAL_S) >= AUTH_LOG_INTERVAL_S:
            if len(_auth_logged_at) >= 1024:  # bounded, as every table
                _auth_logged_at.clear()
            _auth_logged_at[where] = now
            log.error(
                "SASL authentication to %s at %s failed: %s; check this server's "
                "--sasl-server-username and its password (--sasl-server-password-file or "
                "$%s), and that the user exists; retrying every %g s",
                self.name,
                self.peer,
                exc,
                SERVER_PASSWORD_ENV,
                AUTH_BACKOFF_S,
            )

    def _back_off(self, failed_at: float | None) -> None:
        self._backoff_s = min(MAX_BACKOFF_S, max(INITIAL_BACKOFF_S, self._backoff_s * 2))
        since = time.monotonic() if failed_at is None else failed_at
        self._next_attempt = since + self._backoff_s * random.uniform(0.8, 1.2)
