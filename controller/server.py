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
- the connection bounds of protocol/connection.py and protocol/connection_limits.py,
  the same rules as the broker's server (broker/network.py): max connections (a new
  one displaces the oldest that has sent no request), slots kept for brokers, max
  connections per IP, at most `max_in_flight_per_connection` requests in service
  and `max_pending_bytes_per_connection` bytes held per connection (past either the
  connection is not read until responses go out), and deadlines checked by a sweep:
  the first request, each request frame, idleness (never for a broker's
  connections). Closures and refusals are logged at most once per kind every 10 s.

With --enable-test-faults, controller/faults.py may delay or park a request before its
handler runs, drop it (the connection is closed unanswered) or drop its answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from controller.config import ControllerConfig
from controller.errors import MetadataLogWriteError
from controller.faults import DROP, DROP_RESPONSE
from controller.handlers import ControllerHandlers
from protocol.api import api_name as _api_name
from protocol.connection import CloseReason, RejectedRequest, Request
from protocol.connection_limits import ConnectionSlot, ConnectionTable
from protocol.errors import DecodeError, ErrorCode

log = logging.getLogger(__name__)

READ_CHUNK = 64 * 1024


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
        self.conn = server.table.limits.server_connection(
            time.monotonic(), api_filter=server.handlers.handlers.__contains__
        )
        self.slot: ConnectionSlot | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self.progress = asyncio.Event()

    def _write(self, data: bytes) -> None:
        if data and not self.writer.is_closing():
            self.writer.write(data)

    def unsent(self) -> int:
        return self.writer.transport.get_write_buffer_size()

    async def run(self) -> None:
        conn = self.conn
        table = self.server.table
        assert self.slot is not None, "run() after the table admitted the connection"
        try:
            while True:
                while True:
                    try:
                        event = conn.next_event(self.unsent())
                    except DecodeError as exc:
                        log.warning(
                            "closing connection from %s: malformed request: %s", self.peer, exc
                        )
                        return
                    if event is None:
                        break
                    refused = table.on_request(self.slot, event.header.api_key)
                    if refused is not None:
                        self.server.log_event(refused, time.monotonic())
                        return
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
                if conn.blocked:
                    # In-flight or pending-bytes bound: stop reading (and timing the
                    # frame) until a response goes out.
                    conn.pause_clock()
                    await self.progress.wait()
                    continue
                if self.unsent() > self.writer.transport.get_write_buffer_limits()[1]:
                    conn.pause_clock()  # the peer is not reading: neither do we
                    await self.writer.drain()
                conn.resume_clock(time.monotonic())
                data = await self.reader.read(READ_CHUNK)
                if not data:
                    return
                conn.receive_data(data, time.monotonic())
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
                    self.abort()  # the request is lost: the sender sees the connection go
                    return
            body = await handler(request.body)
            if fault == DROP_RESPONSE:
                self.abort()  # served, but the answer is lost
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

    def abort(self) -> None:
        """Close the connection at once (test faults, deadlines); `run` then cleans up."""
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
        self.table = ConnectionTable(config.connection_limits())
        self._server: asyncio.Server | None = None
        self._clients: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self.address: tuple[str, int] | None = None

    def log_event(self, event: CloseReason, now: float) -> None:
        line = self.table.log_line(event, now)
        if line is not None:
            log.warning("%s", line)

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
        self._sweeper = asyncio.create_task(self._sweep())
        return self.address

    async def _sweep(self) -> None:
        """Close connections past a deadline."""
        interval = self.table.limits.sweep_interval_s()
        while True:
            await asyncio.sleep(interval)
            for line in self.table.sweep(time.monotonic()):
                log.warning("%s", line)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        client = _Client(self, reader, writer)
        peer = writer.get_extra_info("peername")
        now = time.monotonic()
        admission = self.table.open(
            str(peer[0]) if isinstance(peer, tuple) else str(peer),
            client.peer,
            now,
            conn=client.conn,
            close=client.abort,
            unsent=client.unsent,
        )
        for event in (admission.evicted, admission.refused):
            if event is not None:
                self.log_event(event, now)
        if admission.slot is None:
            writer.transport.abort()
            return
        client.slot = admission.slot
        task = asyncio.current_task()
        assert task is not None
        self._clients.add(task)
        try:
            await client.run()
        except asyncio.CancelledError:
            # close() cancels us. Ending normally, not cancelled, because Python 3.11's
            # stream callback calls task.exception() on this task, which raises for a
            # cancelled one: an "Exception in callback" traceback per open connection.
            pass
        finally:
            self._clients.discard(task)
            self.table.release(admission.slot)

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        if self._server is not None:
            self._server.close()
        for task in list(self._clients):
            task.cancel()
        if self._clients:
            await asyncio.wait(list(self._clients), timeout=5.0)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5.0)
