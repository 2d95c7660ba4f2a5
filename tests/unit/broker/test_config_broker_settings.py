"""The broker's settings come from one declaration each (issue 14, item 3): a flag that
sets a topic config's default takes that topic config's bounds, and TOML errors name
the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import broker.__main__ as cli
from broker.config import BrokerConfig
from broker.config import ConfigError
from broker.server import base_log_config
from protocol.topic_configs import LOG_CONFIGS
from runtime.settings import settings_of


@pytest.mark.parametrize(
    ("flag", "lowest"),
    [("--segment-bytes", "14"), ("--max-message-bytes", "0"), ("--flush-ms", "0")],
)
def test_a_broker_default_takes_every_value_its_topic_config_takes(
    captured: list[BrokerConfig], flag: str, lowest: str
) -> None:
    """`-c segment.bytes=14` was accepted for a topic while `--segment-bytes 14` was
    refused for the broker (minimum 1024): one rule for both now, Kafka's."""
    result = CliRunner().invoke(cli.main, ["--node-id", "1", flag, lowest])
    assert result.exit_code == 0, result.output
    assert getattr(captured[0], flag[2:].replace("-", "_")) == int(lowest)


def test_a_broker_default_out_of_its_topic_config_bounds_is_refused_at_the_flag(
    captured: list[BrokerConfig],
) -> None:
    """`--segment-bytes 2147483648` passed the flag and then failed when the broker
    built its LogConfig; now the flag says what is accepted."""
    for value in ("13", str(2**31)):
        result = CliRunner().invoke(cli.main, ["--node-id", "1", "--segment-bytes", value])
        assert result.exit_code == 2, result.output
        assert "--segment-bytes" in result.output and "14<=x<=2147483647" in result.output
    assert captured == []


def test_a_config_built_in_code_is_checked_by_the_same_declaration() -> None:
    assert BrokerConfig(node_id=1, segment_bytes=14).segment_bytes == 14
    with pytest.raises(ConfigError, match=r"--segment-bytes must be >= 14, got 13"):
        BrokerConfig(node_id=1, segment_bytes=13)
    with pytest.raises(ConfigError, match=r"--segment-bytes must be <= 2147483647"):
        BrokerConfig(node_id=1, segment_bytes=2**31)
    with pytest.raises(ConfigError, match=r"--heartbeat-interval-ms must be an integer"):
        BrokerConfig(node_id=1, heartbeat_interval_ms="fast")  # type: ignore[arg-type]


def test_the_broker_wide_log_config_is_the_broker_settings() -> None:
    config = BrokerConfig(node_id=1, segment_bytes=4096, retention_ms=-1, flush_messages=3)
    assert config.log_config() == base_log_config(config)
    assert (config.log_config().segment_bytes, config.log_config().flush_messages) == (4096, 3)
    # Every broker setting that is a topic config's default is a storage config.
    topic_fields = {
        d.setting.topic_config.field for d in settings_of(BrokerConfig) if d.setting.topic_config
    }
    assert topic_fields <= {d.field for d in LOG_CONFIGS.values()}


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('segment-bytes = "big"', "not a valid integer"),
        ("heartbeat-interval-ms = true", "must not be true or false"),
        ("segment-bytes = 13", "14<=x<=2147483647"),
        ("listeners = [1, 2]", "single value"),
    ],
)
def test_a_bad_toml_value_names_the_file_and_the_key(
    captured: list[BrokerConfig], tmp_path: Path, line: str, problem: str
) -> None:
    toml = tmp_path / "broker.toml"
    toml.write_text(f"node-id = 1\n{line}\n")
    result = CliRunner().invoke(cli.main, ["--config", str(toml)])
    assert result.exit_code == 2, result.output
    output = " ".join(result.output.split())
    assert str(toml) in output and line.split(" = ")[0] in output and problem in output
    assert captured == []
