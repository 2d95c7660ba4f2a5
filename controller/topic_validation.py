"""Topic names and topic configs, validated the way Kafka validates them.

Configs are Kafka's names with string values, checked against the one table of topic
configs (`protocol/topic_configs.py`) that the brokers' storage applies too. The
controller stores what the user set plus its own defaults for `min.insync.replicas`
and `unclean.leader.election.enable` (they drive its elections and the leaders'
acks=all rule); the storage settings it does not set stay absent so each broker's own
defaults (--retention-ms, --segment-bytes, ...) apply to them.
"""

from __future__ import annotations

import re

from protocol import topic_configs
from protocol.topic_configs import InvalidTopicConfig

MAX_TOPIC_NAME_LENGTH = 249
_LEGAL_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")

MIN_INSYNC_REPLICAS = topic_configs.MIN_INSYNC_REPLICAS.name
UNCLEAN_LEADER_ELECTION = topic_configs.UNCLEAN_LEADER_ELECTION.name

__all__ = [
    "InvalidTopicConfig",
    "InvalidTopicName",
    "collision_key",
    "unclean_election_enabled",
    "validate_topic_configs",
    "validate_topic_name",
]


class InvalidTopicName(ValueError):
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


def collision_key(name: str) -> str | None:
    """The name with '.' as '_' (Kafka's Topic.unifyCollisionChars), or None if it
    has neither: metric names cannot tell '.' from '_', so two topics with the same
    key would share their metrics, and Kafka refuses to create the second."""
    if "." not in name and "_" not in name:
        return None
    return name.replace(".", "_")


def validate_topic_configs(
    configs: dict[str, str],
    *,
    default_min_insync_replicas: int,
    default_unclean_leader_election: bool,
) -> dict[str, str]:
    """The configs to store: normalized values plus the controller's defaults."""
    out = topic_configs.validate_topic_configs(configs)
    out.setdefault(MIN_INSYNC_REPLICAS, str(default_min_insync_replicas))
    out.setdefault(UNCLEAN_LEADER_ELECTION, "true" if default_unclean_leader_election else "false")
    return out


def unclean_election_enabled(configs: dict[str, str]) -> bool:
    return configs.get(UNCLEAN_LEADER_ELECTION, "false").lower() == "true"
