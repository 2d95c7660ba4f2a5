"""Options of the `minibroker` Spark data source, named like Spark's Kafka source.

`SourceOptions.parse(options, streaming=...)` and `SinkOptions.parse(options)` check
everything once, on the driver, and raise ValueError naming the option, what was wrong
and what to write instead. The parsed objects are frozen dataclasses of plain values:
they are pickled into every InputPartition / writer sent to the executors.

Spark hands options over with lower-cased keys; lookups here are case-insensitive.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from typing import TypeVar

from client.bootstrap_servers import parse_bootstrap_servers
from client.spark.offsets import EARLIEST
from client.spark.offsets import LATEST
from client.spark.offsets import Position
from client.spark.offsets import parse_partition_positions
from client.types import TopicPartition

log = logging.getLogger(__name__)

DEFAULT_POLL_TIMEOUT_MS = 120_000
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000  # Spark's "15m"
TIMESTAMP_STRATEGIES = ("error", "latest")

SOURCE_OPTIONS = {
    "kafka.bootstrap.servers": "HOST:PORT[,HOST:PORT...] of any brokers (required)",
    "bootstrap.servers": "alias of kafka.bootstrap.servers",
    "subscribe": "comma-separated topics: every partition of each (exactly one of "
    "subscribe / subscribePattern / assign)",
    "subscribepattern": "a regular expression: every topic whose whole name matches, also "
    "topics created while the stream runs (read from their earliest offset)",
    "assign": 'JSON {"topic": [0, 1]}: these partitions only',
    "startingoffsets": '"earliest", "latest" or JSON {"topic": {"0": {"offset": 5, '
    '"epoch": 1}}} (also {"0": 5}, -2 earliest, -1 latest)',
    "startingoffsetsbytimestamp": 'JSON {"topic": {"0": 1700000000000}}: start at the first '
    "record at or after each partition's time (ms; overrides startingOffsets)",
    "startingtimestamp": "ms since the epoch, for every partition (overrides "
    "startingOffsetsByTimestamp and startingOffsets)",
    "startingoffsetsbytimestampstrategy": '"error" (default) or "latest": what a starting '
    "timestamp after a partition's last record does",
    "endingoffsets": 'batch reads only: "latest" or JSON like startingOffsets (no -2)',
    "endingoffsetsbytimestamp": 'batch reads only: JSON {"topic": {"0": 1700000000000}}: end '
    "before the first record at or after each time (latest when there is none)",
    "endingtimestamp": "batch reads only: ms since the epoch, for every partition",
    "failondataloss": "true (default): fail the query on truncation or retention loss; "
    "false: log a WARNING, count it, and go on",
    "maxoffsetspertrigger": "streaming only: at most this many records per micro-batch",
    "minoffsetspertrigger": "streaming only: wait for at least this many new records "
    "(or maxTriggerDelay) before a micro-batch",
    "maxtriggerdelay": "streaming only: with minOffsetsPerTrigger, the longest wait, e.g. "
    '"30s", "15m" (default 15m)',
    "minpartitions": "split offset ranges so there are at least this many Spark tasks",
    "maxrecordsperpartition": "split offset ranges so no Spark task reads more records",
    "includeheaders": "true: add the `headers` column (default false)",
    "kafkaconsumer.polltimeoutms": "how long an executor waits for records of its range "
    f"and the driver retries an unavailable cluster (default {DEFAULT_POLL_TIMEOUT_MS})",
    "fetchoffset.numretries": "retries of a failed offset lookup on the driver (default: "
    "until kafkaConsumer.pollTimeoutMs)",
    "fetchoffset.retryintervalms": "ms between those retries (default: backoff from 200 ms to 2 s)",
    "groupidprefix": "accepted; unused (the source assigns partitions itself, no group)",
    "kafka.group.id": "accepted; unused (the source assigns partitions itself, no group)",
}

SINK_OPTIONS = {
    "kafka.bootstrap.servers": SOURCE_OPTIONS["kafka.bootstrap.servers"],
    "bootstrap.servers": SOURCE_OPTIONS["bootstrap.servers"],
    "topic": "topic for rows without a `topic` column value",
    "includeheaders": "accepted as in Spark: a `headers` column is written when present",
    "kafka.acks": "all (default; idempotent), 1 or 0",
    "kafka.max.in.flight.requests.per.connection": "requests in flight per broker (default "
    "5; at most 5 with acks=all)",
    "kafka.linger.ms": "producer linger (default 5)",
    "kafka.batch.size": "producer batch size in bytes (default 16384)",
    "kafka.compression.type": "none, gzip, snappy, lz4 or zstd (default none)",
    "kafka.delivery.timeout.ms": "how long a record may take to be acknowledged (default 120000)",
}

# Options Spark itself may pass through to a source or sink; ignored.
_SPARK_OWNED = {"path", "checkpointlocation", "queryname"}

# Kafka parameters Spark's Kafka source and sink refuse, and what to use instead.
_REFUSED_KAFKA = {
    "kafka.auto.offset.reset": "set startingOffsets instead",
    "kafka.enable.auto.commit": "the source commits no offsets (the checkpoint holds them)",
    "kafka.key.deserializer": "keys are bytes: deserialize them with DataFrame operations",
    "kafka.value.deserializer": "values are bytes: deserialize them with DataFrame operations",
    "kafka.key.serializer": "write a binary or string `key` column instead",
    "kafka.value.serializer": "write a binary or string `value` column instead",
    "kafka.interceptor.classes": "interceptors are not supported (nor safe, says Spark)",
}


class OptionError(ValueError):
    """A data source option is missing, unknown or malformed."""


def _lower(options: Mapping[str, Any]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def _check_names(opts: Mapping[str, str], known: Mapping[str, str], kind: str) -> tuple[str, ...]:
    """Refuse unknown options (one line naming them and the options there are), and the
    Kafka parameters Spark refuses; return the other `kafka.*` options, which have no
    meaning here (the caller logs them once, as a WARNING)."""
    for name in sorted(set(opts) & set(_REFUSED_KAFKA)):
        raise OptionError(f"option {name} cannot be set (as in Spark): {_REFUSED_KAFKA[name]}")
    unknown = sorted(set(opts) - set(known) - _SPARK_OWNED)
    ignored = tuple(name for name in unknown if name.startswith("kafka."))
    refused = [name for name in unknown if name not in ignored]
    if refused:
        raise OptionError(
            f"unknown {kind} option(s) {', '.join(refused)} for format 'minibroker'; the "
            f"options are {', '.join(_display(name) for name in known)} (and kafka.* "
            "parameters, ignored with a WARNING)"
        )
    return ignored


def _display(name: str) -> str:
    """An option's name as Spark's documentation spells it (keys arrive lower-cased)."""
    return _SPELLING.get(name, name)


_SPELLING = {
    name.lower(): name
    for name in (
        "subscribePattern",
        "startingOffsets",
        "startingOffsetsByTimestamp",
        "startingTimestamp",
        "startingOffsetsByTimestampStrategy",
        "endingOffsets",
        "endingOffsetsByTimestamp",
        "endingTimestamp",
        "failOnDataLoss",
        "maxOffsetsPerTrigger",
        "minOffsetsPerTrigger",
        "maxTriggerDelay",
        "minPartitions",
        "maxRecordsPerPartition",
        "includeHeaders",
        "kafkaConsumer.pollTimeoutMs",
        "fetchOffset.numRetries",
        "fetchOffset.retryIntervalMs",
        "groupIdPrefix",
    )
}


def _bootstrap(opts: Mapping[str, str]) -> str:
    long, short = opts.get("kafka.bootstrap.servers"), opts.get("bootstrap.servers")
    if long and short and long != short:
        raise OptionError(
            f"kafka.bootstrap.servers ({long!r}) and bootstrap.servers ({short!r}) differ; "
            "give only one"
        )
    servers = long or short
    if not servers:
        raise OptionError(
            "option kafka.bootstrap.servers is required, e.g. "
            '.option("kafka.bootstrap.servers", "127.0.0.1:9092")'
        )
    try:
        parse_bootstrap_servers(servers)
    except ValueError as exc:
        raise OptionError(f"option kafka.bootstrap.servers: {exc}") from None
    return servers


def _bool(opts: Mapping[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise OptionError(f"option {_display(name)} must be true or false, not {raw!r}")
    return value == "true"


def _int_option(opts: Mapping[str, str], name: str, *, minimum: int = 1) -> int | None:
    """An integer option >= minimum, or None when not set."""
    raw = opts.get(name)
    if raw is None:
        return None
    want = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    try:
        value = int(raw.strip())
    except ValueError:
        raise OptionError(f"option {_display(name)} must be {want}, not {raw!r}") from None
    if value < minimum:
        raise OptionError(f"option {_display(name)} must be {want}, not {value}")
    return value


_DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000}
_DURATION_UNITS_MS |= {"d": 86_400_000, "us": 0.001}


def _duration_ms(opts: Mapping[str, str], name: str, default: int) -> int:
    """A time with a unit as Spark writes it ("500ms", "30s", "15m", "1h", "2d"; a
    bare number is ms)."""
    raw = opts.get(name)
    if raw is None:
        return default
    match = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", raw.lower())
    unit = match.group(2) if match else ""
    if match is None or (unit and unit not in _DURATION_UNITS_MS):
        raise OptionError(
            f"option {_display(name)} must be a time like 500ms, 30s, 15m, 1h or 2d, not {raw!r}"
        )
    return int(int(match.group(1)) * _DURATION_UNITS_MS.get(unit or "ms", 1))


def _choice(opts: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    raw = opts.get(name, choices[0])
    value = raw.strip().lower()
    if value not in choices:
        accepted = " or ".join(f'"{c}"' for c in choices)
        raise OptionError(f"option {_display(name)} must be {accepted}, not {raw!r}")
    return value


def _topics(raw: str) -> tuple[str, ...]:
    topics = tuple(sorted({t.strip() for t in raw.split(",") if t.strip()}))
    if not topics:
        raise OptionError(f'option subscribe names no topic ({raw!r}); e.g. "events,clicks"')
    return topics


def _pattern(raw: str) -> str:
    """subscribePattern: a regular expression matched against whole topic names (Java's
    String.matches, here re.fullmatch; the syntax both share: classes, groups,
    quantifiers, alternation, anchors)."""
    if not raw.strip():
        raise OptionError('option subscribePattern is empty; e.g. "events-.*"')
    try:
        re.compile(raw)
    except re.error as exc:
        raise OptionError(
            f'option subscribePattern {raw!r} is not a regular expression ({exc}); e.g. "events-.*"'
        ) from None
    return raw


def _assignment(raw: str) -> tuple[TopicPartition, ...]:
    example = 'e.g. {"events": [0, 1]}'
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise OptionError(f"option assign is not JSON ({exc}); {example}") from None
    if not isinstance(data, dict) or not data:
        raise OptionError(f"option assign must be a non-empty JSON object; {example}")
    out: set[TopicPartition] = set()
    for topic, parts in data.items():
        ok = isinstance(parts, list) and parts
        if not ok or not all(isinstance(p, int) and not isinstance(p, bool) for p in parts):
            raise OptionError(
                f"option assign: topic {topic!r} must map to a non-empty list of partition "
                f"numbers, not {parts!r}; {example}"
            )
        if any(p < 0 for p in parts):
            raise OptionError(f"option assign: negative partition for topic {topic!r}")
        out.update(TopicPartition(topic, p) for p in parts)
    return tuple(sorted(out))


T = TypeVar("T")


def option_errors_first(build: Callable[[], T]) -> T:
    """`build()`; when it raises OptionError, raise it so that Spark's text of it starts
    with the option's message. Spark's Python worker formats the exception it dies of
    (pyspark.util.handle_worker_exception) and the JVM puts that text after its error
    class; the worker exits right after, so what is set here lasts only for that:

    - planning workers simplify tracebacks (SPARK_SIMPLIFIED_TRACEBACK), which drops
      chained exceptions: there SPARK_HIDE_TRACEBACK makes the text the message alone;
    - the streaming source runner formats the whole chain (the exception it dies of may
      be a later one): a copy of the error that was never raised, chained as its
      context, is formatted first and without a traceback."""
    try:
        return build()
    except OptionError as exc:
        error = exc
    if os.environ.get("SPARK_SIMPLIFIED_TRACEBACK"):
        os.environ["SPARK_HIDE_TRACEBACK"] = "1"
    # Outside the except block, so the raise below keeps this context.
    error.__context__ = OptionError(str(error))
    error.__suppress_context__ = False
    raise error


@dataclass(frozen=True)
class OffsetSpec:
    """startingOffsets / endingOffsets: "earliest", "latest" or per-partition positions
    (Position.offset may be EARLIEST / LATEST); or, from the timestamp options, "time":
    every partition at `timestamp`, or "times": per-partition `timestamps`."""

    kind: str  # "earliest" | "latest" | "specific" | "time" | "times"
    positions: tuple[tuple[TopicPartition, Position], ...] = ()
    timestamp: int = -1
    timestamps: tuple[tuple[TopicPartition, int], ...] = ()
    option: str = ""  # the option it came from, for messages

    def as_dict(self) -> dict[TopicPartition, Position]:
        return dict(self.positions)

    @property
    def by_time(self) -> bool:
        return self.kind in ("time", "times")


def _offset_spec(opts: Mapping[str, str], name: str, default: str, display: str) -> OffsetSpec:
    raw = opts.get(name, default).strip()
    if raw.lower() in ("earliest", "latest"):
        return OffsetSpec(raw.lower(), option=display)
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        raise OptionError(
            f'option {display} must be "earliest", "latest" or JSON like '
            f'{{"topic": {{"0": {{"offset": 5, "epoch": 1}}}}}}, not {raw!r}'
        ) from None
    try:
        positions = parse_partition_positions(data, what=f"option {display}")
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    return OffsetSpec("specific", tuple(sorted(positions.items())), option=display)


def _timestamp(raw: str, display: str) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        value = -1
    if value < 0:
        raise OptionError(
            f"option {display} must be a time in ms since the epoch (an integer >= 0), not {raw!r}"
        )
    return value


def _timestamps(raw: str, display: str) -> tuple[tuple[TopicPartition, int], ...]:
    example = 'e.g. {"events": {"0": 1700000000000, "1": 1700000000000}}'
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict) or not data:
        raise OptionError(f"option {display} must be JSON of topics to partitions to ms; {example}")
    out: dict[TopicPartition, int] = {}
    for topic, parts in data.items():
        if not isinstance(parts, dict) or not parts:
            raise OptionError(f"option {display}: topic {topic!r} must map partitions to ms")
        for key, ts in parts.items():
            if not str(key).isdigit() or not isinstance(ts, int) or isinstance(ts, bool) or ts < 0:
                raise OptionError(
                    f"option {display}: {topic}-{key}: {ts!r} must be ms >= 0 for a "
                    f"partition number; {example}"
                )
            out[TopicPartition(str(topic), int(key))] = ts
    return tuple(sorted(out.items()))


def _bound(opts: Mapping[str, str], prefix: str, default: str) -> OffsetSpec:
    """startingTimestamp > startingOffsetsByTimestamp > startingOffsets (Spark's
    precedence), and the same for ending."""
    single, per_partition = f"{prefix}timestamp", f"{prefix}offsetsbytimestamp"
    if single in opts:
        display = _display(single)
        return OffsetSpec("time", timestamp=_timestamp(opts[single], display), option=display)
    if per_partition in opts:
        display = _display(per_partition)
        return OffsetSpec(
            "times", timestamps=_timestamps(opts[per_partition], display), option=display
        )
    display = _display(f"{prefix}offsets")
    return _offset_spec(opts, f"{prefix}offsets", default, display)


def warn_ignored(names: tuple[str, ...], kind: str) -> None:
    """One WARNING naming the kafka.* parameters that have no meaning here."""
    if names:
        log.warning(
            "ignoring Kafka parameter(s) %s: they have no meaning for the minibroker %s "
            "(it uses its own client; see the README's Spark option table)",
            ", ".join(names),
            kind,
        )


@dataclass(frozen=True)
class SourceOptions:
    """Validated source options (picklable)."""

    bootstrap_servers: str
    topics: tuple[str, ...] = ()  # subscribe
    topic_pattern: str | None = None  # subscribePattern
    assignment: tuple[TopicPartition, ...] = ()  # assign
    starting: OffsetSpec = OffsetSpec("latest")
    ending: OffsetSpec = OffsetSpec("latest")
    timestamp_strategy: str = "error"  # startingOffsetsByTimestampStrategy
    fail_on_data_loss: bool = True
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    include_headers: bool = False
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS
    fetch_offset_retries: int | None = None  # None: until poll_timeout_ms
    fetch_offset_retry_interval_ms: int | None = None  # None: exponential backoff
    group_id: str | None = None  # kafka.group.id / groupIdPrefix: said once at INFO
    ignored_kafka_options: tuple[str, ...] = ()  # said once as a WARNING

    @classmethod
    def parse(cls, options: Mapping[str, Any], *, streaming: bool) -> SourceOptions:
        opts = _lower(options)
        ignored = _check_names(opts, SOURCE_OPTIONS, "source")
        servers = _bootstrap(opts)
        given = [name for name in ("subscribe", "subscribepattern", "assign") if name in opts]
        if len(given) != 1:
            raise OptionError(
                "give exactly one of the options subscribe (topics, comma-separated), "
                'subscribePattern (a regular expression) and assign (JSON {"topic": [0, 1]})'
                + (f" ({', '.join(map(_display, given))} are set)" if given else "")
            )
        topics = _topics(opts["subscribe"]) if "subscribe" in opts else ()
        pattern = _pattern(opts["subscribepattern"]) if "subscribepattern" in opts else None
        assignment = _assignment(opts["assign"]) if "assign" in opts else ()
        starting = _bound(opts, "starting", "latest" if streaming else "earliest")
        ending_given = [
            n for n in ("endingoffsets", "endingoffsetsbytimestamp", "endingtimestamp") if n in opts
        ]
        if streaming and ending_given:
            raise OptionError(
                f"option {_display(ending_given[0])} is for batch reads (spark.read); a "
                "stream reads on (use trigger(availableNow=True) to stop at the current end)"
            )
        per_trigger = ("maxoffsetspertrigger", "minoffsetspertrigger", "maxtriggerdelay")
        for name in per_trigger:
            if not streaming and name in opts:
                raise OptionError(f"option {_display(name)} is for streaming reads only")
        ending = _bound(opts, "ending", "latest")
        if not streaming and starting.kind == "latest":
            raise OptionError(
                'startingOffsets "latest" makes an empty batch read; use "earliest" or JSON'
            )
        if ending.kind == "earliest" or any(p.offset == EARLIEST for _, p in ending.positions):
            raise OptionError('endingOffsets cannot be "earliest" (-2): use "latest" or offsets')
        for spec in (starting, ending):
            named = [tp for tp, _ in spec.positions] + [tp for tp, _ in spec.timestamps]
            for tp in named:
                outside = (
                    (topics and tp.topic not in topics)
                    or (assignment and tp not in assignment)
                    or (pattern is not None and not re.fullmatch(pattern, tp.topic))
                )
                if outside:
                    raise OptionError(
                        f"option {spec.option} names {tp}, which the query does not read "
                        f"(subscribe / subscribePattern / assign)"
                    )
        max_per_trigger = _int_option(opts, "maxoffsetspertrigger")
        min_per_trigger = _int_option(opts, "minoffsetspertrigger")
        both = max_per_trigger is not None and min_per_trigger is not None
        if both and min_per_trigger > max_per_trigger:  # type: ignore[operator]
            raise OptionError(
                f"option minOffsetsPerTrigger ({min_per_trigger}) must not exceed "
                f"maxOffsetsPerTrigger ({max_per_trigger})"
            )
        retries = _int_option(opts, "fetchoffset.numretries", minimum=0)
        return cls(
            bootstrap_servers=servers,
            topics=topics,
            topic_pattern=pattern,
            assignment=assignment,
            starting=starting,
            ending=ending,
            timestamp_strategy=_choice(
                opts, "startingoffsetsbytimestampstrategy", TIMESTAMP_STRATEGIES
            ),
            fail_on_data_loss=_bool(opts, "failondataloss", True),
            max_offsets_per_trigger=max_per_trigger,
            min_offsets_per_trigger=min_per_trigger,
            max_trigger_delay_ms=_duration_ms(
                opts, "maxtriggerdelay", DEFAULT_MAX_TRIGGER_DELAY_MS
            ),
            min_partitions=_int_option(opts, "minpartitions"),
            max_records_per_partition=_int_option(opts, "maxrecordsperpartition"),
            include_headers=_bool(opts, "includeheaders", False),
            poll_timeout_ms=_int_option(opts, "kafkaconsumer.polltimeoutms")
            or DEFAULT_POLL_TIMEOUT_MS,
            fetch_offset_retries=retries,
            fetch_offset_retry_interval_ms=_int_option(
                opts, "fetchoffset.retryintervalms", minimum=0
            ),
            group_id=opts.get("kafka.group.id") or opts.get("groupidprefix"),
            ignored_kafka_options=ignored,
        )

    def describe_subscription(self) -> str:
        """What the query reads, for messages."""
        if self.topic_pattern is not None:
            return f"subscribePattern {self.topic_pattern!r}"
        if self.topics:
            return f"subscribe {','.join(self.topics)}"
        return f"assign {', '.join(map(str, self.assignment))}"

    def announce(self) -> None:
        """Say once (per query, or per batch read) what the source does not use: the
        group id at INFO, other kafka.* parameters as a WARNING."""
        if self.group_id is not None:
            log.info(
                "kafka.group.id / groupIdPrefix %r is not used: the minibroker source "
                "assigns partitions itself, joins no consumer group and commits no offsets "
                "(the checkpoint holds them)",
                self.group_id,
            )
        warn_ignored(self.ignored_kafka_options, "source")


@dataclass(frozen=True)
class SinkOptions:
    """Validated sink options (picklable)."""

    bootstrap_servers: str
    topic: str | None = None
    acks: str = "all"
    max_in_flight: int = 5
    linger_ms: int = 5
    batch_size: int = 16384
    compression_type: str = "none"
    delivery_timeout_ms: int = 120_000
    ignored_kafka_options: tuple[str, ...] = ()

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> SinkOptions:
        opts = _lower(options)
        ignored = _check_names(opts, SINK_OPTIONS, "sink")
        compression = opts.get("kafka.compression.type", "none").lower()
        if compression not in ("none", "gzip", "snappy", "lz4", "zstd"):
            raise OptionError(
                f"option kafka.compression.type must be none, gzip, snappy, lz4 or zstd, "
                f"not {compression!r}"
            )
        acks = opts.get("kafka.acks", "all").strip().lower()
        acks = {"-1": "all"}.get(acks, acks)
        if acks not in ("all", "1", "0"):
            raise OptionError(f"option kafka.acks must be all (-1), 1 or 0, not {acks!r}")
        in_flight = _int_option(opts, "kafka.max.in.flight.requests.per.connection") or 5
        if acks == "all" and in_flight > 5:
            raise OptionError(
                "option kafka.max.in.flight.requests.per.connection must be 1 to 5 with "
                f"kafka.acks=all (the idempotent producer keeps order up to 5), not {in_flight}"
            )
        _bool(opts, "includeheaders", False)
        topic = opts.get("topic", "").strip() or None
        linger = _int_option(opts, "kafka.linger.ms", minimum=0)
        return cls(
            bootstrap_servers=_bootstrap(opts),
            topic=topic,
            acks=acks,
            max_in_flight=in_flight,
            linger_ms=5 if linger is None else linger,
            batch_size=_int_option(opts, "kafka.batch.size") or 16384,
            compression_type=compression,
            delivery_timeout_ms=_int_option(opts, "kafka.delivery.timeout.ms") or 120_000,
            ignored_kafka_options=ignored,
        )

    @property
    def idempotent(self) -> bool:
        return self.acks == "all"


__all__ = ["EARLIEST", "LATEST", "OffsetSpec", "OptionError", "SinkOptions", "SourceOptions"]
