"""What the follower fetcher keeps per partition: the fetch state (phase, offset,
last fetched epoch, failures). The rule it truncates by (Kafka's
`getOffsetTruncationState`) is `offset_truncation_state` in runtime/epoch_lineage.py."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Protocol

from broker.partition import Partition
from broker.partition import Role
from protocol.messages import Message

if TYPE_CHECKING:
    pass


TopicPartition = tuple[str, int]


# A partition that keeps failing waits at most this many backoffs between attempts.
MAX_BACKOFF_FACTOR = 8


# Truncation rounds (OffsetsForLeaderEpoch answers) one partition may take before it
# backs off: each round drops at least one epoch, so this is never reached normally.
MAX_TRUNCATION_ROUNDS = 1000


# A source with nothing to do re-checks at least this often.
IDLE_WAKE_S = 1.0


class Phase(enum.Enum):
    TRUNCATING = "truncating"
    FETCHING = "fetching"


@dataclass(eq=False)
class PartitionFetchState:
    partition: Partition
    leader_id: int
    leader_epoch: int
    phase: Phase = Phase.TRUNCATING
    ready_at: float = 0.0  # loop time before which the partition waits (backoff)
    failures: int = 0  # consecutive failures, for the backoff
    truncation_rounds: int = 0
    out_of_range: int = 0  # consecutive OFFSET_OUT_OF_RANGE above the leader's log start

    @property
    def tp(self) -> TopicPartition:
        return self.partition.tp

    def still_valid(self) -> bool:
        """The partition still follows this leader at this epoch."""
        p = self.partition
        return (
            p.role is Role.FOLLOWER
            and p.leader_id == self.leader_id
            and p.leader_epoch == self.leader_epoch
        )


class Client(Protocol):
    async def request(self, body: Message, *, timeout_s: float | None = None) -> Message: ...

    async def close(self) -> None: ...


ClientFactory = Callable[[int, str, int], Client]
