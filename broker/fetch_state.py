"""What the follower fetcher keeps per partition and the rule it truncates by: the
fetch state (phase, offset, last fetched epoch, failures), and Kafka's
`getOffsetTruncationState` (the largest common epoch between a follower and its
leader), pure so the simulation and the unit tests can call it directly."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import NamedTuple
from typing import Protocol

from broker.partition import Partition
from broker.partition import Role
from broker.storage.epoch_cache import UNDEFINED_EPOCH
from broker.storage.epoch_cache import UNDEFINED_EPOCH_OFFSET
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


class TruncationState(NamedTuple):
    """Where to truncate, and whether the reconciliation is complete (False: ask the
    leader again with our new latest epoch)."""

    offset: int
    completed: bool


def offset_truncation_state(
    leader_epoch: int,
    leader_end_offset: int,
    *,
    follower_end_offset_for: Callable[[int], tuple[int, int]],
    follower_leo: int,
    fetch_offset: int,
) -> TruncationState:
    """Kafka's AbstractFetcherThread.getOffsetTruncationState, case for case.

    (`leader_epoch`, `leader_end_offset`) is the leader's OffsetsForLeaderEpoch answer
    (or a Fetch diverging_epoch); `follower_end_offset_for(epoch)` is our own epoch
    cache's answer to the same question: (largest epoch <= it, its end offset)."""
    if leader_end_offset == UNDEFINED_EPOCH_OFFSET:
        # The leader cannot say: keep our log and fetch from where we are.
        return TruncationState(fetch_offset, True)
    if leader_epoch == UNDEFINED_EPOCH:
        # An answer without an epoch: its end offset is all we have.
        return TruncationState(min(leader_end_offset, follower_leo), True)
    follower_epoch, follower_end = follower_end_offset_for(leader_epoch)
    if follower_end == UNDEFINED_EPOCH_OFFSET:
        # We know no epoch <= the leader's (we were not tracking then): the leader's
        # end offset it is.
        return TruncationState(min(leader_end_offset, follower_leo), True)
    if follower_epoch != leader_epoch:
        # We do not have the epoch the leader answered with: cut our epochs above it
        # and ask again with the largest epoch below it that we have.
        return TruncationState(min(follower_end, follower_leo), False)
    return TruncationState(min(follower_end, leader_end_offset, follower_leo), True)


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
