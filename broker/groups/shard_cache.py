"""What one `__consumer_offsets` partition holds, in memory: its groups' committed
offsets and the last metadata record of each group, read from the log when this broker
becomes the partition's leader (`load_cache`) and kept up to date by the coordinator's
own writes. Records: broker/groups/records.py."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from dataclasses import field

import msgspec

from broker.groups.group import Group
from broker.groups.group import GroupState
from broker.groups.group import Member
from broker.groups.records import GroupKey
from broker.groups.records import GroupValue
from broker.groups.records import OffsetKey
from broker.groups.records import OffsetValue
from broker.groups.records import decode_record
from broker.storage.errors import StorageError
from broker.storage.log import Log
from protocol.errors import CorruptRecordError
from protocol.errors import DecodeError
from protocol.record_batch import decode_batch
from protocol.record_batch import iter_headers

log = logging.getLogger(__name__)

# Bytes read per step of a load (the loop yields between steps).
LOAD_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str | None
    commit_timestamp: int
    log_offset: int  # where the commit record is in __consumer_offsets


@dataclass
class ShardCache:
    """Committed offsets and group metadata of the groups of one partition."""

    groups: dict[str, dict[tuple[str, int], CommittedOffset]] = field(default_factory=dict)
    metadata: dict[str, GroupValue] = field(default_factory=dict)

    def apply(self, key: OffsetKey, value: OffsetValue | None, log_offset: int) -> None:
        """Later records win (by log offset): replies to concurrent commits may come
        back in any order, the log order is the truth."""
        offsets = self.groups.get(key.group)
        tp = (key.topic, key.partition)
        current = offsets.get(tp) if offsets is not None else None
        if current is not None and current.log_offset >= log_offset:
            return
        if value is None:
            if offsets is not None:
                offsets.pop(tp, None)
                if not offsets:
                    del self.groups[key.group]
            return
        if offsets is None:
            offsets = self.groups[key.group] = {}
        offsets[tp] = CommittedOffset(
            value.offset, value.leader_epoch, value.metadata, value.commit_timestamp, log_offset
        )

    def apply_group(self, key: GroupKey, value: GroupValue | None) -> None:
        if value is None:
            self.metadata.pop(key.group, None)
        else:
            self.metadata[key.group] = value

    def get(self, group: str, topic: str, partition: int) -> CommittedOffset | None:
        offsets = self.groups.get(group)
        return offsets.get((topic, partition)) if offsets is not None else None

    def holds(self, group: str) -> bool:
        """Whether anything of `group` is stored: committed offsets or metadata."""
        return group in self.groups or group in self.metadata

    def delete_group(self, group: str) -> None:
        self.groups.pop(group, None)
        self.metadata.pop(group, None)

    def loaded_groups(self) -> dict[str, Group]:
        """The groups as the log left them: one with members is Stable in its last
        generation, one without members (or with committed offsets only) Empty."""
        groups: dict[str, Group] = {}
        for group_id, value in self.metadata.items():
            group = Group(
                group_id,
                generation=value.generation,
                protocol_type=value.protocol_type or None,
                protocol_name=value.protocol_name,
                leader=value.leader,
                state_timestamp_ms=value.state_timestamp,
            )
            if value.members and value.protocol_name is None:
                raise CorruptGroupStateError(
                    f"group {group_id}: its last metadata record lists members but no "
                    "protocol (no coordinator writes that)"
                )
            for m in value.members:
                group.members[m.member_id] = Member(
                    member_id=m.member_id,
                    group_instance_id=m.group_instance_id,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    rebalance_timeout_ms=m.rebalance_timeout_ms,
                    session_timeout_ms=m.session_timeout_ms,
                    protocol_type=value.protocol_type,
                    protocols=[(value.protocol_name, m.subscription)],
                    assignment=m.assignment,
                )
            if group.members:
                group.state = GroupState.STABLE
            groups[group_id] = group
        for group_id in self.groups:
            groups.setdefault(group_id, Group(group_id))
        return groups


class CorruptGroupStateError(StorageError):
    """A `__consumer_offsets` partition holds a record the coordinator cannot load."""


async def load_cache(log_: Log, end_offset: int, *, name: str) -> ShardCache:
    """Read `log_` from its start up to `end_offset` (exclusive) into a cache,
    LOAD_CHUNK_BYTES at a time, yielding to the loop between chunks. A batch that
    cannot be decoded raises CorruptGroupStateError: skipping it would lose the
    committed offsets it holds without a word (the coordinator then refuses the
    partition's groups, COORDINATOR_NOT_AVAILABLE, and logs why)."""
    cache = ShardCache()
    offset = log_.log_start_offset
    while offset < end_offset:
        data = log_.read(offset, LOAD_CHUNK_BYTES, max_offset=end_offset)
        if not data:
            break
        next_offset = offset
        for pos, header in iter_headers(data):
            next_offset = max(next_offset, header.next_offset)
            if header.is_control:
                continue
            try:
                _, records = decode_batch(data, pos)
                for record in records:
                    if record.offset >= end_offset:
                        break
                    decoded = decode_record(record.key, record.value)
                    if decoded is None:
                        continue
                    key, value = decoded
                    if isinstance(key, OffsetKey):
                        assert value is None or isinstance(value, OffsetValue)
                        cache.apply(key, value, record.offset)
                    else:
                        assert value is None or isinstance(value, GroupValue)
                        cache.apply_group(key, value)
            except (CorruptRecordError, DecodeError, msgspec.DecodeError, ValueError) as exc:
                raise CorruptGroupStateError(
                    f"{name}: the batch at offset {header.base_offset} cannot be loaded "
                    f"({exc}); skipping it would lose the committed offsets it holds"
                ) from None
        if next_offset <= offset:
            break  # no whole batch in the read: cannot progress
        offset = next_offset
        await asyncio.sleep(0)
    return cache
