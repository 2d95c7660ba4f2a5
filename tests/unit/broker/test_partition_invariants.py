"""The partition's invariants hold under `python -O` too (issue 14 item 7): the high
watermark never moves back, leader and partition epochs never decrease, a proposed
ISR contains its leader. Each check runs against a real Partition over a real Log in a
child interpreter started with -O, where a plain `assert` would be gone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = """
import sys
from pathlib import Path
from broker.metadata_image import PartitionState
from broker.partition import Partition
from broker.storage.log import Log, LogConfig
from protocol.invariants import InvariantError
from protocol.record_batch import encode_batch

assert False, "plain asserts are gone under -O"

def state(leader, epoch, isr=(1, 2)):
    return PartitionState(topic="t", topic_id="T", partition=0, replicas=(1, 2), isr=isr,
                          leader=leader, leader_epoch=epoch, partition_epoch=epoch)

log = Log.open(Path(sys.argv[1]), LogConfig(), had_clean_shutdown=True)
p = Partition("t", 0, "T", log, node_id=1, high_watermark=0)
p.make_leader(state(1, 5), now_ms=0)
p.append_as_leader(encode_batch([(None, b"x")] * 3))
p.update_follower_fetch_state(2, broker_epoch=-1, fetch_offset=3, now_ms=0)
checks = {
    "hw_back": lambda: p._set_high_watermark(p.high_watermark - 1),
    "epoch_back": lambda: p.make_leader(state(1, 4), now_ms=0),
    "isr_without_leader": lambda: p.propose_isr("shrink", (2,), now_ms=0),
}
for name, broken in checks.items():
    try:
        broken()
    except InvariantError as exc:
        print(name, "raised:", exc)
    else:
        print(name, "NOT RAISED")
log.close()
"""


def test_partition_invariants_fire_under_python_dash_o(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-O", "-c", SCRIPT, str(tmp_path / "t-0")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["hw_back", "epoch_back", "isr_without_leader"]
    assert all(" raised: " in line for line in lines), done.stdout
    assert "high watermark would go back 3 -> 2" in lines[0]
    assert "leader epoch went back 5 -> 4" in lines[1]
    assert "a proposed ISR [2] must contain its leader 1" in lines[2]
