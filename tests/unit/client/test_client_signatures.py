"""send_and_wait takes send's parameters (client/signatures.py): help() and type
checkers show them, and a wrong argument fails as it would on send."""

from __future__ import annotations

import inspect

import pytest

from client import AsyncProducer
from client import Producer


@pytest.mark.parametrize("producer", [AsyncProducer, Producer])
def test_send_and_wait_shows_the_parameters_of_send(producer: type) -> None:
    send = inspect.signature(producer.send)
    send_and_wait = inspect.signature(producer.send_and_wait)
    assert list(send_and_wait.parameters.values()) == list(send.parameters.values())
    assert send_and_wait.return_annotation == "RecordMetadata"
    assert "timestamp_ms" in send_and_wait.parameters
