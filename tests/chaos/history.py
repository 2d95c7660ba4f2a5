"""The history of a chaos run: every operation, in the order it happened (Jepsen style).

On disk: `history.jsonl`, one JSON object per line, appended as operations happen and
flushed per line (a run that dies keeps what it recorded). Fields (absent = null):

    index      int    position in the history (0, 1, 2, ...)
    time       float  seconds since the history started (monotonic clock)
    process    int | str   a logical client process (int), "nemesis", or "final"
    type       str    invoke | ok | fail | info
    f          str    send | poll (client operations, an invoke then its completion)
                      seek | truncation | caught-up (consumer events, one line each)
                      producer-start (a producer session began, one line; process
                      "producer-<worker>", extra: session, enable_idempotence (what the
                      workload passed), producer_id / producer_epoch (what the producer
                      got: -1 when it is not idempotent, i.e. never sent InitProducerId),
                      acks)
                      final-read | final-read-end (the final full read, process "final")
                      nemesis functions: plan (the seeded schedule, once) | kill | start |
                      pause | resume | partition | wipe | diverge | ...
    value      str    send: the record value; nemesis: the target node
    values     list   poll / final-read: [[partition, offset, value, leader_epoch], ...]
    partition  int    send, seek, truncation: the partition
    offset     int    send (ok): the acknowledged offset; seek: the new position (-2:
                      the log start); truncation: the divergent offset the client reported
    ends       dict   caught-up / final-read-end: {partition: end offset}
    error      str    fail / info: why
    extra      dict   anything else worth keeping (leader epoch, complete flags, ...);
                      a send invoke carries {"session": n}, the producer session it used

Completion types, as in Jepsen: `ok` the operation happened (a send was acknowledged
at `offset`), `fail` it certainly did not happen (a send refused before anything was
sent), `info` unknown (a timeout: the record may or may not be in the log). A process
with an `info` operation is never reused: the worker continues as a new process id, so
each process has at most one operation open at a time.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from collections.abc import Iterator
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import IO
from typing import Any

INVOKE, OK, FAIL, INFO = "invoke", "ok", "fail", "info"
TYPES = (INVOKE, OK, FAIL, INFO)
NEMESIS = "nemesis"
FINAL = "final"
PRODUCER_START = "producer-start"

# Client operations: an invoke and a completion per process.
CLIENT_FS = ("send", "poll")
# Consumer events: one line, no invoke.
EVENT_FS = ("seek", "truncation", "caught-up", PRODUCER_START)
FINAL_FS = ("final-read", "final-read-end")
# seek offset meaning "the log start offset" (the Kafka sentinel for earliest).
SEEK_BEGINNING = -2

Record = tuple[int, int, str, int]  # partition, offset, value, leader epoch


@dataclass(slots=True)
class Op:
    process: int | str
    type: str
    f: str
    value: str | None = None
    values: list[Record] | None = None
    partition: int | None = None
    offset: int | None = None
    ends: dict[int, int] | None = None
    error: str | None = None
    extra: dict[str, Any] | None = None
    time: float = 0.0
    index: int = -1

    def __post_init__(self) -> None:
        if self.type not in TYPES:
            raise ValueError(f"op type must be one of {TYPES}, not {self.type!r}")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": self.index,
            "time": round(self.time, 6),
            "process": self.process,
            "type": self.type,
            "f": self.f,
        }
        for name in ("value", "values", "partition", "offset", "ends", "error", "extra"):
            v = getattr(self, name)
            if v is not None:
                out[name] = [list(r) for r in v] if name == "values" else v
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Op:
        values = data.get("values")
        ends = data.get("ends")
        return cls(
            process=data["process"],
            type=data["type"],
            f=data["f"],
            value=data.get("value"),
            values=None if values is None else [tuple(r) for r in values],  # type: ignore[misc]
            partition=data.get("partition"),
            offset=data.get("offset"),
            # JSON object keys are strings; partitions are ints.
            ends=None if ends is None else {int(k): int(v) for k, v in ends.items()},
            error=data.get("error"),
            extra=data.get("extra"),
            time=float(data.get("time", 0.0)),
            index=int(data.get("index", -1)),
        )


@dataclass
class History:
    """Append-only; thread-safe (the nemesis may record from a thread). With a `path`,
    each op is written and flushed as it is recorded."""

    path: Path | None = None
    ops: list[Op] = field(default_factory=list)
    _start: float = field(default_factory=time.monotonic)
    _file: IO[str] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())

    def append(self, op: Op) -> Op:
        with self._lock:
            op.index = len(self.ops)
            op.time = time.monotonic() - self._start
            self.ops.append(op)
            if self._file is not None:
                self._file.write(json.dumps(op.to_json(), separators=(",", ":")) + "\n")
                self._file.flush()
        return op

    def record(self, process: int | str, type_: str, f: str, **fields: Any) -> Op:
        return self.append(Op(process=process, type=type_, f=f, **fields))

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __iter__(self) -> Iterator[Op]:
        return iter(list(self.ops))

    def __len__(self) -> int:
        return len(self.ops)


def load(path: Path) -> list[Op]:
    """Read a history.jsonl (a torn last line, from a run that died mid-write, is skipped)."""
    ops: list[Op] = []
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            ops.append(Op.from_json(json.loads(line)))
        except json.JSONDecodeError:
            if n == len(lines) - 1:
                break
            raise
    return ops


def dump(ops: Iterable[Op], path: Path) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for op in ops:
            fh.write(json.dumps(op.to_json(), separators=(",", ":")) + "\n")
