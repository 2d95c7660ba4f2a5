"""The metadata log as the controller's single writer sees it when it is replicated by
the quorum: the same calls as the local `MetadataLog` (append, write_snapshot, close),
answered through the quorum driver.

- `append` returns once the entries are committed (on a majority's disks), raising
  NotLeaderError when this controller is not, or stops being, the quorum leader
  before that (the entries' fate is then unknown: the caller answers NOT_CONTROLLER
  and the broker retries with the new leader, as Kafka's brokers do);
- `wait_writable` holds a write until this leader has committed everything before it
  (its own leader-change entry included), so the image a change is decided on is
  the whole committed log;
- `committed_entries` feeds the writer what became committed (every voter applies
  them; a follower's image is always the committed log);
- `write_snapshot` hands the applied image to the quorum, which drops the entries it
  covers and writes the snapshot file (followers far behind fetch it).
"""

from __future__ import annotations

import asyncio
import time

from controller.metadata_log import MetadataLog
from controller.quorum.driver import NotLeaderError
from controller.quorum.driver import QuorumDriver
from controller.quorum.quorum_log import Snapshot
from protocol.invariants import invariant
from protocol.messages import MetadataEntry
from protocol.metadata_records import MetadataRecord

# How long a write waits for this leader to commit what came before it.
WRITABLE_WAIT_S = 5.0
# How long a write waits for its own commit.
COMMIT_WAIT_S = 30.0


class ReplicatedMetadataLog:
    def __init__(self, driver: QuorumDriver, local: MetadataLog) -> None:
        self.driver = driver
        self.local = local

    @property
    def next_offset(self) -> int:
        return self.driver.replica.log.end_offset

    @property
    def start_offset(self) -> int:
        return self.driver.replica.log.start_offset

    @property
    def snapshot(self) -> Snapshot:
        return self.driver.replica.log.snapshot

    @property
    def high_watermark(self) -> int:
        return self.driver.replica.high_watermark

    async def wait_writable(self) -> None:
        replica = self.driver.replica
        deadline = time.monotonic() + WRITABLE_WAIT_S
        while not (replica.is_leader and replica.high_watermark == replica.log.end_offset):
            if not replica.is_leader:
                raise NotLeaderError(replica.leader_id, replica.epoch)
            if time.monotonic() > deadline:
                raise NotLeaderError(replica.node_id, replica.epoch)
            await asyncio.sleep(0.005)

    async def append(self, entries: list[MetadataEntry]) -> None:
        invariant(bool(entries), "empty append")
        invariant(
            entries[0].offset == self.next_offset,
            f"entries from {entries[0].offset} appended at the log end {self.next_offset}",
        )
        end = self.driver.append([e.record for e in entries])
        await self.driver.wait_committed(end, COMMIT_WAIT_S)

    def committed_entries(self, start: int, limit: int) -> list[MetadataEntry]:
        return self.driver.committed_entries(start, limit)

    def installed_snapshot(self, next_offset: int) -> tuple[int, list[MetadataRecord]] | None:
        """The leader's snapshot, when it replaced entries the image does not have."""
        snapshot = self.driver.replica.log.snapshot
        if snapshot.end_offset <= next_offset:
            return None
        return snapshot.end_offset - 1, list(snapshot.records)

    async def write_snapshot(self, last_offset: int, records: list[MetadataRecord]) -> None:
        replica = self.driver.replica
        end = last_offset + 1
        if end <= replica.log.start_offset:
            return  # a newer snapshot is there already (installed from the leader)
        replica.compact(Snapshot(end, replica.log.epoch_at(last_offset), tuple(records)))
        self.driver.wake()

    def close(self) -> None:
        self.local.close()
