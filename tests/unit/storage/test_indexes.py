"""OffsetIndex and TimeIndex: file format, lookups, truncation, sanity checks."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.storage.errors import CorruptIndexError
from broker.storage.offset_index import OffsetIndex
from broker.storage.time_index import TimeIndex

BASE = 1000


def test_offset_index_file_format_is_big_endian_relative_offset_and_position(tmp_path: Path):
    index = OffsetIndex(tmp_path / "x.index", BASE)
    index.append(1005, 300)
    index.append(1010, 700)
    index.close()
    assert (tmp_path / "x.index").read_bytes() == struct.pack(">iiii", 5, 300, 10, 700)


def test_offset_index_lookup_finds_largest_entry_at_or_below(tmp_path: Path):
    index = OffsetIndex(tmp_path / "x.index", BASE)
    for relative, position in [(3, 100), (8, 250), (20, 900)]:
        index.append(BASE + relative, position)
    assert index.lookup(BASE - 5) == (BASE, 0)
    assert index.lookup(BASE) == (BASE, 0)
    assert index.lookup(BASE + 2) == (BASE, 0)
    assert index.lookup(BASE + 3) == (BASE + 3, 100)
    assert index.lookup(BASE + 7) == (BASE + 3, 100)
    assert index.lookup(BASE + 8) == (BASE + 8, 250)
    assert index.lookup(BASE + 10**9) == (BASE + 20, 900)
    index.close()


def test_offset_index_truncate_and_reopen(tmp_path: Path):
    path = tmp_path / "x.index"
    index = OffsetIndex(path, BASE)
    for relative in range(1, 6):
        index.append(BASE + relative, relative * 100)
    index.truncate_to(BASE + 3)  # removes entries for offsets >= 1003
    assert index.entries == [(BASE + 1, 100), (BASE + 2, 200)]
    index.close()
    assert path.stat().st_size == 16
    reopened = OffsetIndex(path, BASE)
    assert reopened.entries == [(BASE + 1, 100), (BASE + 2, 200)]
    reopened.sanity_check(log_size=1000)
    reopened.reset()
    assert len(reopened) == 0 and path.stat().st_size == 0
    reopened.close()


def test_offset_index_append_asserts_strictly_increasing(tmp_path: Path):
    index = OffsetIndex(tmp_path / "x.index", BASE)
    index.append(BASE + 5, 100)
    with pytest.raises(AssertionError):
        index.append(BASE + 5, 200)
    with pytest.raises(AssertionError):
        index.append(BASE + 6, 100)
    index.close()


# Both kinds of index: (class, file name, what its sanity check is given).
_INDEX_KINDS = {
    "offset": (OffsetIndex, "00000000000000001000.index", {"log_size": 1000}),
    "time": (TimeIndex, "x.timeindex", {"next_offset": BASE + 10}),
}


@pytest.mark.parametrize(
    ("kind", "content", "problem"),
    [
        ("offset", struct.pack(">ii", 1, 100) + b"\x00\x01\x02", "not a multiple of 8"),
        ("offset", struct.pack(">iiii", 5, 100, 5, 200), "not above the previous"),
        ("offset", struct.pack(">iiii", 5, 100, 4, 200), "not above the previous"),
        ("offset", struct.pack(">iiii", 5, 100, 6, 100), "not above the previous"),
        ("offset", struct.pack(">ii", 5, 5000), "past the end"),
        ("time", struct.pack(">qi", 5, 1) + b"\x00", "not a multiple of 12"),
        ("time", struct.pack(">qiqi", 5, 1, 5, 2), "out of order"),
        ("time", struct.pack(">qiqi", 5, 3, 6, 2), "out of order"),
        ("time", struct.pack(">qi", 5, 50), "past the segment end"),
    ],
)
def test_index_sanity_check_detects_corruption(
    tmp_path: Path, kind: str, content: bytes, problem: str
):
    index_class, name, bounds = _INDEX_KINDS[kind]
    path = tmp_path / name
    path.write_bytes(content)
    index = index_class(path, BASE)
    with pytest.raises(CorruptIndexError, match=problem) as info:
        index.sanity_check(**bounds)
    assert str(path) in str(info.value)
    index.close()


@given(
    st.lists(st.integers(min_value=1, max_value=10_000), min_size=0, max_size=60, unique=True),
    st.lists(st.integers(min_value=-10, max_value=10_100), min_size=1, max_size=20),
)
def test_offset_index_lookup_matches_a_linear_search(
    tmp_path_factory: pytest.TempPathFactory, relatives: list[int], targets: list[int]
):
    relatives.sort()
    path = tmp_path_factory.mktemp("idx") / "x.index"
    index = OffsetIndex(path, BASE)
    for n, relative in enumerate(relatives):
        index.append(BASE + relative, (n + 1) * 64)
    index.close()
    reopened = OffsetIndex(path, BASE)  # lookups must agree after a reload too
    for target in targets:
        expected = (BASE, 0)
        for n, relative in enumerate(relatives):
            if BASE + relative <= BASE + target:
                expected = (BASE + relative, (n + 1) * 64)
        assert reopened.lookup(BASE + target) == expected
    reopened.close()


def test_time_index_file_format_and_append_only_when_timestamp_grows(tmp_path: Path):
    path = tmp_path / "x.timeindex"
    index = TimeIndex(path, BASE)
    assert index.maybe_append(500, BASE + 2)
    assert not index.maybe_append(500, BASE + 4)  # not larger: skipped
    assert not index.maybe_append(-1, BASE + 4)  # no timestamp
    assert index.maybe_append(900, BASE + 6)
    index.close()
    assert path.read_bytes() == struct.pack(">qiqi", 500, 2, 900, 6)


def test_time_index_lookup_returns_a_conservative_start(tmp_path: Path):
    index = TimeIndex(tmp_path / "x.timeindex", BASE)
    index.maybe_append(500, BASE + 2)
    index.maybe_append(900, BASE + 6)
    assert index.lookup(100) == BASE  # before every entry: scan from the start
    assert index.lookup(500) == BASE + 2  # exactly: the batch where 500 was first reached
    assert index.lookup(700) == BASE + 2  # batches up to 2 are all below 700
    assert index.lookup(900) == BASE + 6
    assert index.lookup(10**12) == BASE + 6
    index.truncate_to(BASE + 6)
    assert index.entries == [(500, BASE + 2)]
    assert index.last_entry == (500, BASE + 2)
    index.close()


def test_time_index_lookup_property(tmp_path: Path):
    """Entries sampled from a running max: lookup never skips the first batch >= ts."""
    batch_max = [5, 3, 9, 9, 12, 4, 20, 20, 21]
    index = TimeIndex(tmp_path / "x.timeindex", 0)
    running, first_reached = -1, 0
    for offset, ts in enumerate(batch_max):
        if ts > running:
            running, first_reached = ts, offset
        if offset % 2 == 0:  # sparse, like the real index
            index.maybe_append(running, first_reached)
    for target in range(0, 23):
        answer = next((o for o, ts in enumerate(batch_max) if ts >= target), None)
        start = index.lookup(target)
        if answer is not None:
            assert start <= answer
            assert all(ts < target for ts in batch_max[:start])
    index.close()
