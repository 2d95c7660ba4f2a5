"""The controller's listener: runtime/server.py's server (the same connection bounds,
deadlines, error answers and fault hooks as a broker's listener) serving the
controller's table of APIs (controller/handlers.py).

On a SASL_PLAINTEXT or SASL_SSL listener brokers and tools authenticate as users of
this controller's own metadata image; the quorum's peers instead send their APIs
under a verified TLS client certificate (SCRAM cannot work between controllers: a
new voter has no users until the leader it would vote for replicates them).

Controller specifics: slots kept for brokers and no idle deadline for their
connections (controller/config.py's connection limits); a handler whose metadata log
write failed answers KAFKA_STORAGE_ERROR instead of UNKNOWN_SERVER_ERROR; the quorum's
APIs go to the quorum driver; a controller that is not the quorum leader answers
NOT_CONTROLLER, naming the leader, to everything that only the active controller does.
"""

from __future__ import annotations

from controller.config import BROKER_API_KEYS
from controller.config import ControllerConfig
from controller.errors import MetadataLogWriteError
from controller.faults import LISTENER
from controller.handlers import ControllerHandlers
from controller.quorum.driver import NotLeaderError
from controller.quorum.driver import QuorumDriver
from controller.request_authorization import ControllerRequestAccess
from protocol.api import ApiKey
from protocol.connection_limits import ConnectionTable
from protocol.errors import ErrorCode
from protocol.messages import BrokerRegistrationRequest
from protocol.messages import Message
from runtime.access import RequestAccess
from runtime.authorization_settings import authorizer_settings
from runtime.sasl import image_lookup
from runtime.server import Handler
from runtime.server import ListenerServer
from runtime.server import RequestContext
from runtime.server import SaslConfig
from runtime.tls import uses_sasl
from runtime.tls_settings import listener_tls

# What only the active controller (the quorum leader) answers is exactly what brokers
# send it: every change, their heartbeats (sessions live there) and the metadata feed.
LEADER_ONLY_APIS = BROKER_API_KEYS
QUORUM_APIS = frozenset(
    int(key)
    for key in (
        ApiKey.VOTE,
        ApiKey.BEGIN_QUORUM_EPOCH,
        ApiKey.END_QUORUM_EPOCH,
        ApiKey.DESCRIBE_QUORUM,
        ApiKey.FETCH_SNAPSHOT,
        ApiKey.QUORUM_FETCH,
    )
)


def _error_answer(exc: Exception) -> tuple[ErrorCode, str] | None:
    if isinstance(exc, MetadataLogWriteError):
        return ErrorCode.KAFKA_STORAGE_ERROR, str(exc)
    if isinstance(exc, NotLeaderError):
        return ErrorCode.NOT_CONTROLLER, str(exc)
    if isinstance(exc, TimeoutError):
        return ErrorCode.REQUEST_TIMED_OUT, "the change was not committed in time; retry"
    return None


def _dispatch(
    handlers: ControllerHandlers, quorum: QuorumDriver, access: ControllerRequestAccess, api: int
) -> Handler:
    """The controller's handlers take the request body only; looked up per request, so
    the table stays the one place that says who answers an API. A registration also
    gets the principal that sent it (kept in its record)."""
    leader_only = api in LEADER_ONLY_APIS

    async def serve(ctx: RequestContext, body: Message) -> Message:
        access.check(ctx, api, body)
        if leader_only and not quorum.replica.is_leader:
            raise quorum.not_leader()
        if isinstance(body, BrokerRegistrationRequest):
            return await handlers.broker_registration(body, ctx.principal)
        return await handlers.handlers[api](body)

    return serve


def _quorum(quorum: QuorumDriver, access: ControllerRequestAccess, api: int) -> Handler:
    async def serve(ctx: RequestContext, body: Message) -> Message:
        access.check(ctx, api, body)
        return await quorum.handle(-1, body)

    return serve


class ControllerServer:
    def __init__(
        self, config: ControllerConfig, handlers: ControllerHandlers, quorum: QuorumDriver
    ) -> None:
        self.config = config
        self.handlers = handlers
        access = ControllerRequestAccess(
            RequestAccess(authorizer_settings(config), lambda: handlers.image),
            lambda: handlers.image,
        )
        served = {api: _dispatch(handlers, quorum, access, api) for api in handlers.handlers}
        served.update({api: _quorum(quorum, access, api) for api in QUORUM_APIS})
        self.listener = ListenerServer(
            LISTENER,
            config.listen_host,
            config.listen_port,
            served,
            table=ConnectionTable(config.connection_limits()),
            faults=handlers.faults,
            error_answer=_error_answer,
            role="controller",
            tls=listener_tls(config, config.security_protocol),
            sasl=SaslConfig(
                config.sasl_enabled_mechanisms,
                # Users as this controller's metadata has them (a follower's too).
                image_lookup(lambda: handlers.writer.image.scram_credentials),
                # The quorum's peers prove themselves by certificate (config.py).
                certificate_apis=QUORUM_APIS,
            )
            if uses_sasl(config.security_protocol)
            else None,
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
