"""ControllerChannel against an in-process fake controller (served by runtime.server)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.config import BrokerConfig
from broker.controller_channel import ClusterIdMismatchError
from broker.controller_channel import ControllerChannel
from broker.controller_channel import ControllerUnreachableError
from protocol.api import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import BrokerHeartbeatRequest
from protocol.messages import BrokerHeartbeatResponse
from protocol.messages import BrokerRegistrationRequest
from protocol.messages import BrokerRegistrationResponse
from protocol.messages import FetchMetadataRequest
from protocol.messages import FetchMetadataResponse
from protocol.messages import Listener
from protocol.messages import Message
from protocol.messages import MetadataEntry
from protocol.metadata_records import RegisterBrokerRecord
from protocol.metadata_records import UnfenceBrokerRecord
from runtime.server import ListenerServer
from runtime.server import RequestContext


class FakeController:
    def __init__(self) -> None:
        self.epoch = 0
        self.registrations: list[BrokerRegistrationRequest] = []
        self.heartbeats: list[BrokerHeartbeatRequest] = []
        self.log: list[MetadataEntry] = []
        self.stale_next_heartbeat = False
        # Answer as a controller that lost its data: another cluster id, no broker
        # registered, and (as a careless controller might) metadata to anyone.
        self.foreign = False
        self.server: ListenerServer | None = None

    async def register(self, ctx: RequestContext, req: Message) -> Message:
        assert isinstance(req, BrokerRegistrationRequest)
        self.registrations.append(req)
        if self.foreign:
            return BrokerRegistrationResponse(
                error_code=ErrorCode.INCONSISTENT_CLUSTER_ID,
                error_message="this controller runs cluster D",
                cluster_id="D",
            )
        if req.cluster_id not in (None, "C"):
            return BrokerRegistrationResponse(
                error_code=ErrorCode.INCONSISTENT_CLUSTER_ID, error_message="wrong cluster"
            )
        self.epoch = len(self.log)
        self.log.append(
            MetadataEntry(
                offset=self.epoch,
                record=RegisterBrokerRecord(
                    broker_id=req.broker_id,
                    broker_epoch=self.epoch,
                    incarnation_id=req.incarnation_id,
                    listeners=[],
                ),
            )
        )
        return BrokerRegistrationResponse(broker_epoch=self.epoch, cluster_id="C")

    async def heartbeat(self, ctx: RequestContext, req: Message) -> Message:
        assert isinstance(req, BrokerHeartbeatRequest)
        self.heartbeats.append(req)
        if self.foreign:
            return BrokerHeartbeatResponse(error_code=ErrorCode.STALE_BROKER_EPOCH)
        if self.stale_next_heartbeat:
            self.stale_next_heartbeat = False
            return BrokerHeartbeatResponse(error_code=ErrorCode.STALE_BROKER_EPOCH)
        caught_up = req.current_metadata_offset >= req.broker_epoch
        if req.want_shut_down:
            return BrokerHeartbeatResponse(is_fenced=True, should_shut_down=True)
        if caught_up:
            self.log.append(
                MetadataEntry(
                    offset=len(self.log),
                    record=UnfenceBrokerRecord(broker_id=req.broker_id, broker_epoch=self.epoch),
                )
            )
        return BrokerHeartbeatResponse(is_caught_up=caught_up, is_fenced=not caught_up)

    async def fetch_metadata(self, ctx: RequestContext, req: Message) -> Message:
        assert isinstance(req, FetchMetadataRequest)
        entries = self.log[req.from_offset :]
        if not entries and req.max_wait_ms:
            await asyncio.sleep(min(req.max_wait_ms, 50) / 1000)
            entries = self.log[req.from_offset :]
        if self.foreign:  # an empty image, from the start of a fresh log
            return FetchMetadataResponse(
                cluster_id="D", is_snapshot=True, entries=[], next_offset=1, high_watermark=1
            )
        return FetchMetadataResponse(
            cluster_id="C",
            entries=entries,
            next_offset=req.from_offset + len(entries),
            high_watermark=len(self.log),
        )

    async def start(self) -> int:
        self.server = ListenerServer(
            "CONTROLLER",
            "127.0.0.1",
            0,
            {
                int(ApiKey.BROKER_REGISTRATION): self.register,
                int(ApiKey.BROKER_HEARTBEAT): self.heartbeat,
                int(ApiKey.FETCH_METADATA): self.fetch_metadata,
            },
        )
        port = await self.server.bind()
        await self.server.start_serving()
        return port


def make_channel(port: int, offset: list[int]) -> ControllerChannel:
    config = BrokerConfig(
        node_id=1,
        controller=(("127.0.0.1", port),),
        data_dir=Path("/nonexistent"),
        heartbeat_interval_ms=20,
        metadata_max_wait_ms=50,
    )
    return ControllerChannel(config, incarnation_id="inc", metadata_offset=lambda: offset[0])


LISTENERS = [Listener(name="PLAINTEXT", host="127.0.0.1", port=1)]


@contextlib.asynccontextmanager
async def running(
    channel: ControllerChannel,
    fake: FakeController,
    on_metadata: Callable[[FetchMetadataResponse], Awaitable[None]],
) -> AsyncIterator[None]:
    """The heartbeat and metadata loops, stopped and everything closed afterwards."""
    tasks = [
        asyncio.create_task(channel.metadata_loop(on_metadata)),
        asyncio.create_task(channel.heartbeat_loop()),
    ]
    try:
        yield
    finally:
        channel.stop_loops()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await channel.close()
        assert fake.server is not None
        await fake.server.close()


async def test_register_follow_unfence_reregister_and_shut_down() -> None:
    fake = FakeController()
    port = await fake.start()
    offset = [-1]
    channel = make_channel(port, offset)
    epoch = await channel.register(
        cluster_id=None, listeners=LISTENERS, clean_shutdown=True, timeout_s=5
    )
    assert (epoch, channel.cluster_id) == (0, "C")

    async def on_metadata(resp: FetchMetadataResponse) -> None:
        offset[0] = resp.entries[-1].offset

    async with running(channel, fake, on_metadata):
        async with asyncio.timeout(5):
            await channel.caught_up.wait()
            await channel.unfenced.wait()
        # STALE_BROKER_EPOCH: the channel registers again (same incarnation).
        fake.stale_next_heartbeat = True
        async with asyncio.timeout(5):
            while channel.broker_epoch == epoch:
                await asyncio.sleep(0.01)
        assert len(fake.registrations) == 2
        assert {r.incarnation_id for r in fake.registrations} == {"inc"}
        channel.stop_loops()
        assert await channel.controlled_shutdown(2) is True
        assert fake.heartbeats[-1].want_shut_down


async def test_nothing_is_applied_from_a_controller_that_lost_its_data() -> None:
    """The controller comes back with a new cluster id and no registrations: the
    broker's re-registration (naming the cluster it learnt) is refused, and no
    FetchMetadata answer of that controller reaches the image, even one it sends
    against the rules. Once the old controller is back, metadata flows again."""
    fake = FakeController()
    port = await fake.start()
    offset = [-1]
    channel = make_channel(port, offset)
    await channel.register(cluster_id=None, listeners=LISTENERS, clean_shutdown=True, timeout_s=5)
    applied: list[FetchMetadataResponse] = []

    async def on_metadata(resp: FetchMetadataResponse) -> None:
        applied.append(resp)
        if resp.entries:
            offset[0] = resp.entries[-1].offset

    async with running(channel, fake, on_metadata):
        async with asyncio.timeout(5):
            await channel.caught_up.wait()
        fake.foreign = True
        async with asyncio.timeout(5):
            while channel.accepted.is_set():
                await asyncio.sleep(0.01)
        seen = len(applied)
        await asyncio.sleep(0.5)  # many heartbeats and fetch attempts
        assert len(applied) == seen
        assert all(r.cluster_id == "C" for r in applied)
        refused = fake.registrations[1:]
        assert refused and all(r.cluster_id == "C" for r in refused)
        fake.foreign = False  # the controller's data is back
        async with asyncio.timeout(5):
            await channel.accepted.wait()
            while len(applied) == seen:
                fake.log.append(
                    MetadataEntry(
                        offset=len(fake.log),
                        record=UnfenceBrokerRecord(broker_id=1, broker_epoch=fake.epoch),
                    )
                )
                await asyncio.sleep(0.05)
        assert all(r.cluster_id == "C" and not r.is_snapshot for r in applied)


async def test_cluster_id_mismatch() -> None:
    fake = FakeController()
    port = await fake.start()
    channel = make_channel(port, [-1])
    with pytest.raises(ClusterIdMismatchError, match="cluster id mismatch"):
        await channel.register(
            cluster_id="X", listeners=LISTENERS, clean_shutdown=True, timeout_s=5
        )
    await channel.close()
    assert fake.server is not None
    await fake.server.close()


def closed_port() -> int:
    """A port nobody listens on (bound once, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_unreachable_controller_gives_up_after_the_bound() -> None:
    channel = make_channel(closed_port(), [-1])
    start = time.monotonic()
    with pytest.raises(ControllerUnreachableError, match=r"unreachable for 0\.5s"):
        await channel.register(
            cluster_id=None, listeners=LISTENERS, clean_shutdown=True, timeout_s=0.5
        )
    assert time.monotonic() - start < 5
    await channel.close()


async def test_controlled_shutdown_is_bounded_without_a_controller() -> None:
    channel = make_channel(closed_port(), [-1])
    start = time.monotonic()
    assert await channel.controlled_shutdown(0.3) is False
    assert time.monotonic() - start < 3
    await channel.close()
