"""What the controller's parts (cluster membership, replication, topics, producer
ids, the metadata feed) share: the configuration, the single metadata writer, the
broker sessions, and the little state that lives outside the metadata log."""

from __future__ import annotations

import random
from dataclasses import dataclass
from dataclasses import field

from controller.config import ControllerConfig
from controller.faults import Faults
from controller.liveness import BrokerSessions
from controller.metadata_writer import MetadataWriter
from controller.state import MetadataImage


@dataclass
class ControllerContext:
    config: ControllerConfig
    writer: MetadataWriter
    sessions: BrokerSessions
    cluster_id: str
    faults: Faults
    rng: random.Random
    # This start formatted `cluster_id` on an empty data dir.
    new_cluster: bool = False
    # (broker id, broker epoch) of brokers in controlled shutdown: never unfenced
    # again in that epoch. One entry per broker at most (dropped on re-registration).
    shutting_down: set[tuple[int, int]] = field(default_factory=set)
    # broker id -> broker epoch of a known broker's registration with an empty data
    # directory (its disk was lost): an unclean election takes its replicas last.
    # One entry per broker at most (dropped at its next registration); not kept
    # across controller restarts.
    lost_data_at_registration: dict[int, int] = field(default_factory=dict)
    unclean_elections: int = 0

    @property
    def image(self) -> MetadataImage:
        return self.writer.image

    def lost_data(self, image: MetadataImage) -> set[int]:
        """Brokers whose current incarnation came back with an empty data directory."""
        return {
            broker_id
            for broker_id, epoch in self.lost_data_at_registration.items()
            if (broker := image.brokers.get(broker_id)) is not None and broker.broker_epoch == epoch
        }


class ControllerPart:
    """Base of the controller's parts: shorthands into the shared context."""

    def __init__(self, ctx: ControllerContext) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self.writer = ctx.writer
        self.sessions = ctx.sessions
        self.cluster_id = ctx.cluster_id

    @property
    def image(self) -> MetadataImage:
        return self.ctx.writer.image
