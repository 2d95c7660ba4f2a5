"""Options of the `minibroker` Spark data source, named like Spark's Kafka source.

`SourceOptions.parse(options, streaming=...)` and `SinkOptions.parse(options)` check
everything once, on the driver, and raise ValueError naming the option, what was wrong
and what to write instead. The parsed objects are frozen dataclasses of plain values:
they are pickled into every InputPartition / writer sent to the executors.

Spark hands options over with lower-cased keys; lookups here are case-insensitive.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from client.cluster import parse_bootstrap_servers
from client.spark.offsets import EARLIEST
from client.spark.offsets import LATEST
from client.spark.offsets import Position
from client.spark.offsets import parse_partition_positions
from client.types import TopicPartition

DEFAULT_POLL_TIMEOUT_MS = 120_000

SOURCE_OPTIONS = {
    "kafka.bootstrap.servers": "HOST:PORT[,HOST:PORT...] of any brokers (required)",
    "bootstrap.servers": "alias of kafka.bootstrap.servers",
    "subscribe": "comma-separated topics: every partition of each (exactly one of "
    "subscribe / assign)",
    "assign": 'JSON {"topic": [0, 1]}: these partitions only',
    "startingoffsets": '"earliest", "latest" or JSON {"topic": {"0": {"offset": 5, '
    '"epoch": 1}}} (also {"0": 5}, -2 earliest, -1 latest)',
    "endingoffsets": 'batch reads only: "latest" or JSON like startingOffsets (no -2)',
    "failondataloss": "true (default): fail the query on truncation or retention loss; "
    "false: log a WARNING, count it, and go on",
    "maxoffsetspertrigger": "streaming only: at most this many records per micro-batch",
    "minpartitions": "split offset ranges so there are at least this many Spark tasks",
    "includeheaders": "true: add the `headers` column (default false)",
    "kafkaconsumer.polltimeoutms": "how long an executor waits for records of its range "
    f"and the driver retries an unavailable cluster (default {DEFAULT_POLL_TIMEOUT_MS})",
}

SINK_OPTIONS = {
    "kafka.bootstrap.servers": SOURCE_OPTIONS["kafka.bootstrap.servers"],
    "bootstrap.servers": SOURCE_OPTIONS["bootstrap.servers"],
    "topic": "topic for rows without a `topic` column value",
    "kafka.linger.ms": "producer linger (default 5)",
    "kafka.batch.size": "producer batch size in bytes (default 16384)",
    "kafka.compression.type": "none, gzip, snappy, lz4 or zstd (default none)",
    "kafka.delivery.timeout.ms": "how long a record may take to be acknowledged (default 120000)",
}

# Options Spark itself may pass through to a source or sink; ignored.
_SPARK_OWNED = {"path", "checkpointlocation", "queryname"}


class OptionError(ValueError):
    """A data source option is missing, unknown or malformed."""


def _lower(options: Mapping[str, Any]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def _reject_unknown(opts: Mapping[str, str], known: Mapping[str, str], kind: str) -> None:
    unknown = sorted(set(opts) - set(known) - _SPARK_OWNED)
    if unknown:
        listing = "\n".join(f"  {name}: {what}" for name, what in known.items())
        raise OptionError(
            f"unknown {kind} option(s) {', '.join(unknown)} for format 'minibroker'; "
            f"the options are:\n{listing}"
        )


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
        raise OptionError(f"option {name} must be true or false, not {raw!r}")
    return value == "true"


def _int_option(opts: Mapping[str, str], name: str, *, minimum: int = 1) -> int | None:
    """An integer option >= minimum, or None when not set."""
    raw = opts.get(name)
    if raw is None:
        return None
    want = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    try:
        value = int(raw)
    except ValueError:
        raise OptionError(f"option {name} must be {want}, not {raw!r}") from None
    if value < minimum:
        raise OptionError(f"option {name} must be {want}, not {value}")
    return value


def _topics(raw: str) -> tuple[str, ...]:
    topics = tuple(sorted({t.strip() for t in raw.split(",") if t.strip()}))
    if not topics:
        raise OptionError(f'option subscribe names no topic ({raw!r}); e.g. "events,clicks"')
    return topics


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


@dataclass(frozen=True)
class OffsetSpec:
    """startingOffsets / endingOffsets: "earliest", "latest" or per-partition positions
    (Position.offset may be EARLIEST / LATEST)."""

    kind: str  # "earliest" | "latest" | "specific"
    positions: tuple[tuple[TopicPartition, Position], ...] = ()

    def as_dict(self) -> dict[TopicPartition, Position]:
        return dict(self.positions)


def _offset_spec(opts: Mapping[str, str], name: str, default: str, display: str) -> OffsetSpec:
    raw = opts.get(name, default).strip()
    if raw.lower() in ("earliest", "latest"):
        return OffsetSpec(raw.lower())
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
    return OffsetSpec("specific", tuple(sorted(positions.items())))


@dataclass(frozen=True)
class SourceOptions:
    """Validated source options (picklable)."""

    bootstrap_servers: str
    topics: tuple[str, ...] = ()  # subscribe
    assignment: tuple[TopicPartition, ...] = ()  # assign
    starting: OffsetSpec = OffsetSpec("latest")
    ending: OffsetSpec = OffsetSpec("latest")
    fail_on_data_loss: bool = True
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    include_headers: bool = False
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS

    @classmethod
    def parse(cls, options: Mapping[str, Any], *, streaming: bool) -> SourceOptions:
        opts = _lower(options)
        _reject_unknown(opts, SOURCE_OPTIONS, "source")
        servers = _bootstrap(opts)
        has_subscribe, has_assign = "subscribe" in opts, "assign" in opts
        if has_subscribe == has_assign:
            raise OptionError(
                "give exactly one of the options subscribe (topics, comma-separated) and "
                'assign (JSON {"topic": [0, 1]})' + (" (both are set)" if has_subscribe else "")
            )
        topics = _topics(opts["subscribe"]) if has_subscribe else ()
        assignment = _assignment(opts["assign"]) if has_assign else ()
        starting = _offset_spec(
            opts, "startingoffsets", "latest" if streaming else "earliest", "startingOffsets"
        )
        if streaming and "endingoffsets" in opts:
            raise OptionError(
                "option endingOffsets is for batch reads (spark.read); a stream reads on "
                "(use trigger(availableNow=True) to stop at the current end)"
            )
        if not streaming and "maxoffsetspertrigger" in opts:
            raise OptionError("option maxOffsetsPerTrigger is for streaming reads only")
        ending = _offset_spec(opts, "endingoffsets", "latest", "endingOffsets")
        if not streaming and starting.kind == "latest":
            raise OptionError(
                'startingOffsets "latest" makes an empty batch read; use "earliest" or JSON'
            )
        if ending.kind == "earliest" or any(p.offset == EARLIEST for _, p in ending.positions):
            raise OptionError('endingOffsets cannot be "earliest" (-2): use "latest" or offsets')
        for spec, display in ((starting, "startingOffsets"), (ending, "endingOffsets")):
            if spec.kind != "specific":
                continue
            for tp, _ in spec.positions:
                outside = (topics and tp.topic not in topics) or (
                    assignment and tp not in assignment
                )
                if outside:
                    raise OptionError(
                        f"option {display} names {tp}, which the query does not read "
                        f"(subscribe / assign)"
                    )
        return cls(
            bootstrap_servers=servers,
            topics=topics,
            assignment=assignment,
            starting=starting,
            ending=ending,
            fail_on_data_loss=_bool(opts, "failondataloss", True),
            max_offsets_per_trigger=_int_option(opts, "maxoffsetspertrigger"),
            min_partitions=_int_option(opts, "minpartitions"),
            include_headers=_bool(opts, "includeheaders", False),
            poll_timeout_ms=_int_option(opts, "kafkaconsumer.polltimeoutms")
            or DEFAULT_POLL_TIMEOUT_MS,
        )


@dataclass(frozen=True)
class SinkOptions:
    """Validated sink options (picklable)."""

    bootstrap_servers: str
    topic: str | None = None
    linger_ms: int = 5
    batch_size: int = 16384
    compression_type: str = "none"
    delivery_timeout_ms: int = 120_000

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> SinkOptions:
        opts = _lower(options)
        _reject_unknown(opts, SINK_OPTIONS, "sink")
        compression = opts.get("kafka.compression.type", "none").lower()
        if compression not in ("none", "gzip", "snappy", "lz4", "zstd"):
            raise OptionError(
                f"option kafka.compression.type must be none, gzip, snappy, lz4 or zstd, "
                f"not {compression!r}"
            )
        topic = opts.get("topic", "").strip() or None
        linger = _int_option(opts, "kafka.linger.ms", minimum=0)
        return cls(
            bootstrap_servers=_bootstrap(opts),
            topic=topic,
            linger_ms=5 if linger is None else linger,
            batch_size=_int_option(opts, "kafka.batch.size") or 16384,
            compression_type=compression,
            delivery_timeout_ms=_int_option(opts, "kafka.delivery.timeout.ms") or 120_000,
        )


__all__ = ["EARLIEST", "LATEST", "OffsetSpec", "OptionError", "SinkOptions", "SourceOptions"]
