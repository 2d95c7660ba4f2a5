"""Shared fixtures for the client's unit tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import pytest
from client_fakes import FakeBroker
from client_fakes import StartBroker


@pytest.fixture
async def start_broker() -> AsyncIterator[StartBroker]:
    """start_broker(partitions, leader_epoch=...): a started FakeBroker that leads
    `partitions` partitions of topic "t" at that epoch (no topic when 0); every one is
    stopped at the end."""
    async with AsyncExitStack() as started:

        async def start(partitions: int = 0, *, leader_epoch: int = 0) -> FakeBroker:
            broker = FakeBroker()
            if partitions:
                broker.create_topic("t", partitions, leader_epoch=leader_epoch)
            await broker.start()
            started.push_async_callback(broker.stop)
            return broker

        yield start
