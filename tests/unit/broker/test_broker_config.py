"""BrokerConfig parsing and validation."""

from __future__ import annotations

import pytest

from broker.config import BrokerConfig
from broker.config import ConfigError
from broker.config import ListenerSpec
from broker.config import parse_host_port
from broker.config import parse_listeners


def test_parse_listeners() -> None:
    specs = parse_listeners("PLAINTEXT://127.0.0.1:9092, internal://0.0.0.0:0")
    assert specs == [
        ListenerSpec("PLAINTEXT", "127.0.0.1", 9092),
        ListenerSpec("INTERNAL", "0.0.0.0", 0),
    ]
    assert str(specs[0]) == "PLAINTEXT://127.0.0.1:9092"
    assert parse_listeners("A://[::1]:1")[0].host == "::1"


@pytest.mark.parametrize(
    "value", ["", "127.0.0.1:9092", "P://h", "P://h:70000", "P://h:1,P://h:2", "1P://h:1"]
)
def test_parse_listeners_rejects(value: str) -> None:
    with pytest.raises(ConfigError):
        parse_listeners(value)


def test_parse_host_port() -> None:
    assert parse_host_port("localhost:9093", option="--controller") == ("localhost", 9093)
    with pytest.raises(ConfigError, match="--controller"):
        parse_host_port("localhost", option="--controller")
    with pytest.raises(ConfigError):
        parse_host_port("h:0", option="--controller")


def test_advertised_defaults_to_bound_ports() -> None:
    config = BrokerConfig(node_id=1, listeners=parse_listeners("PLAINTEXT://0.0.0.0:0"))
    config = config.with_bound_ports({"PLAINTEXT": 4242})
    assert config.advertised()["PLAINTEXT"] == ListenerSpec("PLAINTEXT", "127.0.0.1", 4242)


def test_advertised_port_zero_takes_the_bound_port() -> None:
    config = BrokerConfig(
        node_id=1,
        listeners=parse_listeners("PLAINTEXT://127.0.0.1:0"),
        advertised_listeners=parse_listeners("PLAINTEXT://broker1.example:0"),
    ).with_bound_ports({"PLAINTEXT": 5555})
    assert config.advertised()["PLAINTEXT"] == ListenerSpec("PLAINTEXT", "broker1.example", 5555)


def test_validation() -> None:
    with pytest.raises(ConfigError, match="node-id"):
        BrokerConfig(node_id=-1)
    with pytest.raises(ConfigError, match="advertised"):
        BrokerConfig(
            node_id=1,
            listeners=parse_listeners("A://h:1"),
            advertised_listeners=parse_listeners("B://h:1"),
        )
    with pytest.raises(ConfigError, match="flush-messages"):
        BrokerConfig(node_id=1, flush_messages=0)
