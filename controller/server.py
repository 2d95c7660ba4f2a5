"""The controller's listener: runtime/server.py's server (the same connection bounds,
deadlines, error answers and fault hooks as a broker's listener) serving the
controller's table of APIs (controller/handlers.py).

Controller specifics: slots kept for brokers and no idle deadline for their
connections (controller/config.py's connection limits); a handler whose metadata log
write failed answers KAFKA_STORAGE_ERROR instead of UNKNOWN_SERVER_ERROR.
"""

from __future__ import annotations

from controller.config import ControllerConfig
from controller.errors import MetadataLogWriteError
from controller.faults import LISTENER
from controller.handlers import ControllerHandlers
from protocol.connection_limits import ConnectionTable
from protocol.errors import ErrorCode
from protocol.messages import Message
from runtime.server import Handler
from runtime.server import ListenerServer
from runtime.server import RequestContext


def _storage_error(exc: Exception) -> tuple[ErrorCode, str] | None:
    if isinstance(exc, MetadataLogWriteError):
        return ErrorCode.KAFKA_STORAGE_ERROR, str(exc)
    return None


def _dispatch(handlers: ControllerHandlers, api: int) -> Handler:
    """The controller's handlers take the request body only; looked up per request, so
    the table stays the one place that says who answers an API."""

    async def serve(ctx: RequestContext, body: Message) -> Message:
        return await handlers.handlers[api](body)

    return serve


class ControllerServer:
    def __init__(self, config: ControllerConfig, handlers: ControllerHandlers) -> None:
        self.config = config
        self.handlers = handlers
        self.listener = ListenerServer(
            LISTENER,
            config.listen_host,
            config.listen_port,
            {api: _dispatch(handlers, api) for api in handlers.handlers},
            table=ConnectionTable(config.connection_limits()),
            faults=handlers.faults,
            error_answer=_storage_error,
            role="controller",
        )
        self.table = self.listener.table
        self.address: tuple[str, int] | None = None

    async def start(self) -> tuple[str, int]:
        """Listen; return the bound (host, port). Raises OSError (e.g. port in use)."""
        port = await self.listener.bind()
        await self.listener.start_serving()
        self.address = (self.config.listen_host, port)
        return self.address

    async def close(self) -> None:
        await self.listener.close()
