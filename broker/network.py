"""Incoming connections: one asyncio server per listener, one ServerConnection per
client connection.

Each request runs as its own task so that a long-polling Fetch does not stall the
loop; ServerConnection releases the responses in request order. Bounds: at most
`max_in_flight` requests per connection (reading pauses when full and while the
transport's write buffer is above its high-water mark), frames up to
`max_frame_bytes` (a larger length closes that connection), `max_connections`
connections per process.

Bad input never takes the server down: an unknown API or version gets its error
response (ServerConnection builds it), a malformed frame closes only its connection
with a log line, and a handler that raises answers UNKNOWN_SERVER_ERROR.

Test faults (broker/faults.py, only with --enable-test-faults) act before a handler
runs: they may delay or park the request, drop it (the connection is closed without
an answer), or let it run and close the connection instead of answering.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from broker.faults import DROP, DROP_RESPONSE, NO_FAULTS, Faults
from protocol.api import ApiKey
from protocol.connection import Buffer, RejectedRequest, Request, ServerConnection
from protocol.errors import DecodeError, ErrorCode
from protocol.messages import Message

log = logging.getLogger(__name__)

WRITE_BUFFER_HIGH = 8 * 1024 * 1024
WRITE_BUFFER_LOW = 1024 * 1024


@dataclass(frozen=True)
class RequestContext:
    """What a handler knows about where a request came from."""

    listener: str
    peer: str
    client_id: str | None
    api_version: int


Handler = Callable[[RequestContext, Message], Awaitable[Message]]


class _Connection(asyncio.Protocol):
    def __init__(self, server: ListenerServer) -> None:
        self._server = server
        self._conn = ServerConnection(
            max_frame_size=server.max_frame_bytes,
            max_in_flight=server.max_in_flight,
            api_filter=server.serves,
        )
        self._transport: asyncio.Transport | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._peer = "?"
        self._reading_paused = False
        self._writing_paused = False
        self._closed = False

    # ------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; same interface.
        self._transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self._peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        if len(self._server.connections) >= self._server.max_connections:
            log.warning(
                "refusing connection from %s on %s: %d connections open (the limit)",
                self._peer,
                self._server.name,
                len(self._server.connections),
            )
            self._closed = True
            transport.abort()
            return
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH, low=WRITE_BUFFER_LOW)
        self._server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        self._conn.receive_data(data)
        self._process()

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._server.connections.discard(self)
        for task in self._tasks:
            task.cancel()

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
        while not self._closed and not self._writing_paused:
            try:
                event = conn.next_event()
            except DecodeError as exc:
                log.warning(
                    "closing connection from %s on %s: malformed request stream: %s",
                    self._peer,
                    self._server.name,
                    exc,
                )
                self.close()
                return
            if event is None:
                break
            if isinstance(event, RejectedRequest):
                log.info(
                    "rejected request from %s (client %s, api %d v%d): %s %s",
                    self._peer,
                    event.header.client_id,
                    event.header.api_key,
                    event.header.api_version,
                    event.error.name,
                    event.message,
                )
                self._write(conn.send_rejection_parts(event))
                continue
            task = asyncio.get_running_loop().create_task(self._handle(event))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self._update_reading()

    async def _handle(self, request: Request) -> None:
        header = request.header
        server = self._server
        try:
            fault = None
            if server.faults.enabled:
                fault = await server.faults.before_answer(server.name, header.api_key, request.body)
                if fault == DROP:
                    self.close()  # the request is lost: the sender sees the connection go
                    return
            handler = server.handlers[header.api_key]
            ctx = RequestContext(server.name, self._peer, header.client_id, header.api_version)
            body = await handler(ctx, request.body)
            if fault == DROP_RESPONSE:
                self.close()  # served, but the answer is lost
                return
            out = self._conn.send_response_parts(request, body)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception(
                "handler for %s from %s (client %s) failed",
                _api_name(header.api_key),
                self._peer,
                header.client_id,
            )
            if self._closed:
                return
            out = self._conn.send_error_parts(
                request,
                ErrorCode.UNKNOWN_SERVER_ERROR,
                f"{_api_name(header.api_key)} failed on the broker: {type(exc).__name__}: {exc}",
            )
        self._write(out)
        self._process()

    def _write(self, parts: list[Buffer]) -> None:
        # Scatter-gather: a fetched file slice goes to the socket as it was read.
        if parts and not self._closed and self._transport is not None:
            self._transport.writelines(parts)

    def _update_reading(self) -> None:
        if self._closed or self._transport is None:
            return
        full = self._conn.in_flight >= self._conn.max_in_flight or self._writing_paused
        if full and not self._reading_paused:
            self._reading_paused = True
            self._transport.pause_reading()
        elif not full and self._reading_paused:
            self._reading_paused = False
            self._transport.resume_reading()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._server.connections.discard(self)
        for task in self._tasks:
            task.cancel()
        if self._transport is not None:
            self._transport.abort()


def _api_name(api_key: int) -> str:
    try:
        return ApiKey(api_key).name
    except ValueError:
        return f"api {api_key}"


class ListenerServer:
    """The server socket of one listener and its connections."""

    def __init__(
        self,
        name: str,
        host: str,
        port: int,
        handlers: dict[int, Handler],
        *,
        max_in_flight: int = 100,
        max_frame_bytes: int = 100 * 1024 * 1024,
        max_connections: int = 10_000,
        faults: Faults = NO_FAULTS,
    ) -> None:
        self.name = name
        self.host = host
        self.port = port
        self.handlers = handlers
        self.max_in_flight = max_in_flight
        self.max_frame_bytes = max_frame_bytes
        self.max_connections = max_connections
        self.faults = faults
        self.connections: set[_Connection] = set()
        self._server: asyncio.Server | None = None

    def serves(self, api_key: int) -> bool:
        return api_key in self.handlers

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

    def stop_accepting(self) -> None:
        if self._server is not None:
            self._server.close()

    async def close(self) -> None:
        """Stop accepting and drop every connection (their handler tasks are cancelled)."""
        self.stop_accepting()
        for conn in list(self.connections):
            conn.close()
        if self._server is not None:
            await self._server.wait_closed()
