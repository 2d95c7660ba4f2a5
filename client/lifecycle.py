"""What the producer, the consumer and the admin client share as asyncio clients: the
cluster client under them, `start()` / `close()` and `async with client:` around them."""

from __future__ import annotations

from types import TracebackType
from typing import Self

from client.cluster import ClusterClient


class AsyncClient:
    """`async with` starts the client and closes it on the way out, error or not."""

    _cluster: ClusterClient
    _started: bool = False

    @property
    def cluster(self) -> ClusterClient:
        """The metadata cache and connection pool."""
        return self._cluster

    async def start(self) -> None:
        """Connect to a bootstrap broker (and load metadata)."""
        await self._cluster.bootstrap()
        self._started = True

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
