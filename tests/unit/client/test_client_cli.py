"""CLI pieces that need no cluster: record formats, configs, port layout, errors."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from client.cli import _formatter
from client.cli import _parse_configs
from client.cli import cli
from client.dev_cluster import DevCluster
from client.dev_cluster import DevClusterError
from client.dev_cluster import broker_ports
from client.types import ConsumerRecord

RECORD = ConsumerRecord("t", 2, 41, 3, 1700000000000, b"k", b"v\xff", (("h", b"1"),))


def test_value_format_is_binary_safe() -> None:
    assert _formatter("value")(RECORD) == b"v\xff\n"
    assert _formatter("value")(RECORD._replace(value=None)) == b"\n"


def test_full_format_has_partition_offset_epoch_key_value() -> None:
    line = _formatter("full")(RECORD).decode()
    for part in ("partition=2", "offset=41", "leader_epoch=3", "key=k", "value=v\\xff"):
        assert part in line


def test_json_format() -> None:
    obj = json.loads(_formatter("json")(RECORD))
    assert obj["partition"] == 2 and obj["offset"] == 41 and obj["leader_epoch"] == 3
    assert obj["key"] == "k" and obj["headers"] == {"h": "1"}


def test_template_format() -> None:
    assert _formatter(r"%p:%o:%e %k=%v %% %x\n")(RECORD) == b"2:41:3 k=v\\xff % %x\n"


def test_configs() -> None:
    assert _parse_configs(("retention.ms=1000", "a = b")) == {"retention.ms": "1000", "a": "b"}
    with pytest.raises(click.BadParameter):
        _parse_configs(("nope",))


def test_dev_port_layout() -> None:
    assert broker_ports(9092, 3) == [9092, 9094, 9096]
    cluster = DevCluster(data_dir=Path("x"), brokers=3)
    assert cluster.controller_port == 9093
    assert cluster.bootstrap == "127.0.0.1:9092,127.0.0.1:9094,127.0.0.1:9096"
    with pytest.raises(DevClusterError, match="clashes"):
        DevCluster(data_dir=Path("x"), brokers=2, controller_port=9094)


def test_bad_bootstrap_is_one_line() -> None:
    result = CliRunner().invoke(cli, ["topic", "list", "-b", "host:notaport"])
    assert result.exit_code == 1
    assert (
        result.output.strip()
        == "error: bad bootstrap server 'host:notaport': port must be a number"
    )


def test_offset_and_from_beginning_exclude_each_other() -> None:
    result = CliRunner().invoke(cli, ["consume", "t", "--offset", "3", "--from-beginning"])
    assert result.exit_code == 2
    assert "exclude each other" in result.output


def test_bootstrap_before_the_command_and_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("MINIBROKER_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    runner = CliRunner()
    assert "127.0.0.1:1" in runner.invoke(cli, ["topic", "list"]).output
    assert "127.0.0.1:2 " in runner.invoke(cli, ["-b", "127.0.0.1:2", "topic", "list"]).output
    result = runner.invoke(cli, ["-b", "127.0.0.1:2", "topic", "list", "-b", "127.0.0.1:3"])
    assert "127.0.0.1:3 " in result.output


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--topic", "t", "--operation", "Read", "--host", "nothost"], "neither an IP address"),
        (["--group", "g", "--operation", "Write"], "does not apply to a Group"),
        (["--topic", "t", "--operation", "Fly"], "is not an ACL operation"),
        (["--operation", "Read"], "name a resource"),
        (["--topic", "t", "--operation", "Read", "--resource-pattern-type", "match"], "match"),
    ],
)
def test_acl_add_refuses_bad_input_before_any_connection(args: list[str], says: str) -> None:
    """Nothing is sent, so no cluster is needed (the bootstrap address is closed)."""
    result = CliRunner().invoke(
        cli, ["acl", "add", "--allow-principal", "User:a", *args, "-b", "127.0.0.1:1"]
    )
    assert result.exit_code == 2, result.output
    assert says in result.output
    assert "no broker reachable" not in result.output
