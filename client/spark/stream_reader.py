"""The streaming source: `spark.readStream.format("minibroker")`.

Spark drives it from one long-lived Python process on the driver (initialOffset,
latestOffset, partitions, commit) and calls `read()` in executor workers, on fresh
instances: nothing read() needs may live on the instance except the options.

Every plan (latestOffset) validates the previous end positions: where each stored
leader epoch ends on the current leader (OffsetsForLeaderEpoch). A truncation below
a stored offset is found even when the log has grown back past it since.
failOnDataLoss=true raises DataLossError (the query fails with the message);
false logs a WARNING, counts it in the offset's "dataLoss", and plans the partition
from the divergence offset. The decision is kept for partitions(start, end); after a
restart (Spark replays the last planned batch) it is made again from the cluster.
`commit()` and `stop()` hold nothing the source relies on (commit arrives late, stop
may never come).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterator
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.datasource import InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable
from pyspark.sql.streaming.datasource import ReadLimit
from pyspark.sql.streaming.datasource import ReadMaxRows
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from client.epochs import OffsetBeyondLogEndError
from client.spark.offsets import SourceOffset
from client.spark.options import SourceOptions
from client.spark.partition_reader import read_range
from client.spark.planner import Planner
from client.spark.planner import RangePartition
from client.spark.planning import StartDecision
from client.spark.planning import cap_ends
from client.types import TopicPartition

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

_REMEMBERED_PLANS = 8
_PLAN_ATTEMPTS = 5


class MinibrokerStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch stream reader with admission control (maxOffsetsPerTrigger) and
    Trigger.AvailableNow."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.planner = Planner(options)
        self._target: dict[TopicPartition, int] | None = None  # availableNow end
        # start offset text -> the decisions latestOffset made from it
        self._plans: OrderedDict[str, dict[TopicPartition, StartDecision]] = OrderedDict()

    # ------------------------------------------------------------ driver side

    def initialOffset(self) -> dict[str, Any]:
        o = self.options
        partitions = self.planner.current_partitions()
        if not partitions:
            log.warning(
                "no partition to read yet (topics %s, assign %s): new ones are read from "
                "their earliest offset when they appear",
                list(o.topics),
                [str(tp) for tp in o.assignment],
            )
        positions = self.planner.positions_from(
            o.starting.kind, o.starting.as_dict(), "startingOffsets", partitions
        )
        return SourceOffset(positions).to_json()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_offsets_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        """Read up to the high watermarks of now, and no partition that appears later."""
        partitions = self.planner.current_partitions()
        self._target = self.planner.view.high_watermarks(partitions)
        log.info("availableNow: reading up to %s", {str(k): v for k, v in self._target.items()})

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        stored = SourceOffset.from_json(start)
        for attempt in range(1, _PLAN_ATTEMPTS + 1):
            try:
                return self._plan(stored, limit)
            except OffsetBeyondLogEndError as exc:
                # The log changed between reading the high watermark and looking up its
                # epoch (a truncation or a leader change): plan again from the facts.
                if attempt == _PLAN_ATTEMPTS:
                    raise
                log.info("planning again (%d/%d): %s", attempt, _PLAN_ATTEMPTS, exc)
        raise AssertionError("unreachable")

    def _plan(self, stored: SourceOffset, limit: ReadLimit) -> dict[str, Any]:
        decisions, losses = self.planner.decide_starts(dict(stored.positions))
        self.planner.report(losses)
        starts = {tp: d.start for tp, d in decisions.items()}
        if self._target is not None:
            starts = {
                tp: p for tp, p in starts.items() if tp in self._target or tp in stored.positions
            }
        highs = self.planner.view.high_watermarks(starts)
        if self._target is not None:
            highs = {tp: min(h, self._target.get(tp, starts[tp].offset)) for tp, h in highs.items()}
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end_offsets = cap_ends({tp: p.offset for tp, p in starts.items()}, highs, max_rows)
        moved = {tp: off for tp, off in end_offsets.items() if off != starts[tp].offset}
        moved_to = self.planner.view.positions_at(moved)
        ends = {tp: moved_to.get(tp, starts[tp]) for tp in end_offsets}
        end = SourceOffset(ends, stored.data_loss + len(losses))
        self._remember(stored.text(), decisions)
        return end.to_json()

    def _remember(self, start_text: str, decisions: dict[TopicPartition, StartDecision]) -> None:
        self._plans[start_text] = decisions
        while len(self._plans) > _REMEMBERED_PLANS:
            self._plans.popitem(last=False)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        stored = SourceOffset.from_json(start)
        decisions = self._plans.get(stored.text())
        if decisions is None:
            # Not planned by this process: a batch replayed after a restart.
            decisions, losses = self.planner.decide_starts(dict(stored.positions))
            self.planner.report(losses)
        starts = {tp: d.start for tp, d in decisions.items()}
        ends = dict(SourceOffset.from_json(end).positions)
        return self.planner.input_partitions(starts, ends)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the checkpoint holds every position."""

    def stop(self) -> None:
        self.planner.close()

    # ------------------------------------------------------------ executor side

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangePartition), type(partition)
        return read_range(partition.offset_range, partition.options)
