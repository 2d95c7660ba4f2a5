"""The controller's settings come from one declaration each (issue 14, item 3): the
defaults it gives new topics take the topic configs' bounds, one flag may fill two
fields (`--listen`), and TOML errors name the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from controller.__main__ import main
from controller.config import ControllerConfig
from runtime.settings import ConfigError


def test_a_default_for_new_topics_is_refused_where_the_topic_config_would_be(
    captured: list[ControllerConfig],
) -> None:
    """`--default-min-insync-replicas 2147483648` was accepted and then stored with every
    new topic, a min.insync.replicas that CreateTopics itself refuses."""
    result = CliRunner().invoke(main, ["--default-min-insync-replicas", str(2**31)])
    assert result.exit_code == 2, result.output
    assert "--default-min-insync-replicas" in result.output and "2147483647" in result.output
    assert captured == []
    with pytest.raises(ConfigError, match="--default-min-insync-replicas must be >= 1, got 0"):
        ControllerConfig(default_min_insync_replicas=0)


def test_one_flag_fills_listen_host_and_listen_port(
    captured: list[ControllerConfig], tmp_path: Path
) -> None:
    runner = CliRunner()
    assert runner.invoke(main, ["--listen", "[::1]:0"]).exit_code == 0
    toml = tmp_path / "controller.toml"
    toml.write_text('listen = "10.0.0.7:19093"\n')
    assert runner.invoke(main, ["--config", str(toml)]).exit_code == 0
    by_env = runner.invoke(main, [], env={"MINIBROKER_LISTEN": "h:1"})
    assert by_env.exit_code == 0, by_env.output
    assert [(c.listen_host, c.listen_port) for c in captured] == [
        ("::1", 0),
        ("10.0.0.7", 19093),
        ("h", 1),
    ]
    assert ControllerConfig().listen == "127.0.0.1:9093"


def test_a_bad_toml_value_names_the_file_and_the_key(
    captured: list[ControllerConfig], tmp_path: Path
) -> None:
    toml = tmp_path / "controller.toml"
    toml.write_text('session-timeout-ms = "soon"\n')
    result = CliRunner().invoke(main, ["--config", str(toml)])
    assert result.exit_code == 2
    output = " ".join(result.output.split())
    assert str(toml) in output and "session-timeout-ms" in output and "'soon'" in output
    assert captured == []


def test_a_bool_setting_takes_a_bare_flag_a_value_or_the_environment(
    captured: list[ControllerConfig],
) -> None:
    runner = CliRunner()
    assert runner.invoke(main, ["--default-unclean-leader-election"]).exit_code == 0
    assert runner.invoke(main, ["--default-unclean-leader-election", "false"]).exit_code == 0
    env = {"MINIBROKER_DEFAULT_UNCLEAN_LEADER_ELECTION": "1"}
    assert runner.invoke(main, [], env=env).exit_code == 0
    assert [c.default_unclean_leader_election for c in captured] == [True, False, True]
