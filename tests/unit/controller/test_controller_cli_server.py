"""The command line (option precedence, config file) and the server glue in-process
(handler failures, bounded in-flight, malformed streams)."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner
from wire_client import Client

from controller.__main__ import main
from controller.app import ControllerProcess
from controller.config import ControllerConfig
from protocol.api import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import ApiVersionsRequest
from protocol.messages import ApiVersionsResponse
from protocol.messages import BrokerRegistrationRequest
from protocol.messages import BrokerRegistrationResponse
from protocol.messages import FetchMetadataRequest
from protocol.messages import Listener
from protocol.messages import Message

# ------------------------------------------------------------------ CLI


def test_cli_defaults(captured: list[ControllerConfig]) -> None:
    result = CliRunner().invoke(main, [])
    assert result.exit_code == 0, result.output
    (config,) = captured
    assert config == ControllerConfig(data_dir=Path("./minibroker-data/controller"))


def test_cli_precedence_flag_env_file_default(
    captured: list[ControllerConfig], tmp_path: Path
) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text(
        'node-id = 3\nsession-timeout-ms = 100\nsnapshot-every = 7\nlisten = "0.0.0.0:9999"\n'
        "default-unclean-leader-election = true\n"
    )
    result = CliRunner().invoke(
        main,
        ["--config", str(toml), "--node-id", "5"],
        env={"MINIBROKER_SESSION_TIMEOUT_MS": "200"},
    )
    assert result.exit_code == 0, result.output
    (config,) = captured
    assert config.node_id == 5  # flag beats file
    assert config.session_timeout_ms == 200  # env beats file
    assert config.snapshot_every == 7  # file beats default
    assert (config.listen_host, config.listen_port) == ("0.0.0.0", 9999)
    assert config.default_unclean_leader_election is True
    assert config.default_partitions == 1  # default


def test_cli_bad_inputs(captured: list[ControllerConfig], tmp_path: Path) -> None:
    runner = CliRunner()
    bad_key = tmp_path / "bad.toml"
    bad_key.write_text("nodeid = 1\n")
    result = runner.invoke(main, ["--config", str(bad_key)])
    assert result.exit_code == 2 and "unknown key 'nodeid'" in result.output
    not_toml = tmp_path / "x.toml"
    not_toml.write_text("= = =")
    assert runner.invoke(main, ["--config", str(not_toml)]).exit_code == 2
    assert runner.invoke(main, ["--listen", "nope"]).exit_code == 2
    assert runner.invoke(main, ["--listen", "h:70000"]).exit_code == 2
    assert runner.invoke(main, ["--session-timeout-ms", "0"]).exit_code == 2
    assert runner.invoke(main, ["--bogus"]).exit_code == 2
    unsafe = runner.invoke(main, ["--unsafe-ignore-broker-epochs"])
    assert unsafe.exit_code == 2 and "MINIBROKER_ENABLE_TEST_FAULTS" in unsafe.output
    assert captured == []


def test_cli_help_lists_every_option_with_default() -> None:
    result = CliRunner().invoke(main, ["--help"], terminal_width=200)
    assert result.exit_code == 0
    for option in (
        "--node-id",
        "--listen",
        "--data-dir",
        "--session-timeout-ms",
        "--default-partitions",
        "--default-replication-factor",
        "--default-min-insync-replicas",
        "--default-unclean-leader-election",
        "--snapshot-every",
        "--log-level",
        "--config",
    ):
        assert option in result.output
    assert "default: 4000" in result.output and "MINIBROKER_SNAPSHOT_EVERY" in result.output


# ------------------------------------------------------------------ server glue


@pytest.fixture
async def process(tmp_path: Path):
    proc = ControllerProcess(
        ControllerConfig(data_dir=tmp_path / "c", listen_port=0, max_in_flight_per_connection=2)
    )
    await proc.start()
    try:
        yield proc
    finally:
        await proc.stop()


async def test_handler_exception_answers_unknown_server_error(process, caplog) -> None:
    assert process.server is not None and process.handlers is not None
    port = process.server.address[1]

    async def boom(request: Message) -> Message:
        raise RuntimeError("kaput")

    real = process.handlers.handlers[ApiKey.API_VERSIONS]
    process.handlers.handlers[ApiKey.API_VERSIONS] = boom
    client = await Client.connect(port)
    failed = await client.receive(client.send(ApiVersionsRequest()))
    assert failed.error_code == ErrorCode.UNKNOWN_SERVER_ERROR and "kaput" in failed.error_message
    assert "failed" in caplog.text
    process.handlers.handlers[ApiKey.API_VERSIONS] = real
    ok = await client.receive(client.send(ApiVersionsRequest()))
    assert isinstance(ok.body, ApiVersionsResponse)
    assert {k.api_key for k in ok.body.api_keys} >= {int(ApiKey.ALTER_PARTITION)}
    await client.close()


async def test_bounded_in_flight_and_ordered_responses(process) -> None:
    port = process.server.address[1]
    client = await Client.connect(port)
    registered = await client.receive(
        client.send(
            BrokerRegistrationRequest(
                broker_id=1,
                incarnation_id="i",
                listeners=[Listener(name="PLAINTEXT", host="127.0.0.1", port=1)],
            )
        )
    )
    assert isinstance(registered.body, BrokerRegistrationResponse)
    epoch = registered.body.broker_epoch
    end = epoch + 1
    # Two long-polls (at the log end) fill the in-flight limit; the ApiVersions behind
    # them waits, then everything comes back in request order.
    polls = [
        client.send(
            FetchMetadataRequest(broker_id=1, broker_epoch=epoch, from_offset=end, max_wait_ms=300)
        )
        for _ in range(2)
    ]
    quick = client.send(ApiVersionsRequest())
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    for cid in polls:
        assert (await client.receive(cid)).error_code == 0
    assert (await client.receive(quick)).error_code == 0
    assert loop.time() - t0 >= 0.25
    await client.close()


async def test_malformed_stream_closes_only_that_connection(process) -> None:
    port = process.server.address[1]
    good = await Client.connect(port)
    bad = await Client.connect(port)
    bad.writer.write(struct.pack(">i", -5) + b"junk")
    assert await asyncio.wait_for(bad.reader.read(100), 5) == b""
    ok = await good.receive(good.send(ApiVersionsRequest()))
    assert ok.error_code == 0
    unsupported = await good.receive(good.send(ApiVersionsRequest(), api_version=9))
    assert unsupported.error_code == ErrorCode.UNSUPPORTED_VERSION
    await good.close()
    await bad.close()
