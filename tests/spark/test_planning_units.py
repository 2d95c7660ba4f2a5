"""Fast unit tests (no Java, no cluster): option parsing, the checkpoint offset JSON,
and the planning rules."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from client.epochs import EpochEndOffset
from client.spark.offsets import Position
from client.spark.offsets import SourceOffset
from client.spark.options import SINK_OPTIONS
from client.spark.options import SOURCE_OPTIONS
from client.spark.options import OptionError
from client.spark.options import SinkOptions
from client.spark.options import SourceOptions
from client.spark.partition_reader import _EpochChecker
from client.spark.planning import OffsetRange
from client.spark.planning import cap_ends
from client.spark.planning import new_partition_start
from client.spark.planning import split_ranges
from client.spark.planning import validate_stored_position
from client.types import TopicPartition

T0, T1, U0 = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("u", 0)
SERVERS = {"kafka.bootstrap.servers": "127.0.0.1:9092"}


# ------------------------------------------------------------ options


def test_source_options_defaults_and_case_insensitive_keys() -> None:
    o = SourceOptions.parse({**SERVERS, "SUBSCRIBE": "b, a,a"}, streaming=True)
    assert o.topics == ("a", "b")
    assert o.starting.kind == "latest"
    assert o.fail_on_data_loss is True
    assert o.max_offsets_per_trigger is None
    assert o.include_headers is False
    batch = SourceOptions.parse({"bootstrap.servers": "h:1", "subscribe": "a"}, streaming=False)
    assert batch.starting.kind == "earliest" and batch.ending.kind == "latest"


def test_source_options_all_set() -> None:
    o = SourceOptions.parse(
        {
            **SERVERS,
            "assign": '{"t": [1, 0], "u": [0]}',
            "startingOffsets": '{"t": {"0": {"offset": 5, "epoch": 2}, "1": -2}, "u": {"0": 7}}',
            "failOnDataLoss": "False",
            "maxOffsetsPerTrigger": "100",
            "minPartitions": "4",
            "includeHeaders": "true",
            "kafkaConsumer.pollTimeoutMs": "5000",
        },
        streaming=True,
    )
    assert o.assignment == (T0, T1, U0)
    assert o.starting.as_dict() == {T0: Position(5, 2), T1: Position(-2), U0: Position(7)}
    assert (o.fail_on_data_loss, o.max_offsets_per_trigger, o.min_partitions) == (False, 100, 4)
    assert o.include_headers and o.poll_timeout_ms == 5000


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "t"}, "kafka.bootstrap.servers is required"),
        ({**SERVERS}, "exactly one of the options subscribe"),
        ({**SERVERS, "subscribe": "t", "assign": '{"t": [0]}'}, "(subscribe, assign are set)"),
        ({**SERVERS, "subscribePattern": "t", "assign": '{"t": [0]}'}, "subscribePattern, assign"),
        ({**SERVERS, "subscribePattern": "t(["}, "is not a regular expression"),
        ({**SERVERS, "subscribe": " , "}, "names no topic"),
        ({**SERVERS, "assign": "[0]"}, "must be a non-empty JSON object"),
        ({**SERVERS, "assign": '{"t": ["0"]}'}, "list of partition numbers"),
        ({**SERVERS, "subscribe": "t", "failOnDataLoss": "yes"}, "true or false"),
        ({**SERVERS, "subscribe": "t", "maxOffsetsPerTrigger": "0"}, "positive integer"),
        ({**SERVERS, "subscribe": "t", "minPartitions": "x"}, "positive integer"),
        ({**SERVERS, "subscribe": "t", "startingOffsets": "first"}, '"earliest", "latest"'),
        ({**SERVERS, "subscribe": "t", "startingOffsets": '{"t": {"0": -3}}'}, "-2 for earliest"),
        ({**SERVERS, "subscribe": "t", "startingOffsets": '{"t": {"x": 1}}'}, "not a number"),
        ({**SERVERS, "subscribe": "t", "startingOffsets": '{"u": {"0": 1}}'}, "does not read"),
        ({**SERVERS, "subscribe": "t", "endingOffsets": "latest"}, "for batch reads"),
        ({**SERVERS, "subscribe": "t", "color": "g"}, "unknown source option(s) color"),
        ({**SERVERS, "subscribe": "t", "kafka.auto.offset.reset": "x"}, "set startingOffsets"),
        (
            {**SERVERS, "subscribe": "t", "startingOffsetsByTimestampStrategy": "first"},
            'startingOffsetsByTimestampStrategy must be "error" or "latest", not \'first\'',
        ),
        ({**SERVERS, "subscribe": "t", "startingTimestamp": "yesterday"}, "ms since the epoch"),
        (
            {**SERVERS, "subscribe": "t", "startingOffsetsByTimestamp": '{"t": {"0": "x"}}'},
            "t-0: 'x' must be ms >= 0",
        ),
        ({**SERVERS, "subscribe": "t", "endingTimestamp": "5"}, "endingTimestamp is for batch"),
        ({**SERVERS, "subscribe": "t", "maxTriggerDelay": "soon"}, "a time like 500ms"),
        (
            {**SERVERS, "subscribe": "t", "minOffsetsPerTrigger": "9", "maxOffsetsPerTrigger": "5"},
            "must not exceed maxOffsetsPerTrigger",
        ),
        ({**SERVERS, "subscribe": "t", "maxRecordsPerPartition": "0"}, "positive integer"),
        ({**SERVERS, "subscribe": "t", "fetchOffset.numRetries": "-1"}, "integer >= 0"),
        ({**SERVERS, "bootstrap.servers": "other:1", "subscribe": "t"}, "differ"),
        ({"kafka.bootstrap.servers": "h:port", "subscribe": "t"}, "port must be a number"),
    ],
)
def test_bad_stream_options_name_the_problem(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError) as err:
        SourceOptions.parse(options, streaming=True)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({**SERVERS, "subscribe": "t", "startingOffsets": "latest"}, "empty batch read"),
        ({**SERVERS, "subscribe": "t", "endingOffsets": "earliest"}, "cannot be"),
        ({**SERVERS, "subscribe": "t", "endingOffsets": '{"t": {"0": -2}}'}, "cannot be"),
        ({**SERVERS, "subscribe": "t", "maxOffsetsPerTrigger": "5"}, "streaming reads only"),
    ],
)
def test_bad_batch_options_name_the_problem(options: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError) as err:
        SourceOptions.parse(options, streaming=False)
    assert message in str(err.value)


def test_sink_options() -> None:
    o = SinkOptions.parse({**SERVERS, "topic": "out", "kafka.compression.type": "LZ4"})
    assert (o.topic, o.compression_type, o.linger_ms) == ("out", "lz4", 5)
    assert SinkOptions.parse({**SERVERS, "checkpointLocation": "/tmp/x"}).topic is None
    with pytest.raises(OptionError, match=r"compression\.type"):
        SinkOptions.parse({**SERVERS, "kafka.compression.type": "brotli"})
    with pytest.raises(OptionError, match="unknown sink option"):
        SinkOptions.parse({**SERVERS, "acks": "1"})
    o = SinkOptions.parse(
        {**SERVERS, "kafka.acks": "1", "kafka.max.in.flight.requests.per.connection": "9"}
    )
    assert (o.acks, o.idempotent, o.max_in_flight) == ("1", False, 9)
    assert SinkOptions.parse({**SERVERS, "kafka.acks": "-1"}).idempotent
    with pytest.raises(OptionError, match=r"must be 1 to 5 with kafka\.acks=all"):
        SinkOptions.parse({**SERVERS, "kafka.max.in.flight.requests.per.connection": "6"})
    with pytest.raises(OptionError, match=r"kafka\.acks must be all"):
        SinkOptions.parse({**SERVERS, "kafka.acks": "2"})
    ignored = SinkOptions.parse({**SERVERS, "includeHeaders": "true", "kafka.retries": "3"})
    assert ignored.ignored_kafka_options == ("kafka.retries",)


def test_every_option_error_is_one_line() -> None:
    """The messages Spark shows first: one line naming the option (and what it takes)."""
    with pytest.raises(OptionError) as err:
        SourceOptions.parse({**SERVERS, "subscribe": "t", "colour": "x"}, streaming=True)
    message = str(err.value)
    assert "\n" not in message and "colour" in message
    assert "subscribePattern" in message and "startingOffsetsByTimestamp" in message


def test_spark_kafka_source_options_parse_to_their_meaning() -> None:
    o = SourceOptions.parse(
        {
            **SERVERS,
            "subscribePattern": "orders-.*",
            "startingTimestamp": "1000",
            "startingOffsetsByTimestamp": '{"orders-a": {"0": 5}}',  # overridden
            "startingOffsetsByTimestampStrategy": "LATEST",
            "minOffsetsPerTrigger": "10",
            "maxTriggerDelay": "2s",
            "maxRecordsPerPartition": "50",
            "fetchOffset.numRetries": "2",
            "fetchOffset.retryIntervalMs": "30",
            "groupIdPrefix": "spark-kafka-source",
            "kafka.group.id": "orders-app",
            "kafka.session.timeout.ms": "6000",
            "kafka.max.poll.records": "500",
        },
        streaming=True,
    )
    assert o.topic_pattern == "orders-.*" and o.topics == () and o.assignment == ()
    assert (o.starting.kind, o.starting.timestamp, o.starting.option) == (
        "time",
        1000,
        "startingTimestamp",
    )
    assert o.timestamp_strategy == "latest"
    assert (o.min_offsets_per_trigger, o.max_trigger_delay_ms) == (10, 2000)
    assert o.max_records_per_partition == 50
    assert (o.fetch_offset_retries, o.fetch_offset_retry_interval_ms) == (2, 30)
    assert o.group_id == "orders-app"
    assert o.ignored_kafka_options == ("kafka.max.poll.records", "kafka.session.timeout.ms")
    batch = SourceOptions.parse(
        {
            **SERVERS,
            "subscribe": "t",
            "startingOffsetsByTimestamp": '{"t": {"0": 5, "1": 7}}',
            "endingOffsetsByTimestamp": '{"t": {"0": 9, "1": 9}}',
        },
        streaming=False,
    )
    assert batch.starting.kind == "times" and dict(batch.starting.timestamps) == {T0: 5, T1: 7}
    assert batch.ending.kind == "times" and batch.ending.option == "endingOffsetsByTimestamp"
    default = SourceOptions.parse({**SERVERS, "subscribe": "t"}, streaming=True)
    assert default.max_trigger_delay_ms == 15 * 60 * 1000


# ------------------------------------------------------------ offsets JSON


def test_offset_json_has_fixed_key_order_whatever_the_insertion_order() -> None:
    a = SourceOffset({U0: Position(3, 1), T1: Position(10, 2), T0: Position(0)}, data_loss=1)
    b = SourceOffset({T0: Position(0), U0: Position(3, 1), T1: Position(10, 2)}, data_loss=1)
    assert a.text() == b.text()
    assert a.text() == (
        '{"partitions": {"t": {"0": {"offset": 0, "epoch": -1}, "1": {"offset": 10, "epoch": 2}}, '
        '"u": {"0": {"offset": 3, "epoch": 1}}}, "dataLoss": 1}'
    )
    # Partitions sort by number, not as text ("10" after "2").
    many = SourceOffset({TopicPartition("t", p): Position(p) for p in (10, 2, 1)})
    assert list(many.to_json()["partitions"]["t"]) == ["1", "2", "10"]


def test_offset_json_round_trips_through_spark_text() -> None:
    a = SourceOffset({T0: Position(9, 0), U0: Position(4, 3)}, data_loss=2)
    again = SourceOffset.from_json(json.loads(a.text()))
    assert again == a and again.text() == a.text()
    assert SourceOffset.from_json(a.text()) == a


def test_offset_json_writes_where_the_epoch_began_when_known() -> None:
    a = SourceOffset({T0: Position(6, 3, 4), T1: Position(9, 0, 0), U0: Position(2, 1)})
    assert a.text() == (
        '{"partitions": {"t": {"0": {"offset": 6, "epoch": 3, "epochStart": 4}, '
        '"1": {"offset": 9, "epoch": 0, "epochStart": 0}}, '
        '"u": {"0": {"offset": 2, "epoch": 1}}}, "dataLoss": 0}'
    )
    assert SourceOffset.from_json(a.text()) == a


# What the source wrote to checkpoints before "epochStart" existed (verbatim: Spark keeps
# this text in the offset log and hands it back to latestOffset after an upgrade).
OLD_CHECKPOINT_OFFSET = (
    '{"partitions": {"t": {"0": {"offset": 6, "epoch": 3}, "1": {"offset": 0, "epoch": -1}}}, '
    '"dataLoss": 2}'
)


def test_an_old_checkpoint_offset_reads_back_without_epoch_starts_and_unchanged() -> None:
    """The on-disk contract: a checkpoint of the older source parses, its positions have
    no epoch start (-1: validated by the end offset only, client/epochs.py rule 3), and
    its text comes back byte for byte (Spark compares offsets as text: a changed text
    would look like new data)."""
    old = SourceOffset.from_json(OLD_CHECKPOINT_OFFSET)
    assert old == SourceOffset({T0: Position(6, 3, -1), T1: Position(0)}, data_loss=2)
    assert old.text() == OLD_CHECKPOINT_OFFSET
    # Today's rule for it: the leader that never had epoch 3 is not seen (the fallback
    # the README states); with the epoch start stored, it is.
    never_had_3 = EpochEndOffset(2, 10)
    assert validate_stored_position(T0, old.positions[T0], never_had_3, 0).loss is None
    assert validate_stored_position(T0, Position(6, 3, 4), never_had_3, 0).loss is not None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"t": {"0": 1}}, "not a minibroker source offset"),
        ({"partitions": {"t": {"0": {"offset": "1"}}}}, "must be integers"),
        ({"partitions": {"t": {"0": {"offset": 6, "epoch": 3, "epochStart": True}}}}, "integers"),
        ({"partitions": {"t": {"0": {"offset": 6, "epoch": 3, "epochStart": 6}}}}, "epochStart 6"),
        ({"partitions": {"t": {"0": {"offset": 6, "epochStart": 2}}}}, "epoch >= 0"),
        ({"partitions": {"t": {"0": {"offset": 1, "leader": 2}}}}, "expected an offset"),
        ({"partitions": {"t": {"0": -1}}}, "negative"),
    ],
)
def test_bad_checkpoint_offsets_are_refused(value: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SourceOffset.from_json(value)


# ------------------------------------------------------------ validating stored positions


def test_position_on_the_current_lineage_is_kept() -> None:
    d = validate_stored_position(T0, Position(9, 0), EpochEndOffset(0, 9), log_start=0)
    assert d.start == Position(9, 0) and d.loss is None
    # The epoch ended later (the leader wrote more in it): still valid.
    d = validate_stored_position(T0, Position(9, 0), EpochEndOffset(0, 12), log_start=0)
    assert d.start == Position(9, 0) and d.loss is None


def test_truncation_below_the_stored_offset_is_found_even_if_the_log_grew_back() -> None:
    """Epoch 0 ends at 5 on the new leader; the stored position (9, epoch 0) is past it,
    whatever the log end is now (it may be 11: grown back past 9)."""
    d = validate_stored_position(T0, Position(9, 0), EpochEndOffset(0, 5), log_start=0)
    assert d.start == Position(5, 0)
    assert d.loss is not None
    for part in (
        "topic t partition 0",
        "truncated at offset 5 of leader epoch 0",
        "stored offset 9 (leader epoch 0)",
        "diverges at offset 5",
        "an unclean leader election",
    ):
        assert part in d.loss.message, d.loss.message
    assert d.loss.going_on.startswith("resumes at offset 5, the divergence offset")
    assert d.loss.kind == "truncation"


def test_a_bad_epoch_given_in_starting_offsets_is_not_blamed_on_an_election() -> None:
    """A batch read given (offset 9, epoch 0) where epoch 0 ends at 5: the position is
    refused, saying the epoch may be wrong, not that the query already read records."""
    d = validate_stored_position(T0, Position(9, 0), EpochEndOffset(0, 5), 0, given=True)
    assert d.loss is not None and d.start == Position(5, 0)
    message = d.loss.message
    assert "the startingOffsets position 9 (leader epoch 0)" in message, message
    assert "a wrong epoch, or a log truncated at offset 5" in message, message
    assert "unclean" not in message and "already read" not in message, message


def test_a_leader_that_never_had_the_stored_epoch_is_a_truncation() -> None:
    """client/epochs.py rule 4, as the chaos run found it for the consumer: the query
    read 4-5 in leader epoch 3 (an unclean leader, then gone) and stored (6, epoch 3,
    epoch 3 began at 4). The next leader never followed epoch 3: asked for it, it
    answers (epoch 2, ends at 10), past the stored offset, so the end-offset rule alone
    takes the position for valid while 4-5 now hold other records. The lineages part
    where epoch 3 began."""
    d = validate_stored_position(T0, Position(6, 3, 4), EpochEndOffset(2, 10), log_start=0)
    assert d.loss is not None
    # The record before 4 on the new leader is of some epoch <= 2: not known here.
    assert d.start == Position(4)
    for part in (
        "topic t partition 0",
        "stored offset 6 (leader epoch 3)",
        "no records of leader epoch 3 at all",
        "from offset 4 on",
        "diverges at offset 4",
        "Records 4 to 5 that this query already read",
    ):
        assert part in d.loss.message, d.loss.message
    assert d.loss.going_on.startswith("resumes at offset 4, the divergence offset")
    # The older epoch ends before the stored epoch began: the divergence is its end,
    # whose epoch is exact.
    d = validate_stored_position(T0, Position(6, 3, 4), EpochEndOffset(2, 3), log_start=0)
    assert d.start == Position(3, 2) and d.loss is not None
    # The leader has the stored epoch: nothing lost, whatever the epoch start.
    assert validate_stored_position(T0, Position(6, 3, 4), EpochEndOffset(3, 6), 0).loss is None


def test_an_unknown_epoch_is_never_a_loss_retention_is() -> None:
    """An "unknown epoch" answer (a broker not yet leading at the stored epoch) is
    retried by client.epochs, never turned into a loss: the rule refuses it loudly."""
    with pytest.raises(ValueError, match="must be retried"):
        validate_stored_position(T0, Position(9, 0), EpochEndOffset(-1, -1), log_start=0)
    d = validate_stored_position(T0, Position(3), None, log_start=20)
    assert d.start == Position(20) and d.loss and "offsets 3 to 19" in d.loss.message
    assert "retention deleted the log past offset 3" in d.loss.message
    assert d.loss.going_on == "resumes at offset 20, the first offset still in the log"
    # Without an epoch there is nothing to validate (Kafka skips too).
    assert validate_stored_position(T0, Position(30), None, log_start=20).loss is None


def test_new_partitions_start_at_earliest() -> None:
    assert new_partition_start(T1, 0).start == Position(0)
    assert new_partition_start(T1, 0).loss is None
    late = new_partition_start(T1, 7)
    assert late.start == Position(7) and late.loss and "instead of 0" in late.loss.message


# ------------------------------------------------------------ caps and splits


def test_cap_ends_is_exact_and_proportional() -> None:
    starts = {T0: 0, T1: 10, U0: 5}
    latest = {T0: 30, T1: 20, U0: 5}
    assert cap_ends(starts, latest, None) == latest
    capped = cap_ends(starts, latest, 8)
    assert sum(capped[tp] - starts[tp] for tp in starts) == 8
    assert capped == {T0: 6, T1: 12, U0: 5}  # 30:10 backlog -> 6:2
    assert cap_ends(starts, latest, 1000) == latest
    # A high watermark behind the start (HW lag after a failover) reads nothing.
    assert cap_ends({T0: 9}, {T0: 7}, None) == {T0: 9}


def test_split_ranges_for_min_partitions_keeps_epoch_checks_at_the_ends() -> None:
    r = OffsetRange.between(T0, Position(10, 1, 7), Position(20, 3))
    small = OffsetRange.between(T1, Position(0), Position(2, 0))
    pieces = split_ranges([r, small], 6)
    mine = [p for p in pieces if p.tp == T0]
    assert [(p.start, p.end) for p in mine] == [(10, 12), (12, 14), (14, 16), (16, 18), (18, 20)]
    assert [p.start_epoch for p in mine] == [1, -1, -1, -1, -1]
    assert [p.start_epoch_start for p in mine] == [7, -1, -1, -1, -1]
    assert [p.end_epoch for p in mine] == [-1, -1, -1, -1, 3]
    assert {(p.floor_epoch, p.ceiling_epoch) for p in mine} == {(1, 3)}
    assert split_ranges([r, small], None) == [r, small]
    assert split_ranges([OffsetRange(T0, 4, 4)], 3) == []


def test_split_ranges_for_max_records_per_partition_then_min_partitions() -> None:
    """Spark's KafkaOffsetRangeCalculator: ceil(size / max) pieces per range first, then
    minPartitions over those pieces."""
    r = OffsetRange.between(T0, Position(0), Position(10, 2))
    small = OffsetRange(T1, 0, 3)
    pieces = split_ranges([r, small], None, 4)
    assert [(p.tp, p.start, p.end) for p in pieces] == [
        (T0, 0, 4),
        (T0, 4, 7),
        (T0, 7, 10),
        (T1, 0, 3),
    ]
    assert [p.end_epoch for p in pieces[:3]] == [-1, -1, 2]
    assert len(split_ranges([r, small], 8, 4)) >= 8
    assert split_ranges([r, small], None, 10) == [r, small]


# ------------------------------------------------------------ executor epoch checks


def _check(checker: _EpochChecker, *offset_epochs: tuple[int, int]) -> tuple[int, str] | None:
    """Feed records batch by batch (a run of one epoch is one batch), as the reader
    does; the index returned is over all the records given."""
    seen = 0
    runs: list[tuple[int, list[int]]] = []
    for offset, epoch in offset_epochs:
        if runs and runs[-1][0] == epoch:
            runs[-1][1].append(offset)
        else:
            runs.append((epoch, [offset]))
    for epoch, offsets in runs:
        found = checker.first_mismatch(epoch, offsets)
        if found is not None:
            return seen + found[0], found[1]
        seen += len(offsets)
    return None


def test_executor_accepts_records_carrying_the_planned_epochs() -> None:
    r = OffsetRange.between(T0, Position(3, 1), Position(7, 2))
    checker = _EpochChecker(r)
    assert _check(checker, (3, 1), (4, 2)) is None
    assert _check(checker, (5, 2), (6, 2)) is None


@pytest.mark.parametrize(
    ("records", "bad_index"),
    [
        (((3, 1), (4, 3)), 1),  # above the end epoch: a newer lineage
        (((3, 0),), 0),  # below the start epoch
        (((3, 2), (4, 1)), 1),  # epochs going backwards
        (((3, 1), (4, 1), (5, 1), (6, 1)), 3),  # the last record is not in the end epoch
    ],
)
def test_executor_stops_at_the_first_record_of_another_lineage(
    records: tuple[tuple[int, int], ...], bad_index: int
) -> None:
    checker = _EpochChecker(OffsetRange.between(T0, Position(3, 1), Position(7, 2)))
    found = _check(checker, *records)
    assert found is not None
    index, message = found
    assert index == bad_index
    assert f"the record at offset {records[bad_index][0]} carries leader epoch" in message
    assert "topic t partition 0" in message and "expects leader epochs from 1 to 2" in message


# ------------------------------------------------------------ Arrow value column


@pytest.mark.parametrize("size", [0, 1, 100, 300])
def test_the_arrow_value_column_is_the_records_values(size: int) -> None:
    """Runs of alike records become fixed-size binary sliced in Arrow; with odd
    records among them, and after truncate(), the column is still every value."""
    import pyarrow as pa

    from client.record_columns import ColumnBuffer
    from client.record_columns import ValueRun
    from client.record_columns import decode_columns
    from client.spark.partition_reader import _value_array
    from protocol.record_batch import BatchBuilder
    from protocol.record_batch import decode_batch

    builder = BatchBuilder()
    for i in range(300):
        value = None if i == 120 else b"odd" if i in (50, 200) else bytes([i % 256]) * size
        builder.append(value, None, (), 1000 + i % 3)
    batch = builder.build(0)
    expected = [r.value for r in decode_batch(batch)[1]]
    columns = ColumnBuffer(False)
    decode_columns(batch, 0, columns)
    assert any(isinstance(piece, ValueRun) for piece in columns.value_pieces)
    assert _value_array(columns.value_pieces, pa.binary()).to_pylist() == expected
    columns.truncate(150)
    assert _value_array(columns.value_pieces, pa.binary()).to_pylist() == expected[:150]


def test_readme_option_tables_list_every_option() -> None:
    """The README's Spark option tables name every option the source and sink take."""
    readme = (Path(__file__).parents[2] / "README.md").read_text()

    def table(header: str) -> set[str]:
        rows = readme.split(header, 1)[1].split("\n\n", 1)[0].splitlines()[2:]
        names = {n.lower() for row in rows for n in re.findall(r"`([\w.]+)`", row.split("|")[1])}
        return names

    assert set(SOURCE_OPTIONS) <= table("| source option |") | {"bootstrap.servers"}
    assert set(SINK_OPTIONS) <= table("| sink option |") | {"bootstrap.servers"}
