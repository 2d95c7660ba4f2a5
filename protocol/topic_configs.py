"""Per-topic configs: each declared once, with Kafka's name, type, default and bounds.

CreateTopics carries configs as Kafka-named strings (`segment.bytes` = "1048576").
The controller checks and normalizes them with `validate_topic_configs` before it
stores them in the metadata log; the broker's storage reads the ones it applies
(`broker/storage/log_config.py`) from the same declarations, so both accept and refuse
the same names and values. A broker or controller setting that gives a topic config
its cluster-wide default (`--segment-bytes`, `--default-min-insync-replicas`) takes
its type, default and bounds from here too (`runtime/settings.py`, `topic_setting`).

Bounds are Kafka's (3.x: `segment.bytes` at least 14, the smallest legacy record;
Kafka 4 raised it to 1 MiB, which small test segments here rely on being below).

Pure data and pure functions (no I/O), like the rest of `protocol/`: the controller,
the broker and the client's CLI all speak these names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
DAY_MS = 24 * 60 * 60 * 1000

TopicConfigType = Literal["int", "long", "boolean"]
TopicConfigValue = int | bool | None


class InvalidTopicConfig(ValueError):
    """A topic config name or value that cannot be used; the message names it and the
    accepted values."""


@dataclass(frozen=True)
class TopicConfigDef:
    """One topic config as Kafka declares it (`LogConfig.configDef` in Kafka)."""

    name: str  # Kafka's name, e.g. "segment.bytes"
    type: TopicConfigType  # int: 32-bit, long: 64-bit, boolean: true/false
    default: TopicConfigValue
    doc: str
    minimum: int | None = None
    # None is a legal value meaning "not set" (flush.*: never force an fsync); Kafka
    # spells it Long.MAX_VALUE, which parses to None.
    nullable: bool = False
    # "log": applied by the broker's storage (LogConfig); "partition": applied by the
    # controller (elections) and the leader (acks=all).
    scope: Literal["log", "partition"] = "log"

    @property
    def field(self) -> str:
        """The attribute name in Python: `segment.bytes` -> `segment_bytes`."""
        return self.name.replace(".", "_")

    @property
    def maximum(self) -> int | None:
        return {"int": INT32_MAX, "long": INT64_MAX}.get(self.type)

    @property
    def valid_values(self) -> str:
        """What is accepted, as the README's topic table and the errors say it."""
        if self.type == "boolean":
            return "true, false"
        return f"[{self.minimum}, {self.maximum}]"

    def parse(self, raw: object) -> TopicConfigValue:
        """The typed value of `raw` (a string as CreateTopics carries it). Raises
        InvalidTopicConfig naming the config, the value and what is accepted."""
        if not isinstance(raw, str):
            raise InvalidTopicConfig(f"{self.name} must be a string value, got {raw!r}")
        text = raw.strip()
        if self.type == "boolean":
            if text.lower() not in ("true", "false"):
                raise InvalidTopicConfig(f"topic config {self.name}={raw!r} must be true or false")
            return text.lower() == "true"
        try:
            number = int(text)
        except ValueError:
            raise InvalidTopicConfig(
                f"topic config {self.name}={raw!r} is not an integer: expected an integer "
                f"in {self.valid_values}"
            ) from None
        problem = self.out_of_range(number)
        if problem:
            raise InvalidTopicConfig(f"topic config {self.name}={raw!r} {problem}")
        if self.nullable and number == INT64_MAX:
            return None
        return number

    def out_of_range(self, number: int) -> str | None:
        """Why `number` is out of bounds (a phrase to follow the value), or None."""
        accepted = f"(values must be in {self.valid_values})"
        if self.minimum is not None and number < self.minimum:
            return f"is out of range: must be >= {self.minimum} {accepted}"
        if self.maximum is not None and number > self.maximum:
            bits = 32 if self.type == "int" else 64
            return f"does not fit in {bits} bits {accepted}"
        return None

    def check(self, value: object) -> str | None:
        """Why a typed value (a LogConfig field, a default) is not legal, or None."""
        if value is None and self.nullable:
            return None
        if self.type == "boolean":
            return None if isinstance(value, bool) else f"{value!r} is not true or false"
        if not isinstance(value, int) or isinstance(value, bool):
            return f"{value!r} is not an integer in {self.valid_values}"
        return self.out_of_range(value)

    def normalize(self, raw: object) -> str:
        """The string stored in the metadata log for `raw`: checked and canonical."""
        value = self.parse(raw)
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(INT64_MAX if value is None else value)


MIN_INSYNC_REPLICAS = TopicConfigDef(
    "min.insync.replicas",
    "int",
    1,
    "With acks=all, the fewest in-sync replicas a write needs; with fewer the leader "
    "refuses it (NOT_ENOUGH_REPLICAS).",
    minimum=1,
    scope="partition",
)
UNCLEAN_LEADER_ELECTION = TopicConfigDef(
    "unclean.leader.election.enable",
    "boolean",
    False,
    "Elect a live replica outside the ISR when no in-sync replica is left; records it "
    "lacks are lost (logged and counted).",
    scope="partition",
)
RETENTION_MS = TopicConfigDef(
    "retention.ms",
    "long",
    7 * DAY_MS,
    "Delete segments older than this; -1 keeps them.",
    minimum=-1,
)
RETENTION_BYTES = TopicConfigDef(
    "retention.bytes",
    "long",
    -1,
    "Delete the oldest segments while a partition is larger than this; -1: no limit.",
    minimum=-1,
)
SEGMENT_BYTES = TopicConfigDef(
    "segment.bytes",
    "int",
    128 * 1024 * 1024,
    "Roll a new segment when the active one reaches this size.",
    minimum=14,
)
SEGMENT_MS = TopicConfigDef(
    "segment.ms",
    "long",
    7 * DAY_MS,
    "Roll a new segment after this age.",
    minimum=1,
)
MAX_MESSAGE_BYTES = TopicConfigDef(
    "max.message.bytes",
    "int",
    1024 * 1024 + 12,
    "Largest record batch accepted.",
    minimum=0,
)
FLUSH_MESSAGES = TopicConfigDef(
    "flush.messages",
    "long",
    None,
    "fsync a partition after this many messages, before acknowledging; unset, durability "
    "comes from replication, as in Kafka.",
    minimum=1,
    nullable=True,
)
FLUSH_MS = TopicConfigDef(
    "flush.ms",
    "long",
    None,
    "fsync a partition with unflushed data this often; unset, never.",
    minimum=0,
    nullable=True,
)
INDEX_INTERVAL_BYTES = TopicConfigDef(
    "index.interval.bytes",
    "int",
    4096,
    "Bytes of records between two entries of a segment's offset and time indexes.",
    minimum=0,
)

# Every topic config this cluster knows, in the order the README lists them.
TOPIC_CONFIGS: Mapping[str, TopicConfigDef] = {
    d.name: d
    for d in (
        MIN_INSYNC_REPLICAS,
        UNCLEAN_LEADER_ELECTION,
        RETENTION_MS,
        RETENTION_BYTES,
        SEGMENT_BYTES,
        SEGMENT_MS,
        MAX_MESSAGE_BYTES,
        FLUSH_MESSAGES,
        FLUSH_MS,
        INDEX_INTERVAL_BYTES,
    )
}
# The ones the broker's storage applies (LogConfig's fields).
LOG_CONFIGS: Mapping[str, TopicConfigDef] = {
    name: d for name, d in TOPIC_CONFIGS.items() if d.scope == "log"
}


def topic_config(name: str) -> TopicConfigDef:
    """The declaration of `name`; InvalidTopicConfig listing the known names if none."""
    definition = TOPIC_CONFIGS.get(name)
    if definition is None:
        raise InvalidTopicConfig(
            f"unknown topic config {name!r}; supported: {', '.join(sorted(TOPIC_CONFIGS))}"
        )
    return definition


def validate_topic_configs(configs: Mapping[str, object]) -> dict[str, str]:
    """The configs of a CreateTopics request, checked and normalized (" 1000 " ->
    "1000", "TRUE" -> "true"). Raises InvalidTopicConfig at the first bad one."""
    return {name: topic_config(name).normalize(raw) for name, raw in configs.items()}
