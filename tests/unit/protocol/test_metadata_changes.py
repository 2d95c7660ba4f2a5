"""Whole metadata changes (KIP-868's atomic batches): the marks a change's entries
carry, how a read is moved to a change's end, and that the mark is compatible both
ways with entries that never had it."""

from __future__ import annotations

import msgspec

from protocol.messages import MetadataEntry
from protocol.messages.quorum_apis import as_change
from protocol.messages.quorum_apis import through_change_end
from protocol.messages.quorum_apis import whole_changes
from protocol.metadata_records import FenceBrokerRecord
from protocol.metadata_records import MetadataRecord


def fence(offset: int) -> MetadataEntry:
    return MetadataEntry(offset=offset, record=FenceBrokerRecord(broker_id=1, broker_epoch=offset))


def log_of(*sizes: int) -> list[MetadataEntry]:
    """Changes of the given sizes, one after another."""
    out: list[MetadataEntry] = []
    for size in sizes:
        out += as_change([fence(len(out) + i) for i in range(size)])
    return out


def test_a_read_never_splits_a_change() -> None:
    log = log_of(1, 5, 2)  # changes at [0], [1..5], [6, 7]
    assert through_change_end(log, 0, 1) == 1
    assert through_change_end(log, 0, 2) == 6  # into the 5-entry change: all of it
    assert through_change_end(log, 1, 1) == 6
    assert through_change_end(log, 1, 100) == 8
    assert through_change_end(log, 6, 1) == 8
    assert through_change_end(log, 8, 10) == 8  # at the end: nothing
    assert through_change_end(log, 0, 0) == 0  # nothing asked, nothing read


def test_a_read_stops_before_a_change_not_all_there() -> None:
    log = log_of(2, 4)
    # Only part of the second change is below `stop` (the high watermark, say).
    assert through_change_end(log, 0, 100, stop=4) == 2
    assert through_change_end(log, 2, 100, stop=5) == 2  # none of it yet
    assert through_change_end(log, 2, 100, stop=6) == 6
    assert whole_changes(log[:5]) == 2 and whole_changes(log) == 6 and whole_changes([]) == 0


def test_entries_of_older_builds_are_changes_of_their_own() -> None:
    """An entry encoded before the mark existed (no `change_continues`, `epoch` kept
    explicit) decodes as a one-entry change; a new entry leaves its default-valued
    fields out, so an older reader that knows only offset/record/epoch reads it."""

    class OldEntry(msgspec.Struct, kw_only=True):  # MetadataEntry as of issue 17
        offset: int
        record: MetadataRecord
        epoch: int = -1

    old = OldEntry(offset=3, record=FenceBrokerRecord(broker_id=1, broker_epoch=3))
    old_bytes = msgspec.msgpack.encode(old)
    decoded = msgspec.msgpack.decode(old_bytes, type=MetadataEntry)
    assert decoded.offset == 3 and decoded.epoch == -1 and not decoded.change_continues

    first, last = as_change([fence(0), fence(1)])
    for entry in (first, last):
        raw = msgspec.msgpack.decode(msgspec.msgpack.encode(entry))
        assert "epoch" not in raw  # -1 is the default: left out
        assert ("change_continues" in raw) == (entry is first)
        again = msgspec.msgpack.decode(msgspec.msgpack.encode(entry), type=OldEntry)
        assert (again.offset, again.epoch) == (entry.offset, -1)
