"""The batch source: `spark.read.format("minibroker")` between startingOffsets (default
earliest; or startingTimestamp / startingOffsetsByTimestamp) and endingOffsets (default
latest; or endingTimestamp / endingOffsetsByTimestamp).

Planned once on the driver (partitions()); read() runs in executor workers with the
same code as the stream (client.spark.partition_reader). Starting positions that carry
a leader epoch are validated against the current log like the stream's checkpointed
ones (failOnDataLoss applies); the end positions get the epoch of the record before
them, so the executors check they read the lineage the plan saw.
"""

from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSourceReader
from pyspark.sql.datasource import InputPartition

from client.spark.offsets import Position
from client.spark.options import OptionError
from client.spark.options import SourceOptions
from client.spark.options import option_errors_first
from client.spark.partition_reader import read_range
from client.spark.planner import Planner
from client.spark.planner import RangePartition
from client.types import TopicPartition

if TYPE_CHECKING:
    import pyarrow as pa


class MinibrokerBatchReader(DataSourceReader):
    """One DataFrame of the records between the starting and ending offsets."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        return option_errors_first(self._plan)

    def _plan(self) -> Sequence[InputPartition]:
        o = self.options
        o.announce()
        planner = Planner(o)
        try:
            partitions = planner.current_partitions()
            if not partitions:
                raise OptionError(
                    f"nothing to read: {o.describe_subscription()} has no partitions in the "
                    "cluster "
                    f"(create the topic first: `minibroker topic create NAME`)"
                )
            given = planner.positions_from(o.starting, partitions, starting=True)
            decisions, losses = planner.decide_starts(given, given=True)
            planner.report(losses)
            starts = {tp: d.start for tp, d in decisions.items()}
            ends = planner.positions_from(o.ending, partitions, starting=False)
            for tp, end in sorted(ends.items()):
                if end.offset < starts[tp].offset:
                    raise OptionError(
                        f"{tp}: the starting offset {starts[tp].offset} is after the ending "
                        f"offset {end.offset}; check {o.starting.option or 'startingOffsets'} / "
                        f"{o.ending.option or 'endingOffsets'}"
                    )
            ends = _with_epochs(planner, starts, ends)
            return planner.input_partitions(starts, ends)
        finally:
            planner.close()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RangePartition):
            # Nothing planned (e.g. every start at the end): Spark still runs one task,
            # with a plain InputPartition.
            return iter(())
        return read_range(partition.offset_range, partition.options)


def _with_epochs(
    planner: Planner,
    starts: dict[TopicPartition, Position],
    ends: dict[TopicPartition, Position],
) -> dict[TopicPartition, Position]:
    """Give every end position that moves past its start the epoch of its last record."""
    missing = {
        tp: p.offset for tp, p in ends.items() if p.epoch < 0 and p.offset > starts[tp].offset
    }
    highs = planner.view.high_watermarks(missing)
    # An ending offset past the high watermark cannot be looked up (nor read): clamp it.
    lookup = {tp: min(off, highs[tp]) for tp, off in missing.items()}
    return dict(ends) | planner.view.positions_at(lookup)
