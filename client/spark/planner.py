"""The driver side of planning, shared by the stream and the batch reader: gather the
facts from the cluster (ClusterView) and let client.spark.planning decide; report data
loss per failOnDataLoss; turn ranges into Spark InputPartitions.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING
from typing import Any

from pyspark.sql.datasource import InputPartition

from client.spark.offsets import EARLIEST
from client.spark.offsets import LATEST
from client.spark.offsets import NO_EPOCH
from client.spark.offsets import Position
from client.spark.options import OffsetSpec
from client.spark.options import OptionError
from client.spark.options import SourceOptions
from client.spark.planning import DataLoss
from client.spark.planning import DataLossError
from client.spark.planning import OffsetRange
from client.spark.planning import StartDecision
from client.spark.planning import data_loss_hint
from client.spark.planning import new_partition_start
from client.spark.planning import split_ranges
from client.spark.planning import validate_stored_position
from client.spark.planning import vanished_partition
from client.types import TopicPartition

if TYPE_CHECKING:
    # Imported when first used: the tasks that unpickle a reader never open a view.
    from client.spark.cluster_view import ClusterView

log = logging.getLogger(__name__)


class RangePartition(InputPartition):
    """One Spark task: an OffsetRange and the options to read it with (picklable)."""

    def __init__(self, offset_range: OffsetRange, options: SourceOptions) -> None:
        super().__init__(offset_range)
        self.offset_range = offset_range
        self.options = options


class Planner:
    """What the stream and batch readers share on the driver: a ClusterView, opened on
    first use."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._view: ClusterView | None = None

    @property
    def view(self) -> ClusterView:
        if self._view is None:
            from client.spark.cluster_view import ClusterView

            self._view = ClusterView(
                self.options.bootstrap_servers,
                timeout_ms=self.options.poll_timeout_ms,
                retries=self.options.fetch_offset_retries,
                retry_interval_ms=self.options.fetch_offset_retry_interval_ms,
            )
        return self._view

    def close(self) -> None:
        if self._view is not None:
            self._view.close()
            self._view = None

    def current_partitions(self) -> set[TopicPartition]:
        o = self.options
        return self.view.partitions(o.topics, o.assignment, o.topic_pattern)

    def resolve(self, wanted: dict[TopicPartition, int]) -> dict[TopicPartition, Position]:
        """Offsets that may be EARLIEST / LATEST -> Positions (epoch of the record before
        a resolved latest offset, and where it began, looked up; earliest has none)."""
        earliest = [tp for tp, off in wanted.items() if off == EARLIEST]
        latest = [tp for tp, off in wanted.items() if off == LATEST]
        starts = self.view.log_starts(earliest)
        highs = self.view.high_watermarks(latest)
        out = {tp: Position(starts[tp]) for tp in earliest}
        out |= self.view.positions_at(highs)
        return out

    def positions_from(
        self, spec: OffsetSpec, partitions: set[TopicPartition], *, starting: bool
    ) -> dict[TopicPartition, Position]:
        """The starting or ending positions of `partitions` per the options: offsets,
        "earliest" / "latest", or the first record at or after a time (ListOffsets by
        time). A time after a partition's last record ends there (ending), or, per
        startingOffsetsByTimestampStrategy, fails ("error") or starts there ("latest"),
        as Spark's Kafka source does."""
        option = spec.option
        if spec.kind in ("earliest", "latest"):
            marker = EARLIEST if spec.kind == "earliest" else LATEST
            return self.resolve(dict.fromkeys(partitions, marker))
        given: dict[TopicPartition, Any]
        if spec.kind == "time":
            given = dict.fromkeys(partitions, spec.timestamp)
        else:
            given = dict(spec.timestamps) if spec.by_time else spec.as_dict()
        missing = partitions - set(given)
        if missing:
            fallback = "-2 for earliest, -1 for latest" if not spec.by_time else "a time"
            raise OptionError(
                f"option {option} gives offsets for some partitions but not for "
                f"{', '.join(sorted(map(str, missing)))}: give every partition the query reads "
                f'({fallback}), or use "earliest" / "latest"'
            )
        unknown = set(given) - partitions
        if unknown:
            raise OptionError(
                f"option {option} names {', '.join(sorted(map(str, unknown)))}, which the "
                f"cluster does not have"
            )
        if spec.by_time:
            return self._resolve_times(given, option, starting=starting)
        fixed = {tp: p for tp, p in given.items() if p.offset >= 0}
        markers = {tp: p.offset for tp, p in given.items() if p.offset < 0}
        return fixed | self.resolve(markers)

    def _resolve_times(
        self, times: dict[TopicPartition, int], option: str, *, starting: bool
    ) -> dict[TopicPartition, Position]:
        found = self.view.offsets_for_times(times)
        past_end = sorted(tp for tp, offset in found.items() if offset is None)
        if past_end and starting and self.options.timestamp_strategy == "error":
            named = ", ".join(f"{tp} (time {times[tp]})" for tp in past_end)
            raise OptionError(
                f"option {option}: no record at or after the time in {named}; set "
                'startingOffsetsByTimestampStrategy to "latest" to start at the end there'
            )
        fixed = {tp: Position(offset) for tp, offset in found.items() if offset is not None}
        return fixed | self.resolve(dict.fromkeys(past_end, LATEST))

    def decide_starts(
        self, stored: dict[TopicPartition, Position], *, given: bool = False
    ) -> tuple[dict[TopicPartition, StartDecision], list[DataLoss]]:
        """Validate stored positions (`given`: from startingOffsets) against the current
        log (and start new partitions at their earliest offset)."""
        now = self.current_partitions()
        losses = [vanished_partition(tp, p) for tp, p in sorted(stored.items()) if tp not in now]
        live = {tp: p for tp, p in stored.items() if tp in now}
        to_check = {tp: p.epoch for tp, p in live.items() if p.epoch != NO_EPOCH and p.offset > 0}
        # First: it waits until the metadata shows leaders at the stored epochs, so the
        # log starts below come from those leaders too, not from a deposed one.
        epoch_ends = self.view.epoch_ends(to_check)
        log_starts = self.view.log_starts(now)
        decisions: dict[TopicPartition, StartDecision] = {}
        for tp in sorted(now):
            if tp in live:
                decisions[tp] = validate_stored_position(
                    tp, live[tp], epoch_ends.get(tp), log_starts[tp], given=given
                )
            else:
                decisions[tp] = new_partition_start(tp, log_starts[tp])
            if decisions[tp].loss is not None:
                losses.append(decisions[tp].loss)  # type: ignore[arg-type]
        return decisions, losses

    def report(self, losses: list[DataLoss]) -> None:
        """failOnDataLoss=true: raise; false: a WARNING per loss."""
        if not losses:
            return
        if self.options.fail_on_data_loss:
            going_on = "; ".join(
                f"{loss.tp}: {loss.going_on}" if len(losses) > 1 else loss.going_on
                for loss in losses
            )
            raise DataLossError(
                "\n".join(loss.message for loss in losses) + "\n" + data_loss_hint(going_on)
            )
        for loss in losses:
            log.warning("%s failOnDataLoss=false: the source %s.", loss.message, loss.going_on)

    def input_partitions(
        self, starts: dict[TopicPartition, Position], ends: dict[TopicPartition, Position]
    ) -> list[RangePartition]:
        ranges = [
            OffsetRange.between(tp, starts[tp], end)
            for tp, end in sorted(ends.items())
            if tp in starts and end.offset > starts[tp].offset
        ]
        return [
            RangePartition(r, self.options)
            for r in split_ranges(
                ranges, self.options.min_partitions, self.options.max_records_per_partition
            )
        ]
