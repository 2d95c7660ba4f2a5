"""Finding the active controller from a DescribeQuorum answer (runtime/active_controller.py):
a controller that listens on a wildcard address (0.0.0.0 in a container) is reached
where it was asked, never at the wildcard, which no one can dial; a controller silent on
one connection is dropped on all of them."""

from __future__ import annotations

import asyncio
import time

import pytest

from protocol.connection import Request
from protocol.connection import ServerConnection
from protocol.messages import DescribeQuorumRequest
from protocol.messages import DescribeQuorumResponse
from protocol.messages import QuorumVoterState
from runtime.active_controller import LOOKUP_TIMEOUT_S
from runtime.active_controller import ActiveController
from runtime.active_controller import ControllerClient
from runtime.peer_rpc import RpcConnectionError
from runtime.peer_rpc import RpcTimeoutError


def answer(
    node_id: int, leader_id: int, voters: dict[int, tuple[str, int]]
) -> DescribeQuorumResponse:
    return DescribeQuorumResponse(
        node_id=node_id,
        leader_id=leader_id,
        leader_epoch=3,
        voters=[QuorumVoterState(replica_id=v, host=h, port=p) for v, (h, p) in voters.items()],
    )


def test_a_leader_answering_for_itself_is_reached_where_it_was_asked() -> None:
    single = answer(0, 0, {0: ("0.0.0.0", 9093)})  # a quorum of one in a container
    assert ActiveController._leader_endpoint(single, ("controller", 9093)) == ("controller", 9093)


def test_another_voter_named_leader_is_reached_at_its_listed_address() -> None:
    quorum = {1: ("c1", 9093), 2: ("c2", 9093), 3: ("c3", 9093)}
    assert ActiveController._leader_endpoint(answer(1, 2, quorum), ("c1", 9093)) == ("c2", 9093)


def test_a_wildcard_or_unknown_leader_address_is_not_used() -> None:
    wild = {1: ("c1", 9093), 2: ("0.0.0.0", 9093)}
    assert ActiveController._leader_endpoint(answer(1, 2, wild), ("c1", 9093)) is None
    assert ActiveController._leader_endpoint(answer(1, -1, wild), ("c1", 9093)) is None


class SilentController:
    """A real listening socket that reads every request and answers none: a SIGSTOPped
    or cut-off controller as its peers see it (connections open, nothing comes back)."""

    def __init__(self) -> None:
        self.connections = 0
        self._held: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._held.append(writer)
        while await reader.read(65536):
            pass

    async def __aenter__(self) -> tuple[str, int]:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[:2]

    async def __aexit__(self, *exc: object) -> None:
        for writer in self._held:
            writer.close()
        assert self.server is not None
        self.server.close()


class AnsweringController:
    """A real listening socket that answers DescribeQuorum as the active controller
    (node 2), through the server side of the native protocol; counts the lookups."""

    def __init__(self) -> None:
        self.lookups = 0
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = ServerConnection()
        while data := await reader.read(65536):
            conn.receive_data(data)
            while (event := conn.next_event()) is not None:
                assert isinstance(event, Request) and isinstance(event.body, DescribeQuorumRequest)
                self.lookups += 1
                writer.write(conn.send_response(event, answer(2, 2, {2: ("127.0.0.1", 1)})))
        writer.close()

    async def __aenter__(self) -> tuple[str, int]:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[:2]

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()


def clients(active: ActiveController) -> tuple[ControllerClient, ControllerClient]:
    """A broker's metadata long-poll and heartbeat connections."""
    return (
        ControllerClient(active, purpose="metadata", request_timeout_s=30.0, connect_timeout_s=2.0),
        ControllerClient(
            active, purpose="lifecycle", request_timeout_s=30.0, connect_timeout_s=2.0
        ),
    )


async def test_a_long_poll_moves_on_with_the_heartbeat_that_found_a_new_controller() -> None:
    """Invariant: once a lookup finds the active controller elsewhere, every connection
    of the process to the old one fails, so a long-poll parked on a silent controller
    does not sit out its own timeout; the failures a drop causes start no lookup of
    their own (no cascade). Off (no drop): the long-poll waits its whole 30 s."""
    silent, answering = SilentController(), AnsweringController()
    async with silent as old, answering as new:
        active = ActiveController([old, new], client_id="broker-1")
        long_poll, heartbeat = clients(active)
        try:
            started = time.monotonic()
            parked = asyncio.create_task(long_poll.request(DescribeQuorumRequest()))
            await asyncio.sleep(0.1)
            with pytest.raises(RpcTimeoutError):
                await heartbeat.request(DescribeQuorumRequest(), timeout_s=0.3)
            assert active.address == new and active.leader_id == 2
            with pytest.raises(RpcConnectionError, match="no longer the active controller"):
                await asyncio.wait_for(parked, 5.0)
            assert time.monotonic() - started < 0.3 + LOOKUP_TIMEOUT_S + 1.0
            await asyncio.sleep(0.3)
            assert answering.lookups == 1  # the heartbeat's; none for the dropped long-poll
            assert silent.connections == 2  # the long-poll's and the heartbeat's
        finally:
            await long_poll.close()
            await heartbeat.close()


async def test_a_lookup_that_finds_no_other_controller_keeps_the_long_poll() -> None:
    """A single controller that stalls (SIGSTOP, a long pause): the heartbeat fails and
    its lookup finds no one else; the parked long-poll stays, so the controller answers
    it the moment it runs again, as it did before drops existed."""
    silent = SilentController()
    async with silent as address:
        active = ActiveController([address], client_id="broker-1")
        long_poll, heartbeat = clients(active)
        try:
            parked = asyncio.create_task(long_poll.request(DescribeQuorumRequest()))
            await asyncio.sleep(0.1)
            with pytest.raises(RpcTimeoutError):
                await heartbeat.request(DescribeQuorumRequest(), timeout_s=0.3)
            await asyncio.sleep(0.2)
            assert not parked.done()
        finally:
            await long_poll.close()
            await heartbeat.close()
        with pytest.raises(RpcConnectionError):
            await parked
