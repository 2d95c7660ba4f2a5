"""Topic names and topic configs, validated the way Kafka validates them.

Configs are Kafka's names with string values. The controller stores what the user
set plus its own defaults for `min.insync.replicas` and
`unclean.leader.election.enable` (they drive its elections and the leaders' acks=all
rule); the storage settings it does not set stay absent so each broker's own
defaults (--retention-ms, --segment-bytes, ...) apply to them.
"""

from __future__ import annotations

import re
from collections.abc import Callable

MAX_TOPIC_NAME_LENGTH = 249
_LEGAL_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")

MIN_INSYNC_REPLICAS = "min.insync.replicas"
UNCLEAN_LEADER_ELECTION = "unclean.leader.election.enable"


class InvalidTopicName(ValueError):
    pass


class InvalidTopicConfig(ValueError):
    pass


def validate_topic_name(name: str) -> None:
    if not name:
        raise InvalidTopicName("topic name is empty")
    if name in (".", ".."):
        raise InvalidTopicName(f"topic name cannot be {name!r}")
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise InvalidTopicName(
            f"topic name is {len(name)} characters long, the limit is {MAX_TOPIC_NAME_LENGTH}"
        )
    if not _LEGAL_NAME.match(name):
        raise InvalidTopicName(
            f"topic name {name!r} is illegal: use only ASCII letters, digits, '.', '_' and '-'"
        )


def _long(minimum: int) -> Callable[[str, str], str]:
    def check(key: str, value: str) -> str:
        try:
            number = int(value.strip())
        except ValueError:
            raise InvalidTopicConfig(f"{key}={value!r} is not an integer") from None
        if number < minimum:
            raise InvalidTopicConfig(f"{key}={number} must be >= {minimum}")
        if number >= 2**63:
            raise InvalidTopicConfig(f"{key}={number} does not fit in 64 bits")
        return str(number)

    return check


def _int(minimum: int) -> Callable[[str, str], str]:
    as_long = _long(minimum)

    def check(key: str, value: str) -> str:
        text = as_long(key, value)
        if int(text) >= 2**31:
            raise InvalidTopicConfig(f"{key}={text} does not fit in 32 bits")
        return text

    return check


def _boolean(key: str, value: str) -> str:
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise InvalidTopicConfig(f"{key}={value!r} must be true or false")
    return lowered


# Kafka's names and lower bounds.
TOPIC_CONFIGS: dict[str, Callable[[str, str], str]] = {
    MIN_INSYNC_REPLICAS: _int(1),
    UNCLEAN_LEADER_ELECTION: _boolean,
    "retention.ms": _long(-1),
    "retention.bytes": _long(-1),
    "segment.bytes": _int(14),
    "segment.ms": _long(1),
    "max.message.bytes": _int(0),
    "flush.messages": _long(1),
    "flush.ms": _long(0),
}


def validate_topic_configs(
    configs: dict[str, str],
    *,
    default_min_insync_replicas: int,
    default_unclean_leader_election: bool,
) -> dict[str, str]:
    """The configs to store: normalized values plus the controller's defaults."""
    out: dict[str, str] = {}
    for key, value in configs.items():
        check = TOPIC_CONFIGS.get(key)
        if check is None:
            raise InvalidTopicConfig(
                f"unknown topic config {key!r}; supported: {', '.join(sorted(TOPIC_CONFIGS))}"
            )
        if not isinstance(value, str):
            raise InvalidTopicConfig(f"{key} must be a string value")
        out[key] = check(key, value)
    out.setdefault(MIN_INSYNC_REPLICAS, str(default_min_insync_replicas))
    out.setdefault(UNCLEAN_LEADER_ELECTION, "true" if default_unclean_leader_election else "false")
    return out


def unclean_election_enabled(configs: dict[str, str]) -> bool:
    return configs.get(UNCLEAN_LEADER_ELECTION, "false").lower() == "true"
