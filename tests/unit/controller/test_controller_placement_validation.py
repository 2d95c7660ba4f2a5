"""Replica placement and topic name / config validation."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from controller.replica_placement import PlacementError
from controller.replica_placement import assign_replicas
from controller.topic_validation import InvalidTopicConfig
from controller.topic_validation import InvalidTopicName
from controller.topic_validation import validate_topic_configs
from controller.topic_validation import validate_topic_name


def test_kafka_round_robin_layout() -> None:
    # Kafka's documented example shape: 5 brokers, start 0, shift 0.
    got = assign_replicas(10, 3, [0, 1, 2, 3, 4], start_index=0, first_shift=0)
    assert got[:5] == [[0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 0], [4, 0, 1]]
    # After n partitions the follower shift grows by one.
    assert got[5:] == [[0, 2, 3], [1, 3, 4], [2, 4, 0], [3, 0, 1], [4, 1, 2]]


@pytest.mark.parametrize("brokers", [[1], [1, 2], [3, 1, 2], [5, 9, 7, 11]])
@pytest.mark.parametrize("rf", [1, 2, 3])
def test_placement_is_valid_and_balanced(brokers: list[int], rf: int) -> None:
    if rf > len(brokers):
        with pytest.raises(PlacementError, match="replication factor"):
            assign_replicas(4, rf, brokers)
        return
    parts = 6 * len(brokers)
    got = assign_replicas(parts, rf, brokers, rng=random.Random(1))
    assert len(got) == parts
    for replicas in got:
        assert len(replicas) == rf == len(set(replicas))
        assert set(replicas) <= set(brokers)
    leaders = Counter(r[0] for r in got)
    assert set(leaders.values()) == {6}  # leaders spread evenly
    replicas_per_broker = Counter(b for r in got for b in r)
    assert set(replicas_per_broker.values()) == {6 * rf}


def test_placement_random_start_varies() -> None:
    firsts = {assign_replicas(1, 1, [1, 2, 3], rng=random.Random(s))[0][0] for s in range(30)}
    assert firsts == {1, 2, 3}


def test_placement_rejects_bad_counts() -> None:
    with pytest.raises(PlacementError):
        assign_replicas(0, 1, [1])
    with pytest.raises(PlacementError):
        assign_replicas(1, 0, [1])
    with pytest.raises(PlacementError, match="available"):
        assign_replicas(1, 1, [])


@pytest.mark.parametrize("name", ["a", "topic-1", "my_topic.v2", "A" * 249, "..."])
def test_legal_topic_names(name: str) -> None:
    validate_topic_name(name)


@pytest.mark.parametrize("name", ["", ".", "..", "a" * 250, "bad name", "x/y", "é", "a:b"])
def test_illegal_topic_names(name: str) -> None:
    with pytest.raises(InvalidTopicName):
        validate_topic_name(name)


def defaults(configs: dict[str, str]) -> dict[str, str]:
    return validate_topic_configs(
        configs, default_min_insync_replicas=2, default_unclean_leader_election=False
    )


def test_configs_defaults_filled_and_values_normalized() -> None:
    got = defaults({"retention.ms": " 1000 ", "unclean.leader.election.enable": "TRUE"})
    assert got == {
        "retention.ms": "1000",
        "unclean.leader.election.enable": "true",
        "min.insync.replicas": "2",
    }
    assert defaults({}) == {
        "min.insync.replicas": "2",
        "unclean.leader.election.enable": "false",
    }


@pytest.mark.parametrize(
    "configs, message",
    [
        ({"nope": "1"}, "unknown topic config"),
        ({"min.insync.replicas": "0"}, ">= 1"),
        ({"min.insync.replicas": "x"}, "not an integer"),
        ({"unclean.leader.election.enable": "yes"}, "true or false"),
        ({"retention.ms": "-2"}, ">= -1"),
        ({"segment.bytes": "10"}, ">= 14"),
        ({"segment.bytes": str(2**31)}, "32 bits"),
        ({"retention.bytes": str(2**63)}, "64 bits"),
        ({"flush.messages": "0"}, ">= 1"),
    ],
)
def test_bad_configs(configs: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidTopicConfig, match=message):
        defaults(configs)
