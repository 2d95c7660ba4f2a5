"""The records of `__consumer_offsets`: committed offsets and group metadata.

Every record is in a RecordBatch v2 (no compression) written with acks=all through the
partition's leader; key and value are MessagePack arrays (msgspec, array_like), the
key's first element its version, which says what the record is:

  offset commit   key   = [1, group: str, topic: str, partition: int]
                  value = [1, offset: int, leader_epoch: int (-1 none),
                           metadata: str | nil, commit_timestamp: int (ms)]
                          or null (tombstone: the commit is deleted)
  group metadata  key   = [2, group: str]
                  value = [1, protocol_type: str, generation: int,
                           protocol_name: str | nil, leader: str | nil,
                           state_timestamp: int (ms),
                           members: [[member_id: str, group_instance_id: str | nil,
                                      client_id: str, client_host: str,
                                      rebalance_timeout_ms: int, session_timeout_ms: int,
                                      subscription: bin, assignment: bin], ...]]
                          or null (tombstone: the group is deleted)

A group metadata record is written when a generation's assignment is complete (the
leader's SyncGroup) and when a group becomes empty; the last one in the log is the
group. Format history: offset commits (key 1) since the offsets coordinator (issue 9);
group metadata (key 2) since issue 16. A reader skips keys and values of versions it
does not know, so an older broker reads a newer log (it only misses the groups).
"""

from __future__ import annotations

import msgspec

OFFSETS_TOPIC = "__consumer_offsets"
OFFSET_KEY_VERSION = 1
OFFSET_VALUE_VERSION = 1
GROUP_KEY_VERSION = 2
GROUP_VALUE_VERSION = 1


class OffsetKey(msgspec.Struct, array_like=True, frozen=True):
    version: int
    group: str
    topic: str
    partition: int


class OffsetValue(msgspec.Struct, array_like=True, frozen=True):
    version: int
    offset: int
    leader_epoch: int
    metadata: str | None
    commit_timestamp: int


class GroupKey(msgspec.Struct, array_like=True, frozen=True):
    version: int
    group: str


class MemberRecord(msgspec.Struct, array_like=True, frozen=True):
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes
    assignment: bytes


class GroupValue(msgspec.Struct, array_like=True, frozen=True):
    version: int
    protocol_type: str
    generation: int
    protocol_name: str | None
    leader: str | None
    state_timestamp: int
    members: list[MemberRecord]


_head_decoder = msgspec.msgpack.Decoder(list)
_offset_key_decoder = msgspec.msgpack.Decoder(OffsetKey)
_offset_value_decoder = msgspec.msgpack.Decoder(OffsetValue)
_group_key_decoder = msgspec.msgpack.Decoder(GroupKey)
_group_value_decoder = msgspec.msgpack.Decoder(GroupValue)


def encode_commit(
    group: str,
    topic: str,
    partition: int,
    offset: int,
    leader_epoch: int,
    metadata: str | None,
    commit_timestamp: int,
) -> tuple[bytes, bytes]:
    key = OffsetKey(OFFSET_KEY_VERSION, group, topic, partition)
    value = OffsetValue(OFFSET_VALUE_VERSION, offset, leader_epoch, metadata, commit_timestamp)
    return msgspec.msgpack.encode(key), msgspec.msgpack.encode(value)


def encode_key(key: OffsetKey | GroupKey) -> bytes:
    return msgspec.msgpack.encode(key)


def encode_value(value: OffsetValue | GroupValue | None) -> bytes | None:
    return None if value is None else msgspec.msgpack.encode(value)


def _version(data: bytes) -> int | None:
    head = _head_decoder.decode(data)
    return head[0] if head and isinstance(head[0], int) else None


def decode_commit(
    key: bytes | None, value: bytes | None
) -> tuple[OffsetKey, OffsetValue | None] | None:
    """(key, value or None for a tombstone) of an offset commit; None for a record of
    another kind or version. Raises msgspec.DecodeError on a malformed record."""
    decoded = decode_record(key, value)
    if decoded is None or not isinstance(decoded[0], OffsetKey):
        return None
    return decoded  # type: ignore[return-value]


def decode_record(
    key: bytes | None, value: bytes | None
) -> tuple[OffsetKey, OffsetValue | None] | tuple[GroupKey, GroupValue | None] | None:
    """Any record of `__consumer_offsets`: (key, value or None for a tombstone), or None
    for a key or value of a version this build does not know. Raises
    msgspec.DecodeError on a malformed record of a known version."""
    if key is None:
        return None
    version = _version(key)
    if version == OFFSET_KEY_VERSION:
        offset_key = _offset_key_decoder.decode(key)
        if value is None:
            return offset_key, None
        if _version(value) != OFFSET_VALUE_VERSION:
            return None
        return offset_key, _offset_value_decoder.decode(value)
    if version == GROUP_KEY_VERSION:
        group_key = _group_key_decoder.decode(key)
        if value is None:
            return group_key, None
        if _version(value) != GROUP_VALUE_VERSION:
            return None
        return group_key, _group_value_decoder.decode(value)
    return None
