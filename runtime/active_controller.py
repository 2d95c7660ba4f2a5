"""Talking to the active controller of a quorum (issue 17), for a broker: any
controller address bootstraps; DescribeQuorum says which voter leads and where every
voter listens; a request that finds the controller gone, or a controller that is no
longer (or not) the active one (NOT_CONTROLLER), looks the leader up again before it
fails, so the next request goes to the new active controller. A single controller is a
quorum of one: the same path.

When a lookup finds the active controller elsewhere, every connection of this process
to the old address is dropped, so a long-poll parked on a silently dead connection (a
SIGSTOPped or cut-off controller) fails over with the heartbeat that noticed, not one
request timeout later. A lookup that finds no other leader drops nothing: a stalled
single controller answers the parked long-poll the moment it runs again. A request
failed by such a drop starts no lookup of its own, so drops never cascade.

- `ActiveController`: what the channels of one process share, the leader's address
  (one lookup at a time; a lookup asks each known controller at most once, bounded by
  LOOKUP_TIMEOUT_S each);
- `ControllerClient`: one reconnecting connection (runtime/peer_rpc.py) that follows
  it, with RpcClient's `request` / `request_with_retry` / `close`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Sequence

from protocol.errors import ErrorCode
from protocol.invariants import invariant
from protocol.messages import DescribeQuorumRequest
from protocol.messages import DescribeQuorumResponse
from protocol.messages import Message
from runtime.faults import Faults
from runtime.peer_rpc import NO_FAULTS
from runtime.peer_rpc import RpcAuthenticationError
from runtime.peer_rpc import RpcClient
from runtime.peer_rpc import RpcConnectionError
from runtime.peer_rpc import RpcError
from runtime.peer_rpc import RpcErrorResponse
from runtime.peer_rpc import RpcTimeoutError
from runtime.peer_rpc import retry_until
from runtime.sasl import SaslCredentials

log = logging.getLogger(__name__)

LOOKUP_TIMEOUT_S = 1.0
# Connections following one ActiveController, at most (a broker has three).
MAX_CLIENTS = 8
# Controllers remembered from DescribeQuorum answers, at most (bounded like any list).
MAX_KNOWN = 16

Address = tuple[str, int]
# Listen-on-everything addresses: where a server listens, not where it can be reached.
WILDCARDS = frozenset({"", "0.0.0.0", "::"})


class ActiveController:
    def __init__(
        self,
        bootstrap: Sequence[Address],
        *,
        client_id: str,
        tls: ssl.SSLContext | None = None,
        sasl: SaslCredentials | None = None,
    ) -> None:
        if not bootstrap:
            raise ValueError("at least one controller address is needed")
        self.tls = tls  # the controllers listen with SSL: every connection to them is TLS
        self.sasl = sasl  # they listen with SASL: every connection authenticates as this
        self.known: list[Address] = list(dict.fromkeys(bootstrap))
        self.address: Address = self.known[0]
        self.leader_id = -1
        self.client_id = client_id
        self._lock = asyncio.Lock()
        # The connections that follow this active controller (one per purpose).
        self._clients: list[ControllerClient] = []

    def attach(self, client: ControllerClient) -> None:
        invariant(len(self._clients) < MAX_CLIENTS, "a bounded number of controller clients")
        self._clients.append(client)

    def detach(self, client: ControllerClient) -> None:
        if client in self._clients:
            self._clients.remove(client)

    def describe(self) -> str:
        host, port = self.address
        who = f"controller {self.leader_id}" if self.leader_id >= 0 else "the controller"
        return f"{who} at {host}:{port}"

    async def look_up(self, failed: Address) -> None:
        """The active controller is not (or no longer) at `failed`: ask the known
        controllers which voter leads. Unchanged when none can say (an election is
        under way; the caller retries). Found elsewhere: every connection to `failed`
        is dropped."""
        async with self._lock:
            # Unless another channel found the new one meanwhile.
            if self.address == failed:
                start = self.known.index(failed) + 1 if failed in self.known else 0
                await self._ask_in_turn(self.known[start:] + self.known[:start])
        if self.address == failed:
            return
        why = f"{failed[0]}:{failed[1]} is no longer the active controller"
        for client in self._clients:
            client.drop_connection_to(failed, why)

    async def find(self) -> None:
        """Ask the known controllers, in order, which voter is active (`leader_id`
        stays -1 when none can say)."""
        async with self._lock:
            await self._ask_in_turn(list(self.known))

    async def _ask_in_turn(self, order: list[Address]) -> None:
        for address in order:
            answer = await self._describe(address)
            if answer is None:
                continue
            for voter in answer.voters:
                if voter.port > 0 and voter.host not in WILDCARDS and len(self.known) < MAX_KNOWN:
                    endpoint = (voter.host, voter.port)
                    if endpoint not in self.known:
                        self.known.append(endpoint)
            endpoint = self._leader_endpoint(answer, address)
            if endpoint is not None:
                self.address = endpoint
                if answer.leader_id != self.leader_id:
                    log.info(
                        "the active controller is controller %d at %s:%d (quorum epoch %d)",
                        answer.leader_id,
                        endpoint[0],
                        endpoint[1],
                        answer.leader_epoch,
                    )
                self.leader_id = answer.leader_id
                return

    @staticmethod
    def _leader_endpoint(answer: DescribeQuorumResponse, asked: Address) -> Address | None:
        """Where the leader listens. A controller that answers for itself is reached
        where we asked it (it may listen on 0.0.0.0, an address no one can dial);
        another voter at the address the quorum lists, unless that is a wildcard."""
        if answer.leader_id < 0:
            return None
        if answer.leader_id == answer.node_id:
            return asked
        for v in answer.voters:
            if v.replica_id == answer.leader_id and v.port > 0 and v.host not in WILDCARDS:
                return v.host, v.port
        return None

    async def _describe(self, address: Address) -> DescribeQuorumResponse | None:
        try:
            return await describe_quorum_at(
                address, self.client_id, LOOKUP_TIMEOUT_S, tls=self.tls, sasl=self.sasl
            )
        except RpcError:
            return None


async def describe_quorum_at(
    address: Address,
    client_id: str,
    timeout_s: float,
    *,
    tls: ssl.SSLContext | None = None,
    sasl: SaslCredentials | None = None,
) -> DescribeQuorumResponse:
    """One controller's DescribeQuorum answer (raises RpcError when it gives none)."""
    client = RpcClient(
        address[0],
        address[1],
        name="controller",
        client_id=client_id,
        request_timeout_s=timeout_s,
        connect_timeout_s=timeout_s,
        max_in_flight=1,
        tls=tls,
        sasl=sasl,
    )
    try:
        answer = await client.request(DescribeQuorumRequest())
    finally:
        await client.close()
    if not isinstance(answer, DescribeQuorumResponse):
        raise RpcError(f"controller at {address[0]}:{address[1]} answered {answer!r}")
    return answer


class ControllerClient:
    """A connection to whichever controller is active (see the module doc)."""

    def __init__(
        self,
        active: ActiveController,
        *,
        purpose: str,
        request_timeout_s: float,
        connect_timeout_s: float,
        faults: Faults = NO_FAULTS,
        peer_id: int = -1,
    ) -> None:
        self.active = active
        self.purpose = purpose
        self.request_timeout_s = request_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._faults = faults
        self._peer_id = peer_id
        self._client: RpcClient | None = None
        self._closed = False
        # Connections this client dropped on the word of another (drop_connection_to).
        self._drops = 0
        active.attach(self)

    def drop_connection_to(self, address: Address, why: str) -> None:
        """Another connection found `address` gone: abort ours to it, failing what
        waits there (a long-poll would otherwise sit out its whole timeout)."""
        client = self._client
        if client is None or (client.host, client.port) != address:
            return
        if client.drop_connection(f"dropped the {self.purpose} connection: {why}"):
            self._drops += 1
            log.info("dropped the %s connection to %s:%d: %s", self.purpose, *address, why)

    def _current(self) -> RpcClient:
        address = self.active.address
        client = self._client
        if client is None or (client.host, client.port) != address:
            if client is not None:
                # The old connection goes in the background: nothing waits on it.
                task = asyncio.get_running_loop().create_task(client.close())
                task.add_done_callback(lambda t: t.cancelled() or t.exception())
            client = self._client = RpcClient(
                address[0],
                address[1],
                name="controller",
                client_id=f"{self.active.client_id}-{self.purpose}",
                request_timeout_s=self.request_timeout_s,
                connect_timeout_s=self.connect_timeout_s,
                faults=self._faults,
                peer_id=self._peer_id,
                tls=self.active.tls,
                sasl=self.active.sasl,
            )
        return client

    async def request(self, body: Message, *, timeout_s: float | None = None) -> Message:
        """One request to the active controller. On a lost controller or
        NOT_CONTROLLER the leader is looked up again, then the error is raised (as
        RpcConnectionError for NOT_CONTROLLER: the caller retries as after a lost
        connection)."""
        if self._closed:  # not retried: the process is stopping
            raise RpcError(f"connection to {self.active.describe()} is closed")
        client = self._current()
        address = (client.host, client.port)
        drops = self._drops
        try:
            return await client.request(body, timeout_s=timeout_s)
        except RpcErrorResponse as exc:
            if exc.error != ErrorCode.NOT_CONTROLLER:
                raise
            await self.active.look_up(address)
            raise RpcConnectionError(f"{address[0]}:{address[1]}: {exc.message}") from None
        except RpcAuthenticationError:
            raise  # the controller is there and refused us: asking the others is no cure
        except (RpcConnectionError, RpcTimeoutError):
            if self._drops == drops:  # not dropped by a lookup that has already run
                await self.active.look_up(address)
            raise

    async def request_with_retry(
        self, body: Message, *, deadline: float, timeout_s: float | None = None
    ) -> Message:
        """`request`, retried on a lost controller and NOT_CONTROLLER until
        `deadline` (time.monotonic())."""
        return await retry_until(deadline, lambda: self.request(body, timeout_s=timeout_s))

    async def close(self) -> None:
        self._closed = True
        self.active.detach(self)
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()
