"""Fixtures for the controller unit tests: a controller driven in-process through its
handlers, with real metadata log files in a temp dir and a fake clock."""

from __future__ import annotations

import random
import uuid
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import controller.app
from controller.app import recover
from controller.config import ControllerConfig
from controller.handlers import ControllerHandlers
from controller.liveness import BrokerSessions
from controller.metadata_writer import MetadataWriter
from controller.state import MetadataImage
from protocol.messages import BrokerHeartbeatRequest
from protocol.messages import BrokerHeartbeatResponse
from protocol.messages import BrokerRegistrationRequest
from protocol.messages import BrokerRegistrationResponse
from protocol.messages import CreatableReplicaAssignment
from protocol.messages import CreatableTopic
from protocol.messages import CreatableTopicResult
from protocol.messages import CreateTopicsRequest
from protocol.messages import Listener
from protocol.metadata_records import PartitionRecord

CLUSTER_ID = "test-cluster-id"
AS_A_BROKER = "<as a broker would>"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Harness:
    """One controller over real files; `reopen()` is a controller restart."""

    def __init__(self, data_dir: Path, **overrides: Any) -> None:
        self.clock = FakeClock()
        self.config = ControllerConfig(data_dir=data_dir, **overrides)
        self.incarnations: dict[int, str] = {}
        self.writer: MetadataWriter
        self.handlers: ControllerHandlers
        self.sessions: BrokerSessions

    async def open(self) -> None:
        self.closed = False
        metadata_log, image, recovered = recover(self.config)
        self.writer = MetadataWriter(
            metadata_log,
            image,
            snapshot_every=self.config.snapshot_every,
            max_waiters=self.config.max_metadata_waiters,
            retained=recovered.entries,
            snapshot_offset=recovered.snapshot_offset,
        )
        self.sessions = BrokerSessions(self.config.session_timeout_s, clock=self.clock)
        self.sessions.touch_all(
            (b.broker_id, b.broker_epoch) for b in image.brokers.values() if not b.fenced
        )
        self.handlers = ControllerHandlers(
            self.config, self.writer, self.sessions, CLUSTER_ID, rng=random.Random(7)
        )

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            await self.writer.close()

    async def reopen(self) -> None:
        await self.close()
        await self.open()

    @property
    def image(self) -> MetadataImage:
        return self.writer.image

    def run_for(self, seconds: float) -> None:
        """The controller runs for `seconds`: the clock moves in liveness-check steps,
        each noted as the liveness loop notes it. (A bare `clock.advance` longer than
        the stall threshold is a controller stall: controller/liveness.py.)"""
        end = self.clock.now + seconds
        step = self.sessions.check_interval_s
        self.sessions.observe()
        while self.clock.now + step < end:
            self.clock.advance(step)
            self.sessions.observe()
        self.clock.now = end
        self.sessions.observe()

    async def register(
        self,
        broker_id: int,
        *,
        new_incarnation: bool = True,
        cluster_id: str | None = AS_A_BROKER,
        empty_disk: bool = False,
    ) -> BrokerRegistrationResponse:
        """As a real broker registers: without a cluster id the first time, naming it
        afterwards (its meta.properties holds it), without one again when `empty_disk`
        (its data directory was lost); or with the `cluster_id` given."""
        if cluster_id == AS_A_BROKER:
            first = broker_id not in self.incarnations
            cluster_id = None if first or empty_disk else CLUSTER_ID
        if new_incarnation or broker_id not in self.incarnations:
            self.incarnations[broker_id] = uuid.uuid4().hex
        return await self.handlers.broker_registration(
            BrokerRegistrationRequest(
                broker_id=broker_id,
                cluster_id=cluster_id,
                incarnation_id=self.incarnations[broker_id],
                listeners=[Listener(name="PLAINTEXT", host="127.0.0.1", port=9100 + broker_id)],
            )
        )

    async def heartbeat(
        self, broker_id: int, epoch: int, offset: int | None = None, **kwargs: Any
    ) -> BrokerHeartbeatResponse:
        return await self.handlers.broker_heartbeat(
            BrokerHeartbeatRequest(
                broker_id=broker_id,
                broker_epoch=epoch,
                current_metadata_offset=self.image.last_offset if offset is None else offset,
                **kwargs,
            )
        )

    async def start_broker(self, broker_id: int) -> int:
        """Register and unfence (caught up at once); return the broker epoch."""
        response = await self.register(broker_id)
        assert response.error_code == 0, response
        beat = await self.heartbeat(broker_id, response.broker_epoch)
        assert beat.error_code == 0 and not beat.is_fenced, beat
        return response.broker_epoch

    async def create_topic(
        self,
        name: str,
        partitions: int = 1,
        replication_factor: int = 1,
        configs: dict[str, str] | None = None,
    ) -> CreatableTopicResult:
        return await self._create(
            CreatableTopic(
                name=name,
                num_partitions=partitions,
                replication_factor=replication_factor,
                configs=configs or {},
            )
        )

    async def _create(self, topic: CreatableTopic) -> CreatableTopicResult:
        response = await self.handlers.create_topics(CreateTopicsRequest(topics=[topic]))
        return response.topics[0]

    async def create_assigned(
        self, name: str, assignment: list[list[int]], configs: dict[str, str] | None = None
    ) -> None:
        """A topic with the replicas of each partition given (first = preferred leader)."""
        result = await self._create(
            CreatableTopic(
                name=name,
                assignments=[
                    CreatableReplicaAssignment(partition_index=i, broker_ids=b)
                    for i, b in enumerate(assignment)
                ],
                configs=configs or {},
            )
        )
        assert result.error_code == 0, result

    def partition(self, topic: str, partition: int = 0) -> PartitionRecord:
        image_topic = self.image.topic_by_name(topic)
        assert image_topic is not None
        return image_topic.partitions[partition]


@pytest.fixture
async def make_harness() -> AsyncIterator[Callable[..., Awaitable[Harness]]]:
    """`await make_harness(dir, **config)`: an opened Harness, closed after the test."""
    opened: list[Harness] = []

    async def make(data_dir: Path, **overrides: Any) -> Harness:
        data_dir.mkdir(parents=True, exist_ok=True)
        h = Harness(data_dir, **overrides)
        await h.open()
        opened.append(h)
        return h

    yield make
    for h in opened:
        await h.close()


@pytest.fixture
async def harness(make_harness: Callable[..., Awaitable[Harness]], tmp_path: Path) -> Harness:
    return await make_harness(tmp_path / "controller")


@pytest.fixture
def captured(capture_run: Callable[[ModuleType], list[Any]]) -> list[ControllerConfig]:
    """The ControllerConfig each controller CLI invocation would have run with."""
    return capture_run(controller.app)
