"""Test-only fault controls of the broker: TestFaults itself, what the listener
(network.py) and the outgoing connection (runtime/peer_rpc.py) do with its decisions
over real sockets, and the flags that turn them on."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
from click.testing import CliRunner

import broker.__main__ as cli
from broker.config import BrokerConfig
from broker.faults import DROP
from broker.faults import DROP_RESPONSE
from broker.faults import NO_FAULTS
from broker.faults import PROCEED
from broker.faults import TestFaults
from broker.server import Broker
from broker.server import StartupError
from broker.server import check_test_switches
from broker.server import protections_off
from protocol.api import ApiKey
from protocol.errors import ErrorCode
from protocol.fault_plan import CONTROLLER_PEER_ID
from protocol.messages import FaultControlRequest
from protocol.messages import FaultRule
from protocol.messages import FetchRequest
from protocol.messages import Message
from protocol.messages import MetadataRequest
from protocol.messages import MetadataResponse
from runtime.peer_rpc import RpcClient
from runtime.peer_rpc import RpcConnectionError
from runtime.peer_rpc import RpcTimeoutError
from runtime.server import ListenerServer
from runtime.server import RequestContext

METADATA = int(ApiKey.METADATA)
FETCH = int(ApiKey.FETCH)


def control(faults: TestFaults, *rules: FaultRule, **kwargs: object):
    return faults.control(FaultControlRequest(add_rules=list(rules), **kwargs))  # type: ignore[arg-type]


# ---------------------------------------------------------------------- TestFaults


async def test_no_faults_is_a_no_op() -> None:
    assert not NO_FAULTS.enabled
    assert await NO_FAULTS.before_answer("X", FETCH, FetchRequest(topics=[])) is PROCEED
    assert await NO_FAULTS.before_send(1, FETCH, "x") is PROCEED
    refused = NO_FAULTS.control(FaultControlRequest(clear=True))
    assert refused.error_code == ErrorCode.INVALID_REQUEST


async def test_incoming_actions_and_peer_from_the_body(caplog: pytest.LogCaptureFixture) -> None:
    faults = TestFaults(node_id=1)
    control(
        faults,
        FaultRule(api_key=FETCH, action="drop", peer_id=2, remaining=1),
        FaultRule(api_key=FETCH, action="drop_response", peer_id=3),
        FaultRule(api_key=METADATA, action="delay", delay_ms=50),
    )
    follower2 = FetchRequest(replica_id=2, topics=[])
    with caplog.at_level(logging.WARNING, logger="broker.faults"):
        assert await faults.before_answer("L", FETCH, follower2) == DROP
    assert "TEST FAULT at node 1: drop" in caplog.text and "FETCH from peer 2" in caplog.text
    assert await faults.before_answer("L", FETCH, follower2) is PROCEED  # rule used up
    assert await faults.before_answer("L", FETCH, FetchRequest(replica_id=3, topics=[])) == (
        DROP_RESPONSE
    )
    assert await faults.before_answer("L", FETCH, FetchRequest(topics=[])) is PROCEED
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert await faults.before_answer("L", METADATA, MetadataRequest()) is PROCEED
    assert loop.time() - t0 >= 0.045
    assert faults.injected == 3


async def test_hold_until_released_and_clear_releases() -> None:
    faults = TestFaults(node_id=1)
    control(faults, FaultRule(api_key=FETCH, action="hold"))
    held = [
        asyncio.create_task(faults.before_answer("L", FETCH, FetchRequest(topics=[])))
        for _ in range(3)
    ]
    await asyncio.sleep(0.02)
    assert not any(t.done() for t in held)
    state = control(faults)
    assert state.held == 3 and len(state.rules) == 1
    state = control(faults, release_held=True)
    assert state.error_code == 0
    assert await asyncio.gather(*held) == [PROCEED] * 3
    # clear releases too, and drops the rule.
    task = asyncio.create_task(faults.before_answer("L", FETCH, FetchRequest(topics=[])))
    await asyncio.sleep(0.02)
    state = faults.control(FaultControlRequest(clear=True))
    assert state.rules == [] and state.held == 0
    assert await task is PROCEED


async def test_hold_is_bounded_in_number_and_time() -> None:
    faults = TestFaults(node_id=1, max_held=2, hold_timeout_s=0.1)
    control(faults, FaultRule(api_key=FETCH, action="hold"))
    body = FetchRequest(topics=[])
    tasks = [asyncio.create_task(faults.before_answer("L", FETCH, body)) for _ in range(2)]
    await asyncio.sleep(0.01)
    assert await faults.before_answer("L", FETCH, body) == DROP  # a third is refused
    assert await asyncio.gather(*tasks) == [DROP, DROP]  # not released in time
    assert len(faults.held) == 0


async def test_cancelled_hold_leaves_nothing_behind() -> None:
    faults = TestFaults(node_id=1)
    control(faults, FaultRule(api_key=FETCH, action="hold"))
    task = asyncio.create_task(faults.before_answer("L", FETCH, FetchRequest(topics=[])))
    await asyncio.sleep(0.01)
    assert len(faults.held) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(faults.held) == 0


async def test_invalid_control_changes_nothing() -> None:
    faults = TestFaults(node_id=1, protections_off=("unsafe-skip-fsync",))
    control(faults, FaultRule(api_key=FETCH, action="drop"))
    state = faults.control(
        FaultControlRequest(clear=True, add_rules=[FaultRule(api_key=FETCH, action="nope")])
    )
    assert state.error_code == ErrorCode.INVALID_REQUEST and "nope" in (state.error_message or "")
    assert [r.action for r in state.rules] == ["drop"]
    assert state.protections_off == ["unsafe-skip-fsync"]


# ---------------------------------------------------------------------- over sockets


class App:
    def __init__(self) -> None:
        self.calls = 0

    async def metadata(self, ctx: RequestContext, req: Message) -> Message:
        self.calls += 1
        return MetadataResponse(controller_id=self.calls)


@pytest.fixture
async def served():
    app = App()
    faults = TestFaults(node_id=5)
    srv = ListenerServer(
        "PLAINTEXT",
        "127.0.0.1",
        0,
        {METADATA: app.metadata},  # type: ignore[dict-item]
        faults=faults,
    )
    await srv.bind()
    await srv.start_serving()
    yield srv, app, faults
    await srv.close()


@pytest.fixture
async def connect(served) -> AsyncIterator[Callable[..., RpcClient]]:
    """connect(**kwargs): an RpcClient to the served listener; all closed at the end."""
    srv = served[0]
    async with AsyncExitStack() as opened:

        def connect_(**kwargs: object) -> RpcClient:
            client = RpcClient("127.0.0.1", srv.port, name="test", client_id="t", **kwargs)  # type: ignore[arg-type]
            opened.push_async_callback(client.close)
            return client

        yield connect_


@pytest.mark.parametrize(("action", "ran"), [("drop", 0), ("drop_response", 1)])
async def test_incoming_drop_loses_the_answer_once(served, connect, action: str, ran: int) -> None:
    """drop loses the request (never served), drop_response the answer (it ran); either
    way the connection is lost."""
    _, app, faults = served
    control(faults, FaultRule(api_key=METADATA, action=action, remaining=1))
    client = connect()
    with pytest.raises(RpcConnectionError):
        await client.request(MetadataRequest(), timeout_s=5)
    assert app.calls == ran
    # The rule is used up: the next request (on a new connection) is served.
    resp = await client.request(MetadataRequest(), timeout_s=5)
    assert isinstance(resp, MetadataResponse) and app.calls == ran + 1


async def test_incoming_hold_then_release(served, connect) -> None:
    _, app, faults = served
    control(faults, FaultRule(api_key=METADATA, action="hold"))
    client = connect()
    task = asyncio.create_task(client.request(MetadataRequest(), timeout_s=5))
    await asyncio.sleep(0.1)
    assert not task.done() and app.calls == 0
    faults.control(FaultControlRequest(clear=True))
    resp = await task
    assert isinstance(resp, MetadataResponse) and app.calls == 1


async def test_incoming_delay(served, connect) -> None:
    _, _, faults = served
    control(faults, FaultRule(api_key=METADATA, action="delay", delay_ms=150))
    client = connect()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await client.request(MetadataRequest(), timeout_s=5)
    assert loop.time() - t0 >= 0.14


async def test_outgoing_drop_is_a_connection_error_and_sends_nothing(served, connect) -> None:
    _, app, _ = served
    mine = TestFaults(node_id=1)
    control(mine, FaultRule(api_key=METADATA, action="drop", direction="out", peer_id=7))
    to_7 = connect(faults=mine, peer_id=7)
    with pytest.raises(RpcConnectionError, match="test fault"):
        await to_7.request(MetadataRequest(), timeout_s=5)
    assert app.calls == 0
    # Another peer is not affected.
    to_8 = connect(faults=mine, peer_id=8)
    assert isinstance(await to_8.request(MetadataRequest(), timeout_s=5), MetadataResponse)


async def test_outgoing_delay_and_hold_count_against_the_timeout(served, connect) -> None:
    _, app, _ = served
    mine = TestFaults(node_id=1)
    control(
        mine,
        FaultRule(api_key=METADATA, action="delay", direction="out", delay_ms=500, remaining=1),
        FaultRule(api_key=METADATA, action="hold", direction="out", remaining=1),
    )
    client = connect(faults=mine, peer_id=CONTROLLER_PEER_ID)
    with pytest.raises(RpcTimeoutError, match="test fault"):
        await client.request(MetadataRequest(), timeout_s=0.1)
    task = asyncio.create_task(client.request(MetadataRequest(), timeout_s=5))
    await asyncio.sleep(0.05)
    assert not task.done() and len(mine.held) == 1
    control(mine, release_held=True)
    assert isinstance(await task, MetadataResponse)
    assert app.calls == 1


async def test_outgoing_drop_response_sends_but_loses_the_answer(served, connect) -> None:
    _, app, _ = served
    mine = TestFaults(node_id=1)
    control(mine, FaultRule(api_key=METADATA, action="drop_response", direction="out"))
    client = connect(faults=mine)
    with pytest.raises(RpcConnectionError, match="dropped"):
        await client.request(MetadataRequest(), timeout_s=5)
    assert app.calls == 1


# ---------------------------------------------------------------------- switches


def test_unsafe_switches_need_test_faults(tmp_path: Path) -> None:
    config = BrokerConfig(node_id=1, data_dir=tmp_path, unsafe_skip_fsync=True)
    assert protections_off(config) == ("unsafe-skip-fsync",)
    with pytest.raises(StartupError, match="--enable-test-faults"):
        check_test_switches(config)
    ok = BrokerConfig(
        node_id=1,
        data_dir=tmp_path,
        enable_test_faults=True,
        unsafe_ignore_leader_epoch=True,
        unsafe_truncate_to_high_watermark=True,
    )
    check_test_switches(ok)
    broker = Broker(ok)
    assert isinstance(broker.faults, TestFaults)
    assert broker.faults.protections_off == (
        "unsafe-truncate-to-high-watermark",
        "unsafe-ignore-leader-epoch",
    )
    assert Broker(BrokerConfig(node_id=1, data_dir=tmp_path)).faults is NO_FAULTS


@pytest.mark.parametrize(
    "flag",
    ["--unsafe-truncate-to-high-watermark", "--unsafe-ignore-leader-epoch", "--unsafe-skip-fsync"],
)
def test_cli_refuses_unsafe_without_test_faults(captured: list[BrokerConfig], flag: str) -> None:
    result = CliRunner().invoke(cli.main, ["--node-id", "1", flag])
    assert result.exit_code == 2
    assert flag in result.output and "--enable-test-faults" in result.output
    assert captured == []


def test_cli_test_faults_by_flag_or_env(captured: list[BrokerConfig]) -> None:
    runner = CliRunner()
    result = runner.invoke(
        cli.main, ["--node-id", "1", "--enable-test-faults", "--unsafe-skip-fsync"]
    )
    assert result.exit_code == 0, result.output
    result = runner.invoke(
        cli.main,
        ["--node-id", "1", "--unsafe-ignore-leader-epoch"],
        env={"MINIBROKER_ENABLE_TEST_FAULTS": "1"},
    )
    assert result.exit_code == 0, result.output
    first, second = captured
    assert first.enable_test_faults and first.unsafe_skip_fsync
    assert not first.unsafe_ignore_leader_epoch
    assert second.enable_test_faults and second.unsafe_ignore_leader_epoch


def test_cli_replica_fetch_settings(captured: list[BrokerConfig]) -> None:
    runner = CliRunner()
    assert runner.invoke(cli.main, ["--node-id", "1"]).exit_code == 0
    result = runner.invoke(
        cli.main,
        [
            "--node-id",
            "1",
            "--replica-fetch-wait-max-ms",
            "100",
            "--replica-fetch-max-bytes",
            "2048",
            "--replica-fetch-backoff-ms",
            "5",
        ],
        env={"MINIBROKER_REPLICA_FETCH_RESPONSE_MAX_BYTES": "4096"},
    )
    assert result.exit_code == 0, result.output
    default, custom = captured
    assert (
        default.replica_fetch_wait_max_ms,
        default.replica_fetch_max_bytes,
        default.replica_fetch_response_max_bytes,
        default.replica_fetch_backoff_ms,
        default.enable_test_faults,
    ) == (500, 1_048_576, 10_485_760, 200, False)
    assert (
        custom.replica_fetch_wait_max_ms,
        custom.replica_fetch_max_bytes,
        custom.replica_fetch_response_max_bytes,
        custom.replica_fetch_backoff_ms,
    ) == (100, 2048, 4096, 5)


def test_help_names_the_new_options() -> None:
    result = CliRunner().invoke(cli.main, ["--help"], terminal_width=200)
    assert result.exit_code == 0
    for option in (
        "--enable-test-faults",
        "--unsafe-truncate-to-high-watermark",
        "--unsafe-ignore-leader-epoch",
        "--unsafe-skip-fsync",
        "--replica-fetch-wait-max-ms",
        "--replica-fetch-max-bytes",
        "--replica-fetch-response-max-bytes",
        "--replica-fetch-backoff-ms",
        "MINIBROKER_ENABLE_TEST_FAULTS",
    ):
        assert option in result.output
