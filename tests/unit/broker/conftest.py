"""Broker unit tests run on uvloop, like the broker; `harness` gives a ReplicaManager
over a real storage engine in a temp directory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import uvloop
from broker_harness import Harness

import broker.__main__ as cli
from broker.config import BrokerConfig


def pytest_asyncio_loop_factories(config: object, item: object) -> dict[str, object]:
    # The broker runs on uvloop, whose transports differ from asyncio's in small ways.
    return {"uvloop": uvloop.new_event_loop}


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    h = Harness(tmp_path / "broker")
    yield h
    await h.close()


@pytest.fixture
def captured(capture_run: Callable[[ModuleType], list[Any]]) -> list[BrokerConfig]:
    """The BrokerConfig each `python -m broker` invocation would have run with."""
    return capture_run(cli)
