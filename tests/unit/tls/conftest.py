"""TLS tests run on both loops: the servers run on uvloop, whose transports differ
from asyncio's (uvloop starts reading a new connection whatever connection_made
asked: a TLS layer added after it lost the ClientHello), and clients on either."""

from __future__ import annotations

import asyncio

import uvloop


def pytest_asyncio_loop_factories(config: object, item: object) -> dict[str, object]:
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
