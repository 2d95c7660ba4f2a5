"""The asyncio glue between sockets and protocol.connection.ServerConnection.

Per connection: read, feed the sans-I/O connection, run each request as its own task
(a FetchMetadata long-poll does not hold up the requests behind it; responses still
leave in request order), write what the connection releases. Bad input never takes
the server down:
- a malformed stream (bad frame length, frame over the limit, broken header) closes
  that one connection with a log line;
- an unknown API or unsupported version gets an error response (the connection layer
  builds it);
- a handler that raises gets UNKNOWN_SERVER_ERROR (KAFKA_STORAGE_ERROR when the
  metadata log failed) and a log line with the traceback;
- at most `max_in_flight_per_connection` requests per connection are in progress:
  past that the connection is not read until responses go out.

With --enable-test-faults, controller/faults.py may delay or park a request before its
handler runs, drop it (the connection is closed unanswered) or drop its answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from controller.config import ControllerConfig
from controller.errors import MetadataLogWriteError
from controller.faults import DROP, DROP_RESPONSE
from controller.handlers import ControllerHandlers
from protocol.api import ApiKey
from protocol.connection import RejectedRequest, Request, ServerConnection
from protocol.errors import DecodeError, ErrorCode

log = logging.getLogger(__name__)

READ_CHUNK = 64 * 1024


def _api_name(api_key: int) -> str:
    try:
        return ApiKey(api_key).name
    except ValueError:
        return f"api {api_key}"


class _Client:
    """One accepted connection."""

    def __init__(
        self,
        server: ControllerServer,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        config = server.config
        self.conn = ServerConnection(
            max_frame_size=config.max_request_bytes,
            max_in_flight=config.max_in_flight_per_connection,
            api_filter=server.handlers.handlers.__contains__,
        )
        self.tasks: set[asyncio.Task[None]] = set()
        self.progress = asyncio.Event()

    def _write(self, data: bytes) -> None:
        if data and not self.writer.is_closing():
            self.writer.write(data)

    async def run(self) -> None:
        conn = self.conn
        try:
            while True:
                while True:
                    try:
                        event = conn.next_event()
                    except DecodeError as exc:
                        log.warning(
                            "closing connection from %s: malformed request: %s", self.peer, exc
                        )
                        return
                    if event is None:
                        break
                    if isinstance(event, RejectedRequest):
                        log.info(
                            "rejected a request from %s (%s, correlation id %d): %s %s",
                            self.peer,
                            event.header.client_id,
                            event.header.correlation_id,
                            event.error.name,
                            event.message,
                        )
                        self._write(conn.send_rejection(event))
                    else:
                        task = asyncio.create_task(self._serve(event))
                        self.tasks.add(task)
                        task.add_done_callback(self.tasks.discard)
                self.progress.clear()
                if conn.in_flight >= conn.max_in_flight:
                    # Bounded in-flight: stop reading until a response goes out.
                    await self.progress.wait()
                    continue
                await self.writer.drain()
                data = await self.reader.read(READ_CHUNK)
                if not data:
                    return
                conn.receive_data(data)
        except (ConnectionError, OSError) as exc:
            log.debug("connection from %s lost: %s", self.peer, exc)
        finally:
            await self.close()

    async def _serve(self, request: Request) -> None:
        api = request.header.api_key
        handler = self.server.handlers.handlers[api]
        faults = self.server.handlers.faults
        try:
            fault = None
            if faults.enabled:
                fault = await faults.before_answer(api, request.body)
                if fault == DROP:
                    self._abort()  # the request is lost: the sender sees the connection go
                    return
            body = await handler(request.body)
            if fault == DROP_RESPONSE:
                self._abort()  # served, but the answer is lost
                return
            out = self.conn.send_response(request, body)
        except MetadataLogWriteError as exc:
            out = self.conn.send_error(request, ErrorCode.KAFKA_STORAGE_ERROR, str(exc))
        except Exception as exc:
            log.exception(
                "%s from %s (%s, correlation id %d) failed",
                _api_name(api),
                self.peer,
                request.header.client_id,
                request.header.correlation_id,
            )
            out = self.conn.send_error(
                request, ErrorCode.UNKNOWN_SERVER_ERROR, f"{type(exc).__name__}: {exc}"
            )
        self._write(out)
        self.progress.set()

    def _abort(self) -> None:
        """Close the connection at once (test faults); `run` then cleans up."""
        transport = self.writer.transport
        if not transport.is_closing():
            transport.abort()
        self.progress.set()  # a reader parked on the in-flight bound must see it

    async def close(self) -> None:
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self.writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.writer.wait_closed(), 1.0)


class ControllerServer:
    def __init__(self, config: ControllerConfig, handlers: ControllerHandlers) -> None:
        self.config = config
        self.handlers = handlers
        self._server: asyncio.Server | None = None
        self._clients: set[asyncio.Task[None]] = set()
        self.address: tuple[str, int] | None = None

    async def start(self) -> tuple[str, int]:
        """Listen; return the bound (host, port). Raises OSError (e.g. port in use)."""
        self._server = await asyncio.start_server(
            self._accept,
            self.config.listen_host,
            self.config.listen_port,
            reuse_address=True,
            limit=READ_CHUNK,
        )
        sockname = self._server.sockets[0].getsockname()
        self.address = (self.config.listen_host, int(sockname[1]))
        return self.address

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._clients) >= self.config.max_connections:
            log.warning(
                "refusing a connection: %d connections open (the limit)", len(self._clients)
            )
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        self._clients.add(task)
        try:
            await _Client(self, reader, writer).run()
        finally:
            self._clients.discard(task)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._clients):
            task.cancel()
        if self._clients:
            await asyncio.wait(list(self._clients), timeout=5.0)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5.0)
