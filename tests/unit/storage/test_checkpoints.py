"""Checkpoint files (offsets and leader epochs: their shared parser), atomic_write and
meta.properties."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker.storage.checkpoints import RECOVERY_POINT_CHECKPOINT
from broker.storage.checkpoints import OffsetCheckpointFile
from broker.storage.checkpoints import atomic_write
from broker.storage.epoch_cache import LEADER_EPOCH_CHECKPOINT
from broker.storage.epoch_cache import LeaderEpochFileCache
from broker.storage.errors import CorruptCheckpointError
from broker.storage.errors import StorageError
from broker.storage.meta_properties import META_PROPERTIES
from broker.storage.meta_properties import MetaProperties


def test_atomic_write_replaces_content_and_leaves_no_temp_file(tmp_path: Path):
    path = tmp_path / "thing"
    atomic_write(path, b"one")
    atomic_write(path, b"two")
    assert path.read_bytes() == b"two"
    assert os.listdir(tmp_path) == ["thing"]


def test_offset_checkpoint_round_trip_and_exact_format(tmp_path: Path):
    checkpoint = OffsetCheckpointFile(tmp_path / RECOVERY_POINT_CHECKPOINT)
    assert checkpoint.read() == {}
    offsets = {("orders", 1): 1422, ("orders", 0): 1500, ("my-topic.v2", 12): 0}
    checkpoint.write(offsets)
    assert checkpoint.read() == offsets
    assert (tmp_path / RECOVERY_POINT_CHECKPOINT).read_text() == (
        "0\n3\nmy-topic.v2 12 0\norders 0 1500\norders 1 1422\n"
    )
    checkpoint.write({})
    assert checkpoint.read() == {}
    assert (tmp_path / RECOVERY_POINT_CHECKPOINT).read_text() == "0\n0\n"


def test_an_unchanged_offset_checkpoint_is_not_rewritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Issue 20 item 5: an idle broker rewrote (and fsynced) its checkpoints of every
    partition every 5 s (~8% of an idle 1,000-partition broker's samples). The same
    offsets again are no write; a change, or a file gone, is written."""
    path = tmp_path / RECOVERY_POINT_CHECKPOINT
    checkpoint = OffsetCheckpointFile(path)
    offsets = {("orders", p): 10 * p for p in range(1000)}
    checkpoint.write(offsets)
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    checkpoint.write(dict(offsets))
    assert synced == []
    changed = {**offsets, ("orders", 7): 71}
    checkpoint.write(changed)
    assert len(synced) == 2 and OffsetCheckpointFile(path).read() == changed
    path.unlink()
    checkpoint.write(changed)
    assert len(synced) == 4 and OffsetCheckpointFile(path).read() == changed
    # Read back by a new instance (a restart), the same offsets are not written again.
    again = OffsetCheckpointFile(path)
    again.read()
    again.write(changed)
    assert len(synced) == 4


def test_offset_checkpoint_refuses_unwritable_topic(tmp_path: Path):
    with pytest.raises(ValueError, match="cannot be written"):
        OffsetCheckpointFile(tmp_path / "x").write({("two words", 0): 1})


def _read_offsets(path: Path) -> object:
    return OffsetCheckpointFile(path).read()


# Both kinds of CheckpointFile: (file name, how the broker reads it, what the message
# tells the operator to do).
_CHECKPOINT_KINDS = {
    "offsets": (RECOVERY_POINT_CHECKPOINT, _read_offsets, "move the file away"),
    "epochs": (LEADER_EPOCH_CHECKPOINT, LeaderEpochFileCache.load, "rebuilds it"),
}


@pytest.mark.parametrize(
    ("kind", "content", "line", "problem"),
    [
        ("offsets", b"garbage", None, "newline"),
        ("offsets", b"\x00\x01\x02\n0\n", 1, "version '\\x00\\x01\\x02' is not an integer"),
        ("offsets", b"0\n1\norders 0 15", None, "newline"),
        ("offsets", b"0\n2\norders 0 15\n", 2, "announces 2 entries but 1"),
        ("offsets", b"0\n1\norders 0\n", 3, "expected 3 space-separated fields"),
        ("offsets", b"0\n1\norders x 15\n", 3, "partition 'x' is not an integer"),
        ("offsets", b"0\n1\norders 0 -15\n", 3, "offset -15 is below 0"),
        ("offsets", b"0\n1\norders 0 1e3\n", 3, "offset '1e3' is not an integer"),
        ("offsets", b"0\n2\norders 0 15\norders 0 16\n", 4, "appears twice"),
        ("offsets", b"7\n0\n", 1, "unsupported version 7"),
        ("epochs", b"0\n2\n0 0\n3 15", None, "newline"),  # cut mid-line
        ("epochs", b"0\n2\n0 0\n", 2, "announces 2 entries but 1"),
        ("epochs", b"1\n0\n", 1, "unsupported version 1"),
        ("epochs", b"0\nx\n", 2, "is not an integer"),
        ("epochs", b"0\n1\n0 0 0\n", 3, "expected 2 space-separated fields"),
        ("epochs", b"0\n1\n0  0\n", 3, "expected 2 space-separated fields"),
        ("epochs", b"0\n1\n0 zero\n", 3, "start offset 'zero' is not an integer"),
        ("epochs", b"0\n1\n-1 0\n", 3, "epoch -1 is below 0"),
        ("epochs", b"0\n2\n3 0\n3 5\n", 4, "epoch 3 does not increase"),
        ("epochs", b"0\n2\n2 9\n3 5\n", 4, "start offset 5 goes backwards"),
        ("epochs", b"\xff\xfe\n", None, "not UTF-8"),
        ("epochs", b"", None, "newline"),
        ("epochs", b"0\n", 2, "missing the version or the count line"),
    ],
)
def test_corrupt_checkpoint_file_is_refused_naming_file_line_and_remedy(
    tmp_path: Path, kind: str, content: bytes, line: int | None, problem: str
):
    """Every CheckpointFile (the offset checkpoints and the leader-epoch checkpoint
    share the parser) refuses a corrupt file, saying where and what happens next."""
    name, read, remedy = _CHECKPOINT_KINDS[kind]
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(CorruptCheckpointError) as info:
        read(path)
    message = str(info.value)
    assert message.startswith(f"corrupt checkpoint file {path}")
    assert problem in message
    if line is not None:
        assert f"line {line}:" in message
    assert remedy in message


def test_meta_properties_round_trip_and_format(tmp_path: Path):
    assert MetaProperties.read(tmp_path) is None
    meta = MetaProperties.check_or_write(tmp_path, node_id=3)
    assert meta == MetaProperties(cluster_id=None, node_id=3)
    text = (tmp_path / META_PROPERTIES).read_text()
    assert "version=1\nnode.id=3\n" in text and "cluster.id" not in text
    learnt = MetaProperties.check_or_write(tmp_path, node_id=3, cluster_id="abc")
    assert learnt == MetaProperties(cluster_id="abc", node_id=3)
    assert MetaProperties.read(tmp_path) == learnt
    assert (tmp_path / META_PROPERTIES).read_text().endswith("node.id=3\ncluster.id=abc\n")


def test_meta_properties_refuses_another_nodes_directory(tmp_path: Path):
    MetaProperties(cluster_id="abc", node_id=1).write(tmp_path)
    with pytest.raises(StorageError, match=r"belongs to node 1.*configured as node 2"):
        MetaProperties.check_or_write(tmp_path, node_id=2)
    with pytest.raises(StorageError, match="belongs to cluster 'abc'"):
        MetaProperties.check_or_write(tmp_path, node_id=1, cluster_id="xyz")


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"version=1\nnode.id=3", "newline"),
        (b"version=2\nnode.id=3\n", "version is '2'"),
        (b"version=1\n", "node.id '' is not"),
        (b"version=1\nnode.id=-3\n", "node.id '-3' is not"),
        (b"version=1\nnode.id\n", "not key=value"),
        (b"version=1\nnode.id=3\nnode.id=4\n", "repeats key 'node.id'"),
    ],
)
def test_corrupt_meta_properties_is_refused(tmp_path: Path, content: bytes, problem: str):
    (tmp_path / META_PROPERTIES).write_bytes(content)
    with pytest.raises(CorruptCheckpointError, match=problem) as info:
        MetaProperties.read(tmp_path)
    assert str(tmp_path / META_PROPERTIES) in str(info.value)


def test_meta_properties_ignores_comments_and_unknown_keys(tmp_path: Path):
    (tmp_path / META_PROPERTIES).write_text(
        "# hello\n! also a comment\n\nversion = 1\nnode.id=7\nsomething.else=x\n"
    )
    assert MetaProperties.read(tmp_path) == MetaProperties(cluster_id=None, node_id=7)
