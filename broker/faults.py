"""Test-only fault controls, consulted before the broker sends or answers an RPC.

The production object does nothing; issue 3's scenario tests plug in one that drops,
delays or fails chosen APIs (to stage stale metadata, zombie replicas, lost
AlterPartition answers). Keeping the hook points in rpc.py and network.py now means
those tests need no changes to the request path later.
"""

from __future__ import annotations


class Faults:
    """No faults. Subclass and override to inject them (tests only)."""

    enabled = False

    async def before_send(self, peer: str, api_key: int) -> None:
        """Called before an outgoing request is written; may sleep or raise
        ConnectionError to simulate a slow or broken link."""

    async def before_answer(self, listener: str, api_key: int) -> None:
        """Called before a handler runs for an incoming request; may sleep or raise."""


NO_FAULTS = Faults()
