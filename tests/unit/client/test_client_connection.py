"""BrokerConnection against a real in-test asyncio server (ServerConnection)."""

from __future__ import annotations

import asyncio

import pytest
import uvloop
from client_fakes import FakeBroker

from client.connection import BrokerConnection
from client.errors import ConnectionFailedError
from client.errors import RequestTimedOutError
from client.errors import UnknownServerError
from protocol.messages import AllocateProducerIdsRequest
from protocol.messages import MetadataRequest
from protocol.messages import MetadataResponse
from protocol.messages import MetadataTopic


def echo_topics(delays: dict[str, float]):
    async def handler(req: MetadataRequest) -> MetadataResponse:
        name = (req.topics or ["?"])[0]
        await asyncio.sleep(delays.get(name, 0))
        return MetadataResponse(topics=[MetadataTopic(name=name)])

    return handler


@pytest.fixture
async def broker():
    b = FakeBroker()
    await b.start()
    yield b
    await b.stop()


async def test_pipelined_requests_resolve_their_own_futures(broker: FakeBroker) -> None:
    # The first request finishes last on the server; answers still match requests.
    broker.overrides[MetadataRequest] = echo_topics({"a": 0.1, "b": 0.0, "c": 0.05})
    conn = BrokerConnection(broker.host, broker.port)
    await conn.connect()
    try:
        answers = await asyncio.gather(
            *(conn.send(MetadataRequest(topics=[n])) for n in ("a", "b", "c"))
        )
        assert [a.topics[0].name for a in answers] == ["a", "b", "c"]
        assert conn.in_flight == 0
    finally:
        await conn.close()


async def test_in_flight_requests_are_bounded(broker: FakeBroker) -> None:
    active = 0
    peak = 0

    async def slow(req: MetadataRequest) -> MetadataResponse:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.05)
        active -= 1
        return MetadataResponse()

    broker.overrides[MetadataRequest] = slow
    conn = BrokerConnection(broker.host, broker.port, max_in_flight=2)
    await conn.connect()
    try:
        await asyncio.gather(*(conn.send(MetadataRequest(topics=[])) for _ in range(6)))
        assert peak == 2
    finally:
        await conn.close()


async def connect_to_silent(broker: FakeBroker, **options: int) -> BrokerConnection:
    """A connection to `broker`, which from now on never answers a Metadata request."""

    async def hang(req: MetadataRequest) -> MetadataResponse:
        await asyncio.Event().wait()
        raise AssertionError

    broker.overrides[MetadataRequest] = hang
    conn = BrokerConnection(broker.host, broker.port, **options)
    await conn.connect()
    return conn


async def test_timeout_fails_the_request_and_closes_the_connection(broker: FakeBroker) -> None:
    conn = await connect_to_silent(broker, request_timeout_ms=100)
    first = asyncio.ensure_future(conn.send(MetadataRequest(topics=["a"])))
    await asyncio.sleep(0.05)
    second = asyncio.ensure_future(conn.send(MetadataRequest(topics=["b"]), timeout_ms=5_000))
    with pytest.raises(RequestTimedOutError, match="no answer from"):
        await first
    # The one queued behind it cannot be answered on this stream any more.
    with pytest.raises(ConnectionFailedError):
        await second
    assert not conn.connected
    with pytest.raises(ConnectionFailedError):
        await conn.send(MetadataRequest(topics=[]))
    await conn.close()


async def test_disconnect_fails_every_pending_request(broker: FakeBroker) -> None:
    conn = await connect_to_silent(broker)
    pending = [asyncio.ensure_future(conn.send(MetadataRequest(topics=[]))) for _ in range(3)]
    await asyncio.sleep(0.05)
    for transport in list(broker._writers):
        transport.abort()
    for fut in pending:
        with pytest.raises(ConnectionFailedError, match="lost"):
            await fut
    assert not conn.connected
    assert conn.in_flight == 0
    await conn.close()


async def test_close_fails_pending_and_is_idempotent(broker: FakeBroker) -> None:
    conn = await connect_to_silent(broker)
    pending = asyncio.ensure_future(conn.send(MetadataRequest(topics=[])))
    await asyncio.sleep(0.02)
    await conn.close()
    await conn.close()
    with pytest.raises(ConnectionFailedError, match="closed by the client"):
        await pending


async def test_cancelled_caller_does_not_break_the_stream(broker: FakeBroker) -> None:
    broker.overrides[MetadataRequest] = echo_topics({"slow": 0.1})
    conn = BrokerConnection(broker.host, broker.port)
    await conn.connect()
    try:
        slow = asyncio.ensure_future(conn.send(MetadataRequest(topics=["slow"])))
        await asyncio.sleep(0.01)
        slow.cancel()
        answer = await conn.send(MetadataRequest(topics=["next"]))
        assert answer.topics[0].name == "next"
    finally:
        await conn.close()


async def test_whole_request_error_raises_its_class(broker: FakeBroker) -> None:
    conn = BrokerConnection(broker.host, broker.port)
    await conn.connect()
    try:
        # The fake broker does not implement AllocateProducerIds: its handler raises.
        with pytest.raises(UnknownServerError, match="AllocateProducerIdsRequest"):
            await conn.send(AllocateProducerIdsRequest(broker_id=1))
        assert conn.connected  # an error answer is not a broken stream
    finally:
        await conn.close()


async def test_connect_refused_names_the_address() -> None:
    probe = FakeBroker()
    await probe.start()
    port = probe.port
    await probe.stop()
    conn = BrokerConnection("127.0.0.1", port, node_id=3)
    with pytest.raises(ConnectionFailedError) as info:
        await conn.connect()
    assert f"broker 3 at 127.0.0.1:{port}" in str(info.value)
    assert "minibroker dev" in str(info.value)


def test_works_on_uvloop() -> None:
    async def main() -> str:
        broker = FakeBroker()
        await broker.start()
        conn = BrokerConnection(broker.host, broker.port)
        try:
            await conn.connect()
            broker.overrides[MetadataRequest] = echo_topics({})
            answer = await conn.send(MetadataRequest(topics=["u"]))
            return answer.topics[0].name
        finally:
            await conn.close()
            await broker.stop()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(main()) == "u"
