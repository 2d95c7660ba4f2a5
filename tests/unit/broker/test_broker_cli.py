"""`python -m broker` flag handling: precedence flags > env > TOML > defaults."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import broker.__main__ as cli
from broker.config import BrokerConfig


def test_defaults(captured: list[BrokerConfig]) -> None:
    result = CliRunner().invoke(cli.main, ["--node-id", "3"])
    assert result.exit_code == 0, result.output
    config = captured[0]
    assert config.node_id == 3
    assert str(config.listeners[0]) == "PLAINTEXT://127.0.0.1:9092"
    assert config.controller == (("127.0.0.1", 9093),)
    assert config.data_dir == Path("minibroker-data/broker-3")
    assert (config.heartbeat_interval_ms, config.segment_bytes, config.retention_ms) == (
        500,
        134_217_728,
        604_800_000,
    )
    assert (config.flush_messages, config.flush_ms, config.max_message_bytes) == (
        None,
        None,
        1_048_588,
    )


def test_precedence(captured: list[BrokerConfig], tmp_path: Path) -> None:
    toml = tmp_path / "broker.toml"
    toml.write_text(
        'node-id = 7\nheartbeat-interval-ms = 111\nretention-ms = 5\ncontroller = "h:1"\n'
    )
    env = {"MINIBROKER_HEARTBEAT_INTERVAL_MS": "222", "MINIBROKER_RETENTION_MS": "6"}
    result = CliRunner().invoke(cli.main, ["--config", str(toml), "--retention-ms", "7"], env=env)
    assert result.exit_code == 0, result.output
    config = captured[0]
    assert config.node_id == 7  # TOML
    assert config.controller == (("h", 1),)  # TOML
    assert config.heartbeat_interval_ms == 222  # env over TOML
    assert config.retention_ms == 7  # flag over env


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--node-id"),
        (["--node-id", "-1"], "node-id"),
        (["--node-id", "1", "--listeners", "bad"], "NAME://HOST:PORT"),
        (["--node-id", "1", "--controller", "nohost"], "--controller"),
        (["--node-id", "1", "--flush-messages", "0"], "flush-messages"),
    ],
)
def test_bad_flags_exit_2(captured: list[BrokerConfig], args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 2
    assert message in result.output
    assert not captured


def test_bad_toml(captured: list[BrokerConfig], tmp_path: Path) -> None:
    toml = tmp_path / "broker.toml"
    toml.write_text("node-id = 1\nno-such-setting = 3\n")
    result = CliRunner().invoke(cli.main, ["--config", str(toml)])
    assert result.exit_code == 2 and "no-such-setting" in result.output
    toml.write_text("node-id = [")
    result = CliRunner().invoke(cli.main, ["--config", str(toml)])
    assert result.exit_code == 2 and "TOML" in result.output


def test_help_lists_every_option() -> None:
    result = CliRunner().invoke(cli.main, ["--help"])
    assert result.exit_code == 0
    for option in (
        "--node-id",
        "--listeners",
        "--advertised-listeners",
        "--controller",
        "--data-dir",
        "--heartbeat-interval-ms",
        "--segment-bytes",
        "--segment-ms",
        "--retention-ms",
        "--retention-bytes",
        "--flush-messages",
        "--flush-ms",
        "--max-message-bytes",
        "--replica-lag-time-max-ms",
        "--log-level",
        "--config",
        "MINIBROKER_NODE_ID",
    ):
        assert option in result.output
