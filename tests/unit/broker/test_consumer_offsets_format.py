"""The records of `__consumer_offsets` are an on-disk contract (broker/groups/records.py):
bytes written by earlier builds must keep decoding to the same values. The fixtures are
the exact bytes: an offset commit as issue 9's coordinator wrote it, and a group
metadata record as issue 16's writes it. A format change adds a version; it never
changes what these bytes mean."""

from __future__ import annotations

from broker.groups.records import GroupKey
from broker.groups.records import GroupValue
from broker.groups.records import MemberRecord
from broker.groups.records import OffsetKey
from broker.groups.records import OffsetValue
from broker.groups.records import decode_record
from broker.groups.records import encode_key
from broker.groups.records import encode_value

COMMIT_KEY = bytes.fromhex("9401a167a17403")
COMMIT_VALUE = bytes.fromhex("95012a07a46d657461cd04d2")
GROUP_KEY = bytes.fromhex("9202a167")
GROUP_VALUE = bytes.fromhex(
    "9701a8636f6e73756d657203a572616e6765a36d2d31cf0000018bcfe568009198a36d2d31c0a163a168"
    "cd0258cd0190c40173c40161"
)

COMMIT = (OffsetKey(1, "g", "t", 3), OffsetValue(1, 42, 7, "meta", 1234))
GROUP = (
    GroupKey(2, "g"),
    GroupValue(
        1,
        "consumer",
        3,
        "range",
        "m-1",
        1_700_000_000_000,
        [MemberRecord("m-1", None, "c", "h", 600, 400, b"s", b"a")],
    ),
)


def test_an_offset_commit_of_issue_9_still_decodes() -> None:
    assert decode_record(COMMIT_KEY, COMMIT_VALUE) == COMMIT
    assert decode_record(COMMIT_KEY, None) == (COMMIT[0], None)  # a tombstone


def test_a_group_metadata_record_decodes() -> None:
    assert decode_record(GROUP_KEY, GROUP_VALUE) == GROUP
    assert decode_record(GROUP_KEY, None) == (GROUP[0], None)


def test_this_build_writes_the_same_bytes() -> None:
    assert (encode_key(COMMIT[0]), encode_value(COMMIT[1])) == (COMMIT_KEY, COMMIT_VALUE)
    assert (encode_key(GROUP[0]), encode_value(GROUP[1])) == (GROUP_KEY, GROUP_VALUE)


def test_records_of_unknown_versions_are_skipped_not_misread() -> None:
    """A newer build's record kind (key 9) or value version (2) is left alone."""
    assert decode_record(bytes.fromhex("9209a167"), GROUP_VALUE) is None
    newer_value = bytes.fromhex("9102")  # [2]
    assert decode_record(COMMIT_KEY, newer_value) is None
    assert decode_record(GROUP_KEY, newer_value) is None
    assert decode_record(None, COMMIT_VALUE) is None
