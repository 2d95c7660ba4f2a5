"""The storage invariants hold under `python -O` (issue 14 item 7): a segment refuses
offsets that do not follow on, the offset index refuses offsets that do not increase,
the epoch cache refuses epochs that decrease."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CODE = """
import sys
from pathlib import Path

from broker.storage.epoch_cache import EpochEntry, LeaderEpochFileCache
from broker.storage.offset_index import OffsetIndex
from broker.storage.segment import LogSegment
from protocol.invariants import InvariantError
from protocol.record_batch import encode_batch, validate_batch

assert False, "asserts are gone under -O"
d = Path(sys.argv[1])

def refused(name, action):
    try:
        action()
    except InvariantError as exc:
        print(name, "refused")
        return
    print(name, "ACCEPTED")

segment = LogSegment.create(d, 0, index_interval_bytes=0, now_ms=0)
batch = encode_batch([(None, b"v")], base_offset=5, partition_leader_epoch=1)
refused("segment gap", lambda: segment.append(batch, [validate_batch(batch)]))

index = OffsetIndex(d / "x.index", 0)
index.append(10, 100)
refused("index offsets", lambda: index.append(10, 200))

cache = LeaderEpochFileCache.load(d / "leader-epoch-checkpoint")
cache.assign(3, 0)
cache.lineage._entries.append(EpochEntry(2, 5))  # a decreasing epoch, however it got there
refused("epoch cache", cache._check_invariants)
"""


def test_storage_invariants_survive_python_dash_o(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-O", "-c", CODE, str(tmp_path)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == [
        "segment gap refused",
        "index offsets refused",
        "epoch cache refused",
    ]
