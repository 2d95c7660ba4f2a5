"""One outgoing request/response connection: the asyncio glue around the sans-I/O
`protocol.connection.ClientConnection`, shared by the peer RPC client
(runtime/peer_rpc.py: follower fetches, the controller channel, quorum peers) and
the client library's BrokerConnection (client/connection.py).

The rules, the same for both:

- pipelining: each request gets a future keyed by its correlation id; responses come
  back in request order and resolve them;
- bounded: at most `max_in_flight` requests wait for an answer; waiting for a slot
  counts against the request's timeout;
- a request with no answer within its timeout fails and closes the connection, as
  Kafka's client does: every later response would queue behind the lost one, so a
  fresh connection is the only safe state;
- a dropped, closed or undecodable connection fails every pending request, so no
  caller waits forever;
- backpressure: while the socket's write buffer is above its high-water mark a sender
  waits until it drains;
- a request sent without expecting an answer (Produce acks=0) returns once written;
- SASL (issue 18): given credentials, `connect` authenticates (SaslHandshake, then
  SaslAuthenticate: SCRAM's two steps, checking the server's signature, or PLAIN's one)
  before the connection is handed out; a refusal closes it and raises the failures'
  `answer` error with SASL_AUTHENTICATION_FAILED (or the handshake's code), naming the
  peer and the user, never the password.

A connection is used once: after it closes, open a new one (runtime/peer_rpc.py reconnects
with a backoff; the client library's metadata layer opens a new one). What differs
between the users is only which exceptions they raise: an `RpcFailures` turns each
failure into the caller's error type.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from collections.abc import Callable
from typing import NamedTuple
from typing import Protocol

from protocol.api import api_name
from protocol.connection import ClientConnection
from protocol.connection import Response
from protocol.errors import DecodeError
from protocol.errors import ErrorCode
from protocol.framing import DEFAULT_MAX_FRAME_SIZE
from protocol.invariants import invariant
from protocol.messages import API_BY_REQUEST_TYPE
from protocol.messages import Message
from protocol.messages import SaslAuthenticateRequest
from protocol.messages import SaslAuthenticateResponse
from protocol.messages import SaslHandshakeRequest
from protocol.messages import SaslHandshakeResponse
from runtime.sasl import PLAIN
from runtime.sasl import SaslCredentials
from runtime.sasl import ScramClient

log = logging.getLogger(__name__)

CLOSE_WAIT_S = 1.0  # how long close() waits for the socket to go before aborting it


def set_no_delay(sock: socket.socket | None) -> None:
    """TCP_NODELAY on a TCP socket: a request or answer leaves at once instead of
    waiting for the peer's ACK of the last small write (Nagle + delayed ACK would add
    up to 40 ms to a small frame). asyncio and uvloop set it on their TCP transports
    today; every connection of ours states it rather than rely on that."""
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class RpcFailures(Protocol):
    """Builds the exception a connection's user raises for each kind of failure."""

    def connection(self, message: str, *, reason: str | None = None) -> Exception:
        """Could not connect, or the connection is closed, broke or was dropped."""
        ...

    def timeout(self, message: str) -> Exception:
        """No answer (or no free in-flight slot) within the request's timeout."""
        ...

    def answer(self, error: ErrorCode, message: str) -> Exception:
        """The peer answered with a whole-request error code."""
        ...


class _Pending(NamedTuple):
    future: asyncio.Future[Message]
    timer: asyncio.TimerHandle | None
    holds_slot: bool


class _ConnectionEvents:
    """What both protocols pass to their PipelinedConnection besides received bytes."""

    def __init__(self, owner: PipelinedConnection) -> None:
        self._owner = owner

    def connection_lost(self, exc: Exception | None) -> None:
        self._owner._on_lost(exc)

    def pause_writing(self) -> None:
        self._owner._paused = True

    def resume_writing(self) -> None:
        self._owner._on_resume()


class _Protocol(_ConnectionEvents, asyncio.Protocol):
    """A TLS connection's protocol: the SSL transport hands over decrypted bytes."""

    def data_received(self, data: bytes) -> None:
        self._owner._on_data(data)


class _ReadIntoProtocol(_ConnectionEvents, asyncio.BufferedProtocol):
    """A plaintext connection's protocol: the transport reads into the response
    decoder (a large response, a fetch's 1 MiB of batches, straight into its own
    buffer: one copy, by the kernel)."""

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._owner._protocol.receive_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        self._owner._on_read_into(nbytes)


class PipelinedConnection:
    """A pipelined request/response connection to one server. One event loop."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        peer: str,
        failures: RpcFailures,
        client_id: str | None,
        request_timeout_s: float,
        connect_timeout_s: float,
        max_in_flight: int,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        connect_hint: str = "",
        tls: ssl.SSLContext | None = None,
        sasl: SaslCredentials | None = None,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        self.host = host
        self.port = port
        self.peer = peer  # for messages: "broker 2 at 127.0.0.1:9092", "controller at ..."
        self.request_timeout_s = request_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._failures = failures
        self._connect_hint = connect_hint  # appended to "cannot connect" messages
        self._tls = tls  # None: plaintext (runtime/tls.py makes the contexts)
        self._sasl = sasl  # None: no SASL
        self._protocol = ClientConnection(client_id, max_frame_size=max_frame_size)
        self._transport: asyncio.Transport | None = None
        self._pending: dict[int, _Pending] = {}
        self._slots = asyncio.Semaphore(max_in_flight)
        self._paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._closed = False
        self._lost = asyncio.Event()
        self._close_reason: str | None = None
        self.closed_at: float | None = None  # time.monotonic() when it closed or failed

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.peer} {'open' if self.connected else 'closed'}>"

    @property
    def connected(self) -> bool:
        return self._transport is not None and not self._closed

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    # ---------------------------------------------------------------- lifecycle

    async def connect(self) -> None:
        if self._transport is not None or self._closed:
            raise self._failures.connection(
                f"connection to {self.peer} was already used; open a new one"
            )
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                transport, _ = await loop.create_connection(
                    self._new_protocol,
                    self.host,
                    self.port,
                    ssl=self._tls,
                    server_hostname=self.host if self._tls is not None else None,
                    ssl_handshake_timeout=self.connect_timeout_s if self._tls else None,
                )
        except TimeoutError:
            self._mark_closed()
            why = f"timed out after {int(self.connect_timeout_s * 1000)} ms"
            raise self._cannot_connect(why) from None
        except ssl.SSLError as exc:
            self._mark_closed()
            why = f"TLS handshake failed: {exc}"
            if isinstance(exc, ssl.SSLCertVerificationError):
                why += " (is the server's certificate signed by the CA file given, for this host?)"
            else:
                why += " (does the server listen with SSL on this port?)"
            raise self._cannot_connect(why) from exc
        except OSError as exc:
            self._mark_closed()
            raise self._cannot_connect(exc.strerror or str(exc) or type(exc).__name__) from exc
        # uvloop's transports are not asyncio.Transport subclasses; same interface.
        self._transport = transport  # type: ignore[assignment]
        set_no_delay(transport.get_extra_info("socket"))
        log.debug("connected to %s", self.peer)
        if self._sasl is not None:
            try:
                await self._authenticate(self._sasl)
            except BaseException:
                await self.close()
                raise

    async def _authenticate(self, sasl: SaslCredentials) -> None:
        """SaslHandshake then SaslAuthenticate, before anything else is sent."""
        answer = await self.send(SaslHandshakeRequest(mechanism=sasl.mechanism))
        assert isinstance(answer, SaslHandshakeResponse)
        if answer.error_code != ErrorCode.NONE:
            raise self._failures.answer(
                ErrorCode.of(answer.error_code),
                f"{self.peer} does not offer SASL {sasl.mechanism} (it offers "
                f"{', '.join(answer.mechanisms) or 'no SASL'}): check the listener's "
                "--sasl-enabled-mechanisms and security protocol",
            )
        if sasl.mechanism == PLAIN:
            await self._sasl_step(sasl, f"\0{sasl.username}\0{sasl.password}".encode())
            return
        scram = ScramClient(sasl.mechanism, sasl.username, sasl.password)
        server_first = await self._sasl_step(sasl, scram.first())
        try:
            server_final = await self._sasl_step(sasl, scram.final(server_first))
            scram.verify(server_final)
        except ValueError as exc:  # a server that cannot prove it has the user's keys
            raise self._failures.answer(
                ErrorCode.SASL_AUTHENTICATION_FAILED, f"{self.peer}: {exc}"
            ) from None

    async def _sasl_step(self, sasl: SaslCredentials, token: bytes) -> bytes:
        answer = await self.send(SaslAuthenticateRequest(auth_bytes=token))
        assert isinstance(answer, SaslAuthenticateResponse)
        if answer.error_code != ErrorCode.NONE:
            raise self._failures.answer(
                ErrorCode.of(answer.error_code),
                f"{self.peer} refused user {sasl.username!r} ({sasl.mechanism}): "
                f"{answer.error_message or ''}",
            )
        return bytes(answer.auth_bytes)

    def _cannot_connect(self, why: str) -> Exception:
        hint = f"; {self._connect_hint}" if self._connect_hint else ""
        return self._failures.connection(f"cannot connect to {self.peer}: {why}{hint}", reason=why)

    async def close(self) -> None:
        """Close, failing pending requests; waits (bounded) until the socket is gone."""
        if self._transport is None:
            self._mark_closed()
            return
        self.abort(f"connection to {self.peer} was closed by the client", graceful=True)
        try:
            async with asyncio.timeout(CLOSE_WAIT_S):
                await self._lost.wait()
        except TimeoutError:
            self._transport.abort()

    def abort(self, reason: str, *, graceful: bool = False) -> None:
        """Close now: every pending request fails with `reason`."""
        if self._closed:
            return
        self._mark_closed()
        self._close_reason = reason
        if self._transport is not None:
            if graceful:
                self._transport.close()
            else:
                self._transport.abort()
        self._fail_all(reason)

    def _mark_closed(self) -> None:
        self._closed = True
        if self.closed_at is None:
            self.closed_at = time.monotonic()

    def _fail_all(self, reason: str) -> None:
        pending, self._pending = self._pending, {}
        for entry in pending.values():
            self._finish(entry)
            if not entry.future.done():
                entry.future.set_exception(self._failures.connection(reason))
                if not entry.holds_slot:  # fire-and-forget (acks=0): nobody awaits it
                    entry.future.exception()
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_exception(self._failures.connection(reason))

    def _finish(self, entry: _Pending) -> None:
        if entry.timer is not None:
            entry.timer.cancel()
        if entry.holds_slot:
            self._slots.release()

    # ---------------------------------------------------------------- requests

    async def send(
        self, request: Message, *, timeout_s: float | None = None, expect_response: bool = True
    ) -> Message | None:
        """Send `request` and return the decoded response body.

        A whole-request error code raises the failures' `answer` error; per-partition
        error codes stay in the body for the caller. `expect_response=False` (Produce
        with acks=0) returns None as soon as the bytes are written."""
        if not self.connected:
            raise self._closed_error()
        timeout = self.request_timeout_s if timeout_s is None else timeout_s
        loop = asyncio.get_running_loop()
        holds_slot = expect_response
        if holds_slot:
            try:
                async with asyncio.timeout(timeout):
                    await self._slots.acquire()
            except TimeoutError:
                raise self._failures.timeout(
                    f"{self.in_flight} requests to {self.peer} still unanswered "
                    f"after {int(timeout * 1000)} ms; the peer may be overloaded"
                ) from None
            if not self.connected:
                self._slots.release()
                raise self._closed_error()
        correlation_id, data = self._protocol.send_request(request)
        future: asyncio.Future[Message] = loop.create_future()
        timer = None
        if holds_slot:
            timer = loop.call_later(timeout, self._on_timeout, correlation_id, request, timeout)
        self._pending[correlation_id] = _Pending(future, timer, holds_slot)
        invariant(self._transport is not None, "a connected connection has a transport")
        self._transport.write(data)  # type: ignore[union-attr]
        if self._paused:
            await self._wait_drained(timeout)
        if not expect_response:
            return None
        return await future

    def _closed_error(self) -> Exception:
        if self._close_reason is not None:
            return self._failures.connection(
                f"connection to {self.peer} is closed ({self._close_reason})"
            )
        return self._failures.connection(f"connection to {self.peer} is not open")

    async def _wait_drained(self, timeout: float) -> None:
        """Wait until the write buffer drains; bounded, because a peer that never
        reads would otherwise hold a request without an answer timer (acks=0) forever."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._drain_waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except TimeoutError:
            why = f"{self.peer} read nothing for {int(timeout * 1000)} ms"
            self.abort(f"connection to {self.peer} closed: {why}")
            raise self._failures.timeout(f"{why}; closing the connection") from None

    def _on_resume(self) -> None:
        self._paused = False
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _on_timeout(self, correlation_id: int, request: Message, timeout: float) -> None:
        entry = self._pending.pop(correlation_id, None)
        if entry is None:
            return
        self._finish(entry)
        api = api_name(int(API_BY_REQUEST_TYPE[type(request)].key))
        error = self._failures.timeout(
            f"no answer from {self.peer} to {api} within {int(timeout * 1000)} ms "
            f"(correlation id {correlation_id}); closing the connection"
        )
        if not entry.future.done():
            entry.future.set_exception(error)
        log.warning("%s", error)
        # Responses come in order: the ones behind this request are stuck too.
        self.abort(
            f"connection to {self.peer} closed: an earlier request got no answer "
            f"within {int(timeout * 1000)} ms"
        )

    # ---------------------------------------------------------------- transport events

    def _new_protocol(self) -> asyncio.BaseProtocol:
        return _Protocol(self) if self._tls is not None else _ReadIntoProtocol(self)

    def _on_data(self, data: bytes) -> None:
        if not self._closed:
            self._on_responses(lambda: self._protocol.receive_data(data))

    def _on_read_into(self, nbytes: int) -> None:
        if not self._closed:
            self._on_responses(lambda: self._protocol.received_into(nbytes))

    def _on_responses(self, receive: Callable[[], list[Response]]) -> None:
        try:
            responses = receive()
        except DecodeError as exc:
            log.warning("bad response stream from %s: %s; closing", self.peer, exc)
            self.abort(f"undecodable response from {self.peer}: {exc}")
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
                    self._failures.answer(response.error_code, response.error_message)
                )
                if not entry.holds_slot:
                    entry.future.exception()
            else:
                invariant(response.body is not None, "a response without error has a body")
                entry.future.set_result(response.body)  # type: ignore[arg-type]

    def _on_lost(self, exc: Exception | None) -> None:
        self._lost.set()
        if self._closed:
            return
        why = f": {exc}" if exc else " by the server"
        log.info("connection to %s lost%s", self.peer, why)
        self.abort(f"connection to {self.peer} lost{why}")
