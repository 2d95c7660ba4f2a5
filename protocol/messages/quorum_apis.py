"""The controller quorum's APIs (KIP-595 and KIP-630, Kafka's KRaft): the metadata log
replicated between controllers with leader epochs.

Field names follow Kafka's VoteRequest, BeginQuorumEpochRequest, EndQuorumEpochRequest,
FetchRequest (as KRaft uses it), FetchSnapshotRequest and DescribeQuorumRequest, with
one partition (the metadata log) instead of topic lists. Every request carries the
cluster id: a controller of another cluster is refused (INCONSISTENT_CLUSTER_ID).
"""

from __future__ import annotations

from collections.abc import Sequence

from protocol.messages.client_apis import Message
from protocol.metadata_records import MetadataRecord

__all__ = [
    "BeginQuorumEpochRequest",
    "BeginQuorumEpochResponse",
    "DescribeQuorumRequest",
    "DescribeQuorumResponse",
    "EndQuorumEpochRequest",
    "EndQuorumEpochResponse",
    "FetchSnapshotRequest",
    "FetchSnapshotResponse",
    "MetadataEntry",
    "QuorumFetchRequest",
    "QuorumFetchResponse",
    "QuorumVoterState",
    "SnapshotId",
    "VoteRequest",
    "VoteResponse",
]


class MetadataEntry(Message, kw_only=True, omit_defaults=True):
    """One entry of the metadata log: on the controllers' disks, between the quorum's
    voters (QuorumFetch) and to the brokers that follow it (FetchMetadata).

    A change (the records of one commit: a topic with all its partitions, say) is
    applied whole or not at all, as Kafka's atomic metadata batches (KIP-868): every
    entry of a change but its last has `change_continues`. Logs written before it have
    none, so each of their entries is a change of its own. Default-valued fields are
    left out of the encoding."""

    offset: int
    record: MetadataRecord
    # The controller quorum's epoch when its leader appended the entry (issue 17);
    # -1 in logs a single controller wrote before the quorum.
    epoch: int = -1
    change_continues: bool = False


def as_change(entries: list[MetadataEntry]) -> list[MetadataEntry]:
    """Mark `entries` (one commit's, in order) as one change: all but the last continue."""
    for entry in entries[:-1]:
        entry.change_continues = True
    return entries


def whole_changes(entries: Sequence[MetadataEntry]) -> int:
    """How many of `entries` (from a change's start) form whole changes: a reader
    applies that many and asks again from the next."""
    n = len(entries)
    while n and entries[n - 1].change_continues:
        n -= 1
    return n


def through_change_end(
    entries: Sequence[MetadataEntry], start: int, count: int, stop: int | None = None
) -> int:
    """The end index of a read of `count` entries at index `start` (a change's start)
    that may not pass index `stop`: moved past the end of a change it would split, or
    back to the last change end when the change is not all there before `stop`.
    Changes are never read in part."""
    stop = len(entries) if stop is None else min(stop, len(entries))
    if count <= 0 or start >= stop:
        return start
    end = min(stop, start + count)
    while end < stop and entries[end - 1].change_continues:
        end += 1
    while end > start and entries[end - 1].change_continues:
        end -= 1
    return end


class SnapshotId(Message, kw_only=True):
    """A snapshot of the applied metadata holds every entry below `end_offset`, the
    last of which has quorum epoch `epoch`."""

    end_offset: int = -1
    epoch: int = -1


class VoteRequest(Message, kw_only=True):
    cluster_id: str = ""
    candidate_id: int
    candidate_epoch: int  # the epoch the candidate stands in (current + 1 for a pre-vote)
    last_offset_epoch: int  # epoch of the candidate's last entry
    last_offset: int  # the candidate's log end offset
    # KIP-996: a pre-vote changes nothing at the voter; it asks whether a real vote
    # could win (the voter has no live leader and the candidate's log is up to date).
    pre_vote: bool = False


class VoteResponse(Message, kw_only=True):
    error_code: int = 0
    voter_id: int = -1
    leader_id: int = -1  # the leader the voter knows in `leader_epoch`, -1 if none
    leader_epoch: int = -1  # the voter's current epoch
    vote_granted: bool = False


class BeginQuorumEpochRequest(Message, kw_only=True):
    """Sent by a new leader to every voter: stop electing, fetch from me."""

    cluster_id: str = ""
    leader_id: int
    leader_epoch: int


class BeginQuorumEpochResponse(Message, kw_only=True):
    error_code: int = 0
    leader_id: int = -1
    leader_epoch: int = -1


class EndQuorumEpochRequest(Message, kw_only=True):
    """Sent by a leader that resigns (graceful shutdown): elect a successor now, the
    `preferred_successors` (most caught up first) before the others."""

    cluster_id: str = ""
    leader_id: int
    leader_epoch: int
    preferred_successors: list[int] = []


class EndQuorumEpochResponse(Message, kw_only=True):
    error_code: int = 0
    leader_id: int = -1
    leader_epoch: int = -1


class QuorumFetchRequest(Message, kw_only=True):
    """A voter reads the metadata log from the leader (KRaft's Fetch). The leader
    counts `fetch_offset` as replicated to the voter: a voter sends it only once every
    entry below it is durable on its disk."""

    cluster_id: str = ""
    replica_id: int
    current_leader_epoch: int
    fetch_offset: int
    last_fetched_epoch: int = -1  # epoch of the entry at fetch_offset - 1
    max_wait_ms: int = 0
    max_entries: int = 10_000


class QuorumFetchResponse(Message, kw_only=True):
    error_code: int = 0
    leader_id: int = -1
    leader_epoch: int = -1
    high_watermark: int = -1
    log_start_offset: int = 0
    # The fetcher's log diverges: truncate to the largest common epoch and fetch again.
    diverging_epoch: int = -1
    diverging_end_offset: int = -1
    # The fetch offset is below the leader's log start: fetch this snapshot first.
    snapshot_id: SnapshotId | None = None
    entries: list[MetadataEntry] = []


class FetchSnapshotRequest(Message, kw_only=True):
    cluster_id: str = ""
    replica_id: int
    current_leader_epoch: int
    snapshot_id: SnapshotId


class FetchSnapshotResponse(Message, kw_only=True):
    error_code: int = 0
    leader_id: int = -1
    leader_epoch: int = -1
    snapshot_id: SnapshotId | None = None
    # The applied metadata as of the snapshot, as records (the controller's image).
    records: list[MetadataRecord] = []


class DescribeQuorumRequest(Message, kw_only=True):
    """Kafka's DescribeQuorum (kafka-metadata-quorum describe): any controller answers
    with what it knows; the leader knows every voter's progress."""


class QuorumVoterState(Message, kw_only=True):
    replica_id: int
    log_end_offset: int = -1  # durable on the voter, as the leader last heard
    last_fetch_ms_ago: int = -1  # -1: never heard from in this epoch
    # Where the voter listens (--quorum-voters): brokers find the active one by it.
    host: str = ""
    port: int = -1


class DescribeQuorumResponse(Message, kw_only=True):
    error_code: int = 0
    node_id: int = -1  # the controller that answered
    role: str = ""
    leader_id: int = -1
    leader_epoch: int = -1
    high_watermark: int = -1
    log_end_offset: int = -1
    voters: list[QuorumVoterState] = []
