"""One TCP connection to a broker (or the controller) for the client library.

The pipelined connection itself is `runtime.rpc.PipelinedConnection` (the same one the
broker uses to reach its peers: bounded in-flight requests, a timed-out request closes
the connection, a dropped connection fails every pending request, write backpressure).
What is the client's own is the error types: a failure to connect or a dropped
connection raises ConnectionFailedError (retriable, refreshes metadata), a request
with no answer RequestTimedOutError, and a whole-request error code its
BrokerResponseError, each naming the broker.
"""

from __future__ import annotations

import ssl

from client.errors import START_HINT
from client.errors import ConnectionFailedError
from client.errors import RequestTimedOutError
from client.errors import error_for
from client.security import SaslCredentials
from protocol.errors import ErrorCode
from protocol.framing import DEFAULT_MAX_FRAME_SIZE
from protocol.messages import Message
from runtime.rpc import PipelinedConnection


class _ClientFailures:
    """The client library's exception for each failure of one connection."""

    def __init__(self, host: str, port: int, node_id: int, peer: str) -> None:
        self._host, self._port, self._node_id = host, port, node_id
        self._peer = peer

    def connection(self, message: str, *, reason: str | None = None) -> Exception:
        return ConnectionFailedError(
            message, host=self._host, port=self._port, node_id=self._node_id, reason=reason or ""
        )

    def timeout(self, message: str) -> Exception:
        return RequestTimedOutError(message)

    def answer(self, error: ErrorCode, message: str) -> Exception:
        return error_for(error, f"{message} (from {self._peer})")


class BrokerConnection(PipelinedConnection):
    """A pipelined request/response connection to one server; used once."""

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
        tls: ssl.SSLContext | None = None,
        sasl: SaslCredentials | None = None,
    ) -> None:
        where = f"{host}:{port}"
        peer = f"broker {node_id} at {where}" if node_id >= 0 else where
        super().__init__(
            host,
            port,
            peer=peer,
            failures=_ClientFailures(host, port, node_id, peer),
            client_id=client_id,
            request_timeout_s=request_timeout_ms / 1000,
            connect_timeout_s=connect_timeout_ms / 1000,
            max_in_flight=max_in_flight,
            max_frame_size=max_frame_size,
            connect_hint=START_HINT,
            tls=tls,
            sasl=sasl,  # a refusal raises SaslAuthenticationFailedError: not retried
        )
        self.node_id = node_id

    def describe(self) -> str:
        return self.peer

    async def send(  # type: ignore[override]
        self, request: Message, *, timeout_ms: int | None = None, expect_response: bool = True
    ) -> Message | None:
        """Send `request` and return the decoded response body.

        A whole-request error code raises its BrokerResponseError; per-partition
        error codes stay in the body for the caller. `expect_response=False` (Produce
        with acks=0) returns None as soon as the bytes are written."""
        timeout_s = None if timeout_ms is None else timeout_ms / 1000
        return await super().send(request, timeout_s=timeout_s, expect_response=expect_response)
