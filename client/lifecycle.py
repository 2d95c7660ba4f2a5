"""What the producer, the consumer and the admin client share as asyncio clients:
`start()` / `close()` and `async with client:` around them."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class AsyncClient:
    """`async with` starts the client and closes it on the way out, error or not."""

    async def start(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
