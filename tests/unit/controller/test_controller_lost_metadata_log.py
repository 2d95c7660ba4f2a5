"""A controller whose metadata log was lost (emptied or deleted; its meta.properties
and quorum-state intact) refuses to start: it used to start as an empty cluster under
the same cluster id, which the brokers accept, so every topic vanished from the
cluster's view (found by a hostile-disk session, 2026-11-30). The invariant: a
controller that has led an epoch wrote that epoch's first entry, so an empty log
with no snapshot next to such a quorum-state is lost data, never a new cluster."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from controller.app import ControllerProcess
from controller.config import ControllerConfig
from controller.errors import CorruptMetadataError


async def _run_once(data_dir: Path) -> None:
    """Start a single-voter controller, wait until its first entry is on disk, stop."""
    proc = ControllerProcess(ControllerConfig(data_dir=data_dir, listen_port=0))
    await proc.start()
    try:
        for _ in range(200):
            logs = list(data_dir.glob("metadata-*.log"))
            if logs and logs[0].stat().st_size > 0:
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the controller wrote no metadata entry within 2 s")
    finally:
        await proc.stop()


@pytest.mark.parametrize("damage", ["emptied", "deleted", "intact"])
async def test_a_lost_metadata_log_is_refused_not_taken_for_a_new_cluster(
    tmp_path: Path, damage: str
) -> None:
    data_dir = tmp_path / "c"
    await _run_once(data_dir)
    (log_file,) = data_dir.glob("metadata-*.log")
    if damage == "emptied":
        log_file.write_bytes(b"")
    elif damage == "deleted":
        log_file.unlink()
    proc = ControllerProcess(ControllerConfig(data_dir=data_dir, listen_port=0))
    if damage == "intact":  # the control: an ordinary restart
        await proc.start()
        await proc.stop()
        return
    with pytest.raises(CorruptMetadataError, match="is empty, but this controller led"):
        await proc.start()
    assert (data_dir / "meta.properties").exists() and (data_dir / "quorum-state").exists()
