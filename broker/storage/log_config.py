"""LogConfig: the per-topic storage settings of one partition's log.

Its fields are the "log" topic configs of `protocol/topic_configs.py` (one field per
declaration, same default and bounds); the broker's flags (`--segment-bytes`, ...)
give the broker-wide base, and a topic's configs override it
(`LogConfig.from_topic_configs`). The controller validates the same declarations at
CreateTopics, so a config the controller stored is one the broker can apply.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from protocol.invariants import InvariantError
from protocol.topic_configs import FLUSH_MESSAGES
from protocol.topic_configs import FLUSH_MS
from protocol.topic_configs import INDEX_INTERVAL_BYTES
from protocol.topic_configs import LOG_CONFIGS
from protocol.topic_configs import MAX_MESSAGE_BYTES
from protocol.topic_configs import RETENTION_BYTES
from protocol.topic_configs import RETENTION_MS
from protocol.topic_configs import SEGMENT_BYTES
from protocol.topic_configs import SEGMENT_MS


class LogConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Per-topic storage settings; defaults are Kafka's. -1 retention means unlimited;
    None flush settings mean the broker never forces an fsync (replication is the
    durability), as Kafka does by default."""

    segment_bytes: int = SEGMENT_BYTES.default
    segment_ms: int = SEGMENT_MS.default
    index_interval_bytes: int = INDEX_INTERVAL_BYTES.default
    retention_bytes: int = RETENTION_BYTES.default
    retention_ms: int = RETENTION_MS.default
    flush_messages: int | None = FLUSH_MESSAGES.default
    flush_ms: int | None = FLUSH_MS.default
    max_message_bytes: int = MAX_MESSAGE_BYTES.default

    def __post_init__(self) -> None:
        for name, definition in LOG_CONFIGS.items():
            value = getattr(self, definition.field)
            problem = definition.check(value)
            if problem:
                raise ValueError(f"invalid {name} ({definition.field}) {value!r}: {problem}")

    @classmethod
    def from_topic_configs(
        cls, configs: Mapping[str, str], base: LogConfig | None = None
    ) -> LogConfig:
        """`base` overridden by the Kafka-named topic configs it knows; others are ignored
        (they belong to other components). Raises ValueError naming a bad value."""
        base = base if base is not None else cls()
        changes = {
            LOG_CONFIGS[name].field: LOG_CONFIGS[name].parse(raw)
            for name, raw in configs.items()
            if name in LOG_CONFIGS
        }
        return msgspec.structs.replace(base, **changes)


# One field per "log" topic config: a declaration without a field (or the reverse)
# would be accepted by the controller and silently not applied.
if set(LogConfig.__struct_fields__) != {d.field for d in LOG_CONFIGS.values()}:
    raise InvariantError(
        "LogConfig's fields and protocol.topic_configs.LOG_CONFIGS differ: "
        f"{sorted(LogConfig.__struct_fields__)} vs {sorted(LOG_CONFIGS)}"
    )
