"""The one asyncio server of every process (broker listeners and the controller):
one server per listener, one protocol.connection.ServerConnection per client
connection, one handler signature `handler(ctx: RequestContext, body) -> response`.

Each request runs as its own task so that a long-polling Fetch does not stall the
loop; ServerConnection releases the responses in request order. Bounds (the rules live
in protocol/connection.py and protocol/connection_limits.py; this file only applies
them):
- per process, all listeners together (one ConnectionTable): max connections, max
  connections per IP; a new connection over the total displaces the oldest one that
  has sent no request;
- per connection (ServerConnection): frames up to max_frame_bytes (a larger length
  closes the connection), at most max_in_flight requests in service, and at most
  max_pending_bytes held for it (request frames in service, the record bytes each
  Fetch may return, reserved before it reads a byte, and answers not yet sent).
  Reading pauses while a request cannot start, and while the transport's write
  buffer is above its high-water mark: a client that does not read its answers
  makes the broker hold one more response at most, never one per request it sent;
- deadlines, checked by a sweep: a request frame must complete within the frame
  timeout of its first byte, and a connection idle for connections.max.idle.ms
  is closed. Closures and refusals are logged at most once per kind every 10 s,
  with a count of the rest.

Bad input never takes the server down: an unknown API or version gets its error
response (ServerConnection builds it), a malformed frame closes only its connection
with a log line, and a handler that raises answers UNKNOWN_SERVER_ERROR (or what the
process's `error_answer` maps the exception to: the controller answers
KAFKA_STORAGE_ERROR when its metadata log failed).

TLS (a listener given an SSLContext, runtime/tls.py): every byte read goes through the
connection's ServerTls and every answer out of it; a request is read only once the
handshake is done, within HANDSHAKE_TIMEOUT_S of connecting. A handshake that fails (a
plaintext client on a TLS port, say) closes the connection with one log line saying
why. The peer's certificate, if it sent one, names the connection's principal.

SASL (a listener given a SaslConfig, runtime/sasl.py): until the connection's
SaslSession has authenticated a user, only ApiVersions, SaslHandshake and
SaslAuthenticate are served (and the config's `certificate_apis` to a peer that showed
a verified TLS client certificate); any other request closes the connection with a line
saying so, as does a failed authentication (after its answer). After Kafka's
SaslHandshake v0 every frame is a raw SASL token (KIP-43) until the exchange ends, and
is answered as one; a frame that is no good token (a request sent meanwhile, a
SaslAuthenticate) fails the exchange the same way, unanswered, as Kafka does: a raw
exchange has no way to say an error. Then the user is the connection's principal.
The connection table classifies such a connection by its first request after the
exchange (a broker's first broker API), not by the exchange.

Quotas (a listener given RequestQuotas: the broker's broker/quota_enforcement.py): while
any quota exists, each request's handler is timed step by step (runtime/request_time.py)
and charged after it ran; a throttled request is answered at once with its
throttle_time_ms, and then the connection is muted as KIP-219 has it: nothing more is
read from it, and no request already read starts, until the throttle time has passed
(reading pauses the same way as for the bounds above; the quota bounds the time).

Test faults (runtime/faults.py, only with --enable-test-faults) act before a handler
runs: they may delay or park the request, drop it (the connection is closed without
an answer), or let it run and close the connection instead of answering.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from protocol.api import ApiKey
from protocol.api import api_name as _api_name
from protocol.connection import NATIVE
from protocol.connection import Buffer
from protocol.connection import CloseReason
from protocol.connection import RejectedRequest
from protocol.connection import Request
from protocol.connection import SaslToken
from protocol.connection import WireCodec
from protocol.connection_limits import ConnectionLimits
from protocol.connection_limits import ConnectionSlot
from protocol.connection_limits import ConnectionTable
from protocol.errors import DecodeError
from protocol.errors import ErrorCode
from protocol.framing import read_scratch
from protocol.messages import Message
from protocol.messages import SaslAuthenticateRequest
from protocol.messages import SaslAuthenticateResponse
from protocol.messages import SaslHandshakeRequest
from protocol.messages import SaslHandshakeResponse
from runtime.acl import NotAuthorizedError
from runtime.faults import DROP
from runtime.faults import DROP_RESPONSE
from runtime.faults import Faults
from runtime.request_time import TimedSteps
from runtime.rpc import set_no_delay
from runtime.sasl import MAX_UNAUTHENTICATED_FRAME_BYTES
from runtime.sasl import Lookup
from runtime.sasl import SaslSession
from runtime.tls import ANONYMOUS
from runtime.tls import HANDSHAKE_TIMEOUT_S
from runtime.tls import ServerTls
from runtime.tls import handshake_failure
from runtime.tls import principal_of

log = logging.getLogger(__name__)

_SASL_APIS = frozenset({int(ApiKey.SASL_HANDSHAKE), int(ApiKey.SASL_AUTHENTICATE)})
WRITE_BUFFER_HIGH = 8 * 1024 * 1024
WRITE_BUFFER_LOW = 1024 * 1024


@dataclass(frozen=True)
class SaslConfig:
    """A SASL listener: the mechanisms it offers and where credentials come from."""

    mechanisms: tuple[str, ...]
    lookup: Lookup
    # Served before SASL to a connection whose TLS client certificate the listener
    # verified (its principal is not ANONYMOUS): the controllers' quorum APIs, whose
    # peers cannot use SCRAM (a new voter has no credentials yet).
    certificate_apis: frozenset[int] = frozenset()


@dataclass(frozen=True)
class RequestContext:
    """What a handler knows about where a request came from."""

    listener: str
    peer: str
    client_id: str | None
    api_version: int  # of the listener's protocol
    protocol: str = "native"  # the listener's wire protocol: "native" or "kafka"
    principal: str = ANONYMOUS  # who the peer proved to be (a TLS client certificate)


Handler = Callable[[RequestContext, Message], Awaitable[Message]]


class RequestQuotas(Protocol):
    """Client quotas as a listener applies them (broker/quota_enforcement.py)."""

    def active(self) -> bool:
        """Any quota at all: else requests are neither timed nor charged."""
        ...

    def admit(self, ctx: RequestContext, request: Message) -> None:
        """Before the handler: may narrow the request (a Fetch's max_bytes)."""
        ...

    def charge(
        self,
        ctx: RequestContext,
        api_key: int,
        request: Message,
        response: Message,
        handle_s: float,
    ) -> int:
        """After the handler: the throttle time in ms (0: none), set in `response`."""
        ...


# An exception a process answers with its own error code instead of
# UNKNOWN_SERVER_ERROR: (code, message), or None for the default.
ErrorAnswer = Callable[[Exception], "tuple[ErrorCode, str] | None"]


async def sasl_out_of_turn(ctx: RequestContext, req: Message) -> Message:
    """A SaslHandshake or SaslAuthenticate with no exchange to take it: on a listener
    without SASL, or once the connection has authenticated (no re-authentication,
    KIP-368). ILLEGAL_SASL_STATE; the connection stays. Brokers and controllers alike."""
    why = (
        f"listener {ctx.listener} does not use SASL"
        if ctx.principal == ANONYMOUS
        else f"already authenticated as {ctx.principal}"
    )
    if isinstance(req, SaslHandshakeRequest):
        return SaslHandshakeResponse(error_code=int(ErrorCode.ILLEGAL_SASL_STATE))
    return SaslAuthenticateResponse(
        error_code=int(ErrorCode.ILLEGAL_SASL_STATE), error_message=f"SASL: {why}"
    )


class _Connection(asyncio.BufferedProtocol):
    """One client connection. The transport reads into the connection's frame
    decoder (a large request straight into its own buffer, protocol/framing.py); TLS
    bytes are read into a scratch buffer and decrypted as before."""

    def __init__(self, server: ListenerServer) -> None:
        self._server = server
        self._conn = server.table.limits.server_connection(
            time.monotonic(),
            api_filter=server.serves,
            response_reservation=server.response_reservation,
            codec=server.codec,
        )
        self._slot: ConnectionSlot | None = None
        self._transport: asyncio.Transport | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._peer = "?"
        self._reading_paused = False
        self._writing_paused = False
        self._closed = False
        self._tls = ServerTls(server.tls) if server.tls is not None else None
        sasl = server.sasl
        self._sasl = SaslSession(sasl.mechanisms, sasl.lookup) if sasl is not None else None
        if sasl is not None:  # raised to the listener's bound once the peer is proven
            self._conn.max_frame_size = min(
                MAX_UNAUTHENTICATED_FRAME_BYTES, server.table.limits.max_frame_bytes
            )
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._mute_timer: asyncio.TimerHandle | None = None  # throttled until it fires
        self._muted_until = 0.0
        self.principal = ANONYMOUS

    # ------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; same interface.
        self._transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self._peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        server = self._server
        now = time.monotonic()
        admission = server.table.open(
            str(peer[0]) if isinstance(peer, tuple) else str(peer),
            f"{self._peer} on {server.name}",
            now,
            conn=self._conn,
            close=self.close,
            unsent=transport.get_write_buffer_size,  # type: ignore[attr-defined]
        )
        for event in (admission.evicted, admission.refused):
            if event is not None:
                server.log_event(event, now)
        if admission.slot is None:
            self._closed = True
            transport.abort()
            return
        self._slot = admission.slot
        set_no_delay(transport.get_extra_info("socket"))
        # Never more unsent than the connection may hold in all.
        high = min(WRITE_BUFFER_HIGH, server.table.limits.max_pending_bytes)
        self._transport.set_write_buffer_limits(high=high, low=min(WRITE_BUFFER_LOW, high // 4))
        self._server.connections.add(self)
        if self._tls is not None:
            self._handshake_timer = asyncio.get_running_loop().call_later(
                HANDSHAKE_TIMEOUT_S,
                self._tls_failed,
                TimeoutError(f"no TLS handshake within {HANDSHAKE_TIMEOUT_S:g} s"),
            )

    def _tls_failed(self, exc: BaseException) -> None:
        """The handshake failed or timed out: one (rate-limited) line, and the
        connection closes after what is buffered, the alert saying why included."""
        if not self._closed:
            # Rate-limited like every closure: a flood of plaintext clients is a line
            # every 10 s with a count, not a line each.
            reason = CloseReason(
                "tls-handshake",
                f"closing connection from {self._peer} on {self._server.name}: TLS "
                f"handshake failed: {handshake_failure(exc)}",
            )
            self._server.log_event(reason, time.monotonic())
        self.close(graceful=True)

    def _from_tls(self, tls: ServerTls, data: bytes) -> list[bytes] | None:
        """The plaintext chunks `data` carried (None: the connection was closed)."""
        was_established = tls.established
        try:
            plaintext = tls.receive(data)
        except ssl.SSLError as exc:
            alert = tls.outgoing()  # the TLS alert that tells the peer why
            if alert and self._transport is not None:
                self._transport.write(alert)
            if was_established:
                self._log_closing("bad-tls-record", f"bad TLS record: {exc}")
                self.close()
            else:
                self._tls_failed(exc)
            return None
        out = tls.outgoing()
        if out and self._transport is not None:
            self._transport.write(out)  # handshake answers, alerts
        if tls.established and not was_established:
            if self._handshake_timer is not None:
                self._handshake_timer.cancel()
            self.principal = principal_of(tls.peer_certificate())
        if tls.closed_by_peer:
            self.close(graceful=True)  # our close_notify goes out first
            return None
        return plaintext

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._tls is not None:
            return read_scratch()  # TLS records, decrypted in buffer_updated
        return self._conn.receive_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        if self._closed:
            return
        if self._tls is not None:
            plaintext = self._from_tls(self._tls, bytes(read_scratch()[:nbytes]))
            if not plaintext:
                return
            self._conn.receive_chunks(plaintext, time.monotonic())  # not joined: no copy
        else:
            self._conn.received_into(nbytes, time.monotonic())
        self._process()

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        if self._mute_timer is not None:
            self._mute_timer.cancel()
        self._forget()
        for task in self._tasks:
            task.cancel()

    def _forget(self) -> None:
        self._server.connections.discard(self)
        if self._slot is not None:
            self._server.table.release(self._slot)

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._update_reading()
        self._process()

    # ------------------------------------------------------------ request flow

    def _process(self) -> None:
        """Turn buffered frames into handler tasks until the in-flight bound."""
        conn = self._conn
        server = self._server
        while not self._closed and not self._writing_paused and self._mute_timer is None:
            try:
                event = conn.next_event(self._unsent())
            except DecodeError as exc:
                if self._sasl is not None and self._sasl.authenticated is None:
                    self._refuse_before_authentication(f"a bad frame ({exc})")
                    return
                self._log_closing("malformed-stream", f"malformed request stream: {exc}")
                self.close()
                return
            if event is None:
                break
            assert self._slot is not None  # events come only after an admitted connect
            sasl = self._sasl
            if isinstance(event, SaslToken):
                assert sasl is not None  # raw tokens only follow this listener's handshake
                self._raw_sasl_token(sasl, event)
                continue
            if sasl is not None and sasl.authenticated is None:
                # Not classified by the SASL exchange: a broker's first request is a
                # SaslHandshake, its first broker API comes once it is proven.
                if not self._before_authentication(sasl, event):
                    continue
                if event.header.api_key != ApiKey.API_VERSIONS:
                    refused = server.table.on_request(self._slot, event.header.api_key)
                else:
                    refused = None
            else:
                refused = server.table.on_request(self._slot, event.header.api_key)
            if refused is not None:
                server.log_event(refused, time.monotonic())
                self.close()
                return
            if isinstance(event, RejectedRequest):
                rejected = CloseReason(
                    "rejected-request",
                    f"rejected request from {self._peer} on {server.name} (client "
                    f"{event.header.client_id}, api {event.header.api_key} "
                    f"v{event.header.api_version}): {event.error.name} {event.message}",
                )
                server.log_event(rejected, time.monotonic())
                try:
                    self._write(conn.send_rejection_parts(event))
                except DecodeError as exc:  # the protocol cannot answer it: close
                    self._log_closing("unanswerable", str(exc))
                    self.close()
                    return
                continue
            task = asyncio.get_running_loop().create_task(self._handle(event))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self._update_reading()

    def _before_authentication(self, sasl: SaslSession, request: Request | RejectedRequest) -> bool:
        """A request on a SASL listener before a user is proven: True to serve it as
        usual (ApiVersions, its refusal too: a client learns the versions from it); else
        it was answered here (the SASL exchange) or the connection closed. A request
        that cannot be served (an unknown API, a version or body it cannot decode) is
        not answered: it would class the connection as a client's that spoke, which no
        newcomer displaces, so strangers could hold every slot without a password."""
        key = request.header.api_key
        if key == ApiKey.API_VERSIONS:
            return True
        if key in self._server.sasl_exempt_apis(self.principal):
            return True  # a peer proven by its certificate (a controller's quorum peers)
        if isinstance(request, RejectedRequest):
            self._refuse_before_authentication(
                f"{_api_name(key)} v{request.header.api_version} ({request.error.name}: "
                f"{request.message})"
            )
            return False
        body = request.body
        if isinstance(body, SaslHandshakeRequest):
            answer: Message = sasl.handshake(body.mechanism)
            if not sasl.failed and self._server.codec.raw_sasl_tokens_after(request.header):
                self._conn.raw_sasl_tokens = True  # from the next frame on
        elif isinstance(body, SaslAuthenticateRequest):
            answer = sasl.authenticate(body.auth_bytes)
        else:
            self._refuse_before_authentication(_api_name(key))
            return False
        self._write(self._conn.send_response_parts(request, answer))
        self._after_sasl_step(sasl, answer)
        return False

    def _log_closing(self, kind: str, why: str) -> None:
        """Log that this connection is being closed and why: at most a line per `kind`
        every 10 s with a count of the rest, as every closure (a stranger opening
        connections to send garbage must not write a line each)."""
        server = self._server
        reason = CloseReason(kind, f"closing connection from {self._peer} on {server.name}: {why}")
        server.log_event(reason, time.monotonic())

    def _refuse_before_authentication(self, what: str) -> None:
        """Close a connection that sent `what` before SASL authentication (logged, at
        most a line every 10 s)."""
        reason = CloseReason(
            "sasl-required",
            f"closing connection from {self._peer} on {self._server.name}: {what} before "
            "SASL authentication (the client must use SASL_PLAINTEXT or SASL_SSL with a user)",
        )
        self._server.log_event(reason, time.monotonic())
        self.close()

    def _raw_sasl_token(self, sasl: SaslSession, event: SaslToken) -> None:
        """A raw token after SaslHandshake v0: answered raw when it is good; a failure
        has no raw answer (Kafka just closes), only the log line."""
        answer = sasl.authenticate(event.token)
        if not sasl.failed:
            self._write(self._conn.send_sasl_token_parts(event, answer.auth_bytes))
        if sasl.authenticated is not None:
            self._conn.raw_sasl_tokens = False  # requests again from the next frame
        self._after_sasl_step(sasl, answer, " (a raw SASL token, after SaslHandshake v0)")

    def _after_sasl_step(self, sasl: SaslSession, answer: Message, context: str = "") -> None:
        """Once the answer is out: the principal when proven, or the close when failed."""
        if sasl.authenticated is not None:
            self.principal = f"User:{sasl.authenticated}"
            self._conn.max_frame_size = self._server.table.limits.max_frame_bytes
            log.info(
                "%s on %s: authenticated as %s (%s)",
                self._peer,
                self._server.name,
                sasl.authenticated,
                sasl.mechanism,
            )
        elif sasl.failed:
            code = ErrorCode.of(getattr(answer, "error_code", -1))
            why = getattr(answer, "error_message", None) or code.name
            reason = CloseReason(
                "sasl-failed",
                f"closing connection from {self._peer} on {self._server.name}: SASL "
                f"{sasl.mechanism or 'handshake'} failed: {why}{context}",
            )
            self._server.log_event(reason, time.monotonic())
            self.close(graceful=True)  # after the answer, so the client can say why

    async def _handle(self, request: Request) -> None:
        header = request.header
        server = self._server
        throttle_ms = 0
        refused: CloseReason | None = None  # a broker's slot whose broker API was refused
        try:
            fault = None
            if server.faults.enabled:
                fault = await server.faults.before_answer(server.name, header.api_key, request.body)
                if fault == DROP:
                    self.close()  # the request is lost: the sender sees the connection go
                    return
            handler = server.handlers.get(header.api_key)
            if handler is None and header.api_key in _SASL_APIS:
                handler = sasl_out_of_turn  # a SASL listener's process without its own
            assert handler is not None, "the listener serves only the APIs it has"
            ctx = RequestContext(
                server.name,
                self._peer,
                header.client_id,
                header.api_version,
                server.codec.name,
                self.principal,
            )
            quotas = server.quotas
            if quotas is not None and quotas.active():
                quotas.admit(ctx, request.body)
                timed = TimedSteps(handler(ctx, request.body))
                body = await timed
                throttle_ms = quotas.charge(ctx, header.api_key, request.body, body, timed.seconds)
            else:
                body = await handler(ctx, request.body)
            if fault == DROP_RESPONSE:
                self.close()  # served, but the answer is lost
                return
            out = self._conn.send_response_parts(request, body)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if isinstance(exc, NotAuthorizedError):
                known: tuple[ErrorCode, str] | None = (exc.code, str(exc))
                if self._slot is not None:
                    refused = server.table.on_refused(self._slot, header.api_key)
            else:
                known = server.error_answer(exc) if server.error_answer is not None else None
            if known is None:
                log.exception(
                    "handler for %s from %s (client %s) failed",
                    _api_name(header.api_key),
                    self._peer,
                    header.client_id,
                )
            if self._closed:
                return
            if known is None:
                known = (
                    ErrorCode.UNKNOWN_SERVER_ERROR,
                    f"{_api_name(header.api_key)} failed on the {server.role}: "
                    f"{type(exc).__name__}: {exc}",
                )
            try:
                out = self._conn.send_error_parts(request, *known)
            except DecodeError as exc:  # the protocol cannot answer it: close
                self._log_closing("unanswerable", str(exc))
                self.close()
                return
        self._write(out)
        if refused is not None:
            server.log_event(refused, time.monotonic())
            self.close(graceful=True)  # after the answer, so the peer can say why
            return
        if throttle_ms > 0:
            self._mute(throttle_ms / 1000)
        self._process()

    def _mute(self, seconds: float) -> None:
        """Read nothing more for `seconds` (KIP-219), or until a later mute ends."""
        loop = asyncio.get_running_loop()
        until = loop.time() + seconds
        if self._closed or until <= self._muted_until:
            return
        self._muted_until = until
        if self._mute_timer is not None:
            self._mute_timer.cancel()
        self._mute_timer = loop.call_at(until, self._unmute)
        self._update_reading()

    def _unmute(self) -> None:
        self._mute_timer = None
        self._update_reading()
        self._process()

    def _write(self, parts: list[Buffer]) -> None:
        if not parts or self._closed or self._transport is None:
            return
        if self._tls is None:
            # Scatter-gather: a fetched file slice goes to the socket as it was read.
            self._transport.writelines(parts)
            return
        for part in parts:
            self._tls.send(part)
        self._transport.write(self._tls.outgoing())

    def _unsent(self) -> int:
        transport = self._transport
        return 0 if transport is None else transport.get_write_buffer_size()

    def _update_reading(self) -> None:
        if self._closed or self._transport is None:
            return
        full = self._conn.blocked or self._writing_paused or self._mute_timer is not None
        if full and not self._reading_paused:
            self._reading_paused = True
            self._transport.pause_reading()
            self._conn.pause_clock()
        elif not full and self._reading_paused:
            self._reading_paused = False
            self._transport.resume_reading()
            self._conn.resume_clock(time.monotonic())

    def close(self, *, graceful: bool = False) -> None:
        """Drop the connection (`graceful`: after what is buffered has been sent)."""
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        if self._mute_timer is not None:
            self._mute_timer.cancel()
        if self._closed:
            return
        self._closed = True
        self._forget()
        for task in self._tasks:
            task.cancel()
        if self._transport is not None:
            if graceful:
                self._transport.close()
            else:
                self._transport.abort()


class ListenerServer:
    """The server socket of one listener and its connections. Listeners of one
    process share `table` (the per-process connection limits)."""

    def __init__(
        self,
        name: str,
        host: str,
        port: int,
        handlers: dict[int, Handler],
        *,
        table: ConnectionTable | None = None,
        response_reservation: Callable[[Message], int] | None = None,
        faults: Faults | None = None,
        error_answer: ErrorAnswer | None = None,
        role: str = "broker",
        codec: WireCodec = NATIVE,
        tls: ssl.SSLContext | None = None,
        sasl: SaslConfig | None = None,
        quotas: RequestQuotas | None = None,
    ) -> None:
        self.name = name
        self.quotas = quotas  # None: no client quotas (the controller)
        self.tls = tls  # None: plaintext
        self.sasl = sasl  # None: no SASL
        self.codec = codec  # the wire protocol this listener speaks
        self.host = host
        self.port = port
        self.handlers = handlers
        self.table = table if table is not None else ConnectionTable(ConnectionLimits())
        self.response_reservation = response_reservation
        self.role = role  # "broker" or "controller": named in error answers and logs
        self.faults = faults if faults is not None else Faults(role)
        self.error_answer = error_answer
        self.connections: set[_Connection] = set()
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None

    def sasl_exempt_apis(self, principal: str) -> frozenset[int]:
        """The APIs a connection of `principal` may use before SASL authentication
        (besides ApiVersions and the SASL APIs)."""
        if self.sasl is None or principal == ANONYMOUS:
            return frozenset()
        return self.sasl.certificate_apis

    def serves(self, api_key: int) -> bool:
        if self.sasl is not None and api_key in _SASL_APIS:
            return True
        return api_key in self.handlers

    def log_event(self, event: CloseReason, now: float) -> None:
        line = self.table.log_line(event, now)
        if line is not None:
            log.warning("%s", line)

    async def bind(self) -> int:
        """Bind and listen without accepting yet; return the bound port.
        Raises OSError (e.g. address in use)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self),
            self.host or None,
            self.port,
            start_serving=False,
            backlog=1024,
        )
        sockets = self._server.sockets
        self.port = sockets[0].getsockname()[1] if sockets else self.port
        return self.port

    async def start_serving(self) -> None:
        assert self._server is not None, "bind() first"
        await self._server.start_serving()
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def _sweep(self) -> None:
        """Close connections past a deadline (the table ignores calls closer together
        than half its interval, so every listener of a process may sweep it)."""
        interval = self.table.limits.sweep_interval_s()
        while True:
            await asyncio.sleep(interval)
            for line in self.table.sweep(time.monotonic()):
                log.warning("%s", line)

    def stop_accepting(self) -> None:
        if self._server is not None:
            self._server.close()

    async def close(self) -> None:
        """Stop accepting and drop every connection (their handler tasks are cancelled)."""
        self.stop_accepting()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        for conn in list(self.connections):
            conn.close()
        if self._server is not None:
            await self._server.wait_closed()
