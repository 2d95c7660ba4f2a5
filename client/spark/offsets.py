"""The source's offset: what Spark writes to the checkpoint for every micro-batch.

Format (JSON; Spark compares offsets as JSON text, so the key order is fixed: topics
sorted by name, partitions by number, then "offset", "epoch", "epochStart"):

    {"partitions": {"<topic>": {"<partition>": {"offset": 9, "epoch": 2, "epochStart": 4},
     ...}, ...}, "dataLoss": 0}

- "offset" is the next offset to read; "epoch" the leader epoch of the record just
  before it (-1: unknown, e.g. offset 0 or a position given without one). With both,
  every plan can ask the current leader where that epoch ends (OffsetsForLeaderEpoch)
  and so see a truncation even after the log has grown back past the offset.
- "epochStart" is where that epoch began on the leader the plan asked, written only
  when known. A leader that answers an older epoch than "epoch" never had it (elected
  from a replica that never followed it): the records from "epochStart" on are gone
  however far its older epoch runs (client/epochs.py, rule 4). Checkpoints written
  before this field existed lack it: for their positions only the end-offset rule
  (rule 3) applies, until the next plan stores a position with it.
- "dataLoss" counts the truncations and retention losses the source detected and
  skipped over with failOnDataLoss=false (cumulative over the query's life, so it is in
  the checkpoint and in `query.lastProgress["sources"][0]["endOffset"]`);
  "truncations" how many of them were log truncations, written only when not 0 (so
  offsets without a truncation read, and compare as text, as before it existed).

Partition keys are strings (JSON object keys). `startingOffsets` / `endingOffsets`
JSON uses the same per-partition shape, or a plain number like Spark's Kafka source
(-2 = earliest, -1 = latest).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from typing import Any
from typing import NamedTuple

from client.types import TopicPartition

NO_EPOCH = -1
EARLIEST = -2
LATEST = -1


class Position(NamedTuple):
    """Next offset to read, the leader epoch of the record before it, and the offset
    where that epoch began (-1: not known)."""

    offset: int
    epoch: int = NO_EPOCH
    epoch_start: int = -1

    def to_json(self) -> dict[str, int]:
        out = {"offset": self.offset, "epoch": self.epoch}
        # Left out when unknown: such a position reads back as the older source wrote it.
        if self.epoch_start >= 0:
            out["epochStart"] = self.epoch_start
        return out


@dataclass(frozen=True)
class SourceOffset:
    """One checkpointed offset of the stream: a Position per partition."""

    positions: Mapping[TopicPartition, Position] = field(default_factory=dict)
    data_loss: int = 0
    truncations: int = 0

    def to_json(self) -> dict[str, Any]:
        """The dict Spark serializes, keys in the fixed order."""
        by_topic: dict[str, dict[str, dict[str, int]]] = {}
        for tp in sorted(self.positions):
            by_topic.setdefault(tp.topic, {})[str(tp.partition)] = self.positions[tp].to_json()
        out: dict[str, Any] = {"partitions": by_topic, "dataLoss": self.data_loss}
        if self.truncations:
            out["truncations"] = self.truncations
        return out

    def text(self) -> str:
        """The JSON text, as Spark compares it."""
        return json.dumps(self.to_json())

    @classmethod
    def from_json(cls, value: Mapping[str, Any] | str) -> SourceOffset:
        """Parse what to_json() produced (a dict from Spark, or its text)."""
        data = json.loads(value) if isinstance(value, str) else value
        if not isinstance(data, Mapping) or "partitions" not in data:
            raise ValueError(
                f"not a minibroker source offset: {data!r}; expected "
                '{"partitions": {...}, "dataLoss": N} (was the checkpoint written by '
                "another source?)"
            )
        positions = parse_partition_positions(data["partitions"], what="checkpointed offset")
        for tp, p in positions.items():
            if p.offset < 0:
                raise ValueError(f"checkpointed offset of {tp} is negative: {p.offset}")
        return cls(positions, int(data.get("dataLoss", 0)), int(data.get("truncations", 0)))


def parse_partition_positions(value: Any, *, what: str) -> dict[TopicPartition, Position]:
    """{"topic": {"0": {"offset": 5, "epoch": 1[, "epochStart": 3]} | 5}} ->
    {TopicPartition: Position}.

    Offsets may be -2 (earliest) or -1 (latest) where the caller allows it."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{what}: expected a JSON object of topics, got {value!r}")
    out: dict[TopicPartition, Position] = {}
    for topic, parts in value.items():
        if not isinstance(parts, Mapping):
            raise ValueError(
                f"{what}: topic {topic!r} must map partition numbers to offsets, got {parts!r}"
            )
        for key, spec in parts.items():
            try:
                partition = int(key)
            except (TypeError, ValueError):
                raise ValueError(
                    f"{what}: partition {key!r} of topic {topic!r} is not a number"
                ) from None
            out[TopicPartition(str(topic), partition)] = _position(spec, f"{what} {topic}-{key}")
    return out


def _position(spec: Any, where: str) -> Position:
    if isinstance(spec, bool):
        raise ValueError(f"{where}: expected an offset, got {spec!r}")
    if isinstance(spec, int):
        offset, epoch, epoch_start = spec, NO_EPOCH, -1
    elif isinstance(spec, Mapping) and set(spec) <= _POSITION_KEYS and "offset" in spec:
        # No "epochStart": a checkpoint of the older source, or a position given without
        # it; only the end-offset rule validates it (client/epochs.py, rule 3).
        offset, epoch = spec["offset"], spec.get("epoch", NO_EPOCH)
        epoch_start = spec.get("epochStart", -1)
        if not all(
            isinstance(v, int) and not isinstance(v, bool) for v in (offset, epoch, epoch_start)
        ):
            raise ValueError(
                f"{where}: offset, epoch and epochStart must be integers, got {dict(spec)!r}"
            )
    else:
        raise ValueError(
            f'{where}: expected an offset or {{"offset": N, "epoch": E}}, got {spec!r}'
        )
    if offset < EARLIEST:
        raise ValueError(f"{where}: offset {offset} (use -2 for earliest, -1 for latest)")
    if epoch < NO_EPOCH:
        raise ValueError(f"{where}: leader epoch {epoch} must be >= -1")
    if epoch_start != -1 and not (epoch >= 0 and 0 <= epoch_start < offset):
        raise ValueError(
            f"{where}: epochStart {epoch_start} must be -1 (unknown) or, with an epoch >= 0, "
            f"where that leader epoch began: 0 to offset - 1 ({offset - 1}); got epoch "
            f"{epoch}, offset {offset}"
        )
    return Position(offset, epoch, epoch_start)


_POSITION_KEYS = frozenset({"offset", "epoch", "epochStart"})
