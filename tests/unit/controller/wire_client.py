"""A bare client for the controller's unit tests that go over a real connection."""

from __future__ import annotations

import asyncio
from typing import Any

from protocol.connection import ClientConnection
from protocol.connection import Response
from protocol.messages import Message


class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.conn = ClientConnection("test")
        self.responses: dict[int, Response] = {}

    @classmethod
    async def connect(cls, port: int) -> Client:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 5)
        return cls(reader, writer)

    def send(self, body: Message, api_version: int | None = None) -> int:
        cid, data = self.conn.send_request(body, api_version=api_version)
        self.writer.write(data)
        return cid

    async def receive(self, cid: int, timeout: float = 5.0) -> Response:
        async def loop() -> Response:
            while cid not in self.responses:
                data = await self.reader.read(65536)
                if not data:
                    raise ConnectionError("closed by the controller")
                for r in self.conn.receive_data(data):
                    self.responses[r.correlation_id] = r
            return self.responses.pop(cid)

        return await asyncio.wait_for(loop(), timeout)

    async def call(self, body: Message) -> Any:
        response = await self.receive(self.send(body))
        assert response.error_code == 0, response
        return response.body

    async def close(self) -> None:
        self.writer.close()
