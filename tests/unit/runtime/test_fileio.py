"""runtime/fileio.py and runtime/meta_properties.py: one copy used by both processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.storage.errors import CorruptCheckpointError
from broker.storage.meta_properties import MetaProperties as BrokerMeta
from controller.errors import DataDirError
from controller.meta_properties import DataDirLock as ControllerLock
from controller.meta_properties import load_or_create
from runtime.fileio import DataDirLock


def test_data_dir_lock_is_exclusive_and_released(tmp_path: Path) -> None:
    first = DataDirLock(tmp_path, lambda lock: RuntimeError(f"held {lock.name}"))
    first.acquire()
    with pytest.raises(RuntimeError, match=r"held \.lock"):
        DataDirLock(tmp_path, lambda lock: RuntimeError(f"held {lock.name}")).acquire()
    with pytest.raises(DataDirError, match="in use by another controller"):
        ControllerLock(tmp_path).acquire()
    first.release()
    second = ControllerLock(tmp_path)
    second.acquire()
    second.release()


def test_controller_reads_the_file_it_wrote_before_the_shared_format(tmp_path: Path) -> None:
    (tmp_path / "meta.properties").write_text(
        "# minibroker controller identity; do not edit\nversion=1\ncluster.id=abc\nnode.id=0\n"
    )
    meta = load_or_create(tmp_path, 0, has_metadata=True)
    assert (meta.cluster_id, meta.node_id) == ("abc", 0)


def test_each_process_raises_its_own_error_for_one_corrupt_file(tmp_path: Path) -> None:
    (tmp_path / "meta.properties").write_text("version=1\nnode.id=0")
    with pytest.raises(CorruptCheckpointError, match="newline"):
        BrokerMeta.read(tmp_path)
    with pytest.raises(DataDirError, match="newline"):
        load_or_create(tmp_path, 0, has_metadata=False)


def test_controller_formats_a_cluster_id_the_broker_reads(tmp_path: Path) -> None:
    meta = load_or_create(tmp_path, 2, has_metadata=False)
    assert meta.cluster_id and BrokerMeta.read(tmp_path) == BrokerMeta(meta.cluster_id, 2)
    BrokerMeta(None, 2).write(tmp_path)
    with pytest.raises(DataDirError, match=r"has no cluster\.id"):
        load_or_create(tmp_path, 2, has_metadata=False)
