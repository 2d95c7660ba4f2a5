"""The health verdict (client/health.py) as a pure function over a cluster description
and topic descriptions, its renderings, and the helpers the CLI leans on."""

from __future__ import annotations

import json

import pytest

from client.admin import BrokerDescription
from client.admin import ClusterDescription
from client.admin import PartitionDescription
from client.admin import TopicDescription
from client.admin import parse_address
from client.admin import parse_addresses
from client.admin import topics_from_metadata
from client.health import BROKERS_DOWN
from client.health import CONTROLLER_UNREACHABLE
from client.health import CONTROLLER_VOTERS_DOWN
from client.health import LEADERLESS_PARTITIONS
from client.health import NO_ACTIVE_CONTROLLER
from client.health import NO_BROKER_REACHABLE
from client.health import NO_CONTROLLER
from client.health import NO_LIVE_BROKERS
from client.health import OFFLINE_LOG_DIRS
from client.health import SOURCE_CONTROLLER
from client.health import SOURCE_NONE
from client.health import STALE_FETCH_MS
from client.health import UNDER_REPLICATED_PARTITIONS
from client.health import OfflineLogDirHealth
from client.health import VoterHealth
from client.health import evaluate_health
from client.health import is_under_replicated
from client.health import quorum_health
from client.health import render_text
from client.health import voter_is_down
from protocol.errors import ErrorCode
from protocol.messages import MetadataPartition
from protocol.messages import MetadataResponse
from protocol.messages import MetadataTopic


def cluster(*fenced: int, ids: tuple[int, ...] = (1, 2, 3), controller: int = 0):
    return ClusterDescription(
        "cid",
        controller,
        [BrokerDescription(i, "127.0.0.1", 9090 + i, None, i in fenced, 10 + i) for i in ids],
        42,
    )


def part(index: int, leader: int, replicas: tuple[int, ...], isr: tuple[int, ...]):
    return PartitionDescription(index, leader, 3, replicas, isr)


def topic(name: str, *partitions: PartitionDescription) -> TopicDescription:
    return TopicDescription(name, f"id-{name}", list(partitions))


HEALTHY_TOPICS = [
    topic("a", part(0, 1, (1, 2, 3), (1, 2, 3)), part(1, 2, (2, 3, 1), (2, 3, 1))),
    topic("b", part(0, 3, (3,), (3,))),
]


def test_a_healthy_cluster() -> None:
    h = evaluate_health(cluster(), HEALTHY_TOPICS)
    assert h.healthy and h.unhealthy_reasons == ()
    assert h.brokers == h.live_brokers == (1, 2, 3)
    assert h.down_brokers == h.fenced_brokers == h.unreachable_brokers == ()
    assert (h.topic_count, h.partition_count) == (2, 3)
    assert h.leaderless_partitions == h.under_replicated_partitions == ()
    assert (h.cluster_id, h.controller_id, h.metadata_offset) == ("cid", 0, 42)
    assert h.controller_reachable is None  # not asked: not a reason either way


def test_a_fenced_broker_is_down() -> None:
    h = evaluate_health(cluster(3), HEALTHY_TOPICS)
    assert not h.healthy and h.unhealthy_reasons == (BROKERS_DOWN,)
    assert h.fenced_brokers == h.down_brokers == (3,)
    assert h.live_brokers == (1, 2) and h.brokers == (1, 2, 3)


def test_an_unreachable_unfenced_broker_is_down() -> None:
    # Killed, but the controller's session timeout has not passed yet.
    h = evaluate_health(cluster(1), HEALTHY_TOPICS, unreachable_brokers=[2, 1, 9])
    assert h.unhealthy_reasons == (BROKERS_DOWN,)
    assert h.unreachable_brokers == (2,)  # 1 is fenced already, 9 is not registered
    assert h.fenced_brokers == (1,) and h.down_brokers == (1, 2)
    assert h.live_brokers == (3,)


def test_a_broker_with_an_offline_log_directory_says_why() -> None:
    # Fenced at its own request after its disk filled (issue 13 item 7).
    offline = OfflineLogDirHealth(3, "/data/broker-3", "log directory /data/broker-3 is offline")
    h = evaluate_health(cluster(3), HEALTHY_TOPICS, offline_log_dirs=[offline])
    assert h.unhealthy_reasons == (BROKERS_DOWN, OFFLINE_LOG_DIRS)
    assert h.to_dict()["offline_log_dirs"] == [offline.to_dict()]
    text = render_text(h)
    assert "Offline log dirs (1):" in text and "[3:/data/broker-3]" in text
    assert "Offline log dir 3:/data/broker-3: log directory /data/broker-3 is offline" in text


def test_leaderless_partitions() -> None:
    # RF=1 led by a fenced broker: no leader, but its ISR still equals its replicas.
    topics = [*HEALTHY_TOPICS, topic("solo", part(0, -1, (3,), (3,)), part(1, 1, (1,), (1,)))]
    h = evaluate_health(cluster(3), topics)
    assert h.unhealthy_reasons == (BROKERS_DOWN, LEADERLESS_PARTITIONS)
    assert [str(p) for p in h.leaderless_partitions] == ["solo-0"]
    assert h.leaderless_partitions[0].leader == -1
    assert h.under_replicated_partitions == ()


def test_under_replicated_partitions() -> None:
    topics = [
        topic("t", part(1, 2, (3, 2, 1), (2, 1)), part(0, 1, (1, 2, 3), (1, 2, 3))),
        topic("all-down", part(0, -1, (1, 2, 3), (3,))),
    ]
    h = evaluate_health(cluster(), topics)
    assert h.unhealthy_reasons == (LEADERLESS_PARTITIONS, UNDER_REPLICATED_PARTITIONS)
    # Sorted by topic, then partition; a partition can be both.
    assert [str(p) for p in h.under_replicated_partitions] == ["all-down-0", "t-1"]
    assert [str(p) for p in h.leaderless_partitions] == ["all-down-0"]
    assert h.under_replicated_partitions[1].isr == (2, 1)


def test_under_replicated_is_isr_smaller_than_replicas() -> None:
    assert is_under_replicated((1, 2, 3), (1, 2))
    assert not is_under_replicated((1, 2, 3), (3, 1, 2))
    assert not is_under_replicated((1,), (1,))


def test_controller_unreachable_and_no_controller() -> None:
    h = evaluate_health(
        cluster(controller=-1),
        HEALTHY_TOPICS,
        controller_address="127.0.0.1:9093",
        controller_reachable=False,
    )
    assert h.unhealthy_reasons == (CONTROLLER_UNREACHABLE, NO_CONTROLLER)
    ok = evaluate_health(
        cluster(),
        HEALTHY_TOPICS,
        source=SOURCE_CONTROLLER,
        controller_address="127.0.0.1:9093",
        controller_reachable=True,
    )
    assert ok.healthy and ok.source == SOURCE_CONTROLLER and ok.controller_reachable


def test_nothing_answered() -> None:
    h = evaluate_health(
        None,
        [],
        brokers_reachable=False,
        controller_reachable=False,
        controller_address="h:1",
        errors=["brokers: refused"],
    )
    assert h.unhealthy_reasons == (NO_BROKER_REACHABLE, CONTROLLER_UNREACHABLE)
    assert h.source == SOURCE_NONE and h.controller_id == -1 and h.brokers == ()
    assert h.errors == ("brokers: refused",)


def test_the_controller_answers_but_no_broker_does() -> None:
    h = evaluate_health(
        cluster(),
        HEALTHY_TOPICS,
        source=SOURCE_CONTROLLER,
        brokers_reachable=False,
        controller_reachable=True,
        unreachable_brokers=[1, 2, 3],
    )
    assert h.unhealthy_reasons == (NO_BROKER_REACHABLE, NO_LIVE_BROKERS, BROKERS_DOWN)
    assert h.unreachable_brokers == (1, 2, 3) and h.live_brokers == ()


def test_every_broker_fenced_or_none_registered() -> None:
    assert evaluate_health(cluster(1, 2, 3), []).unhealthy_reasons == (
        NO_LIVE_BROKERS,
        BROKERS_DOWN,
    )
    assert evaluate_health(cluster(ids=()), []).unhealthy_reasons == (NO_LIVE_BROKERS,)


def test_json_form() -> None:
    topics = [topic("solo", part(0, -1, (3,), (3,))), topic("t", part(0, 1, (1, 3), (1,)))]
    h = evaluate_health(cluster(3), topics, unreachable_brokers=[2])
    d = json.loads(json.dumps(h.to_dict()))
    assert d["healthy"] is False
    assert d["unhealthy_reasons"] == [
        BROKERS_DOWN,
        LEADERLESS_PARTITIONS,
        UNDER_REPLICATED_PARTITIONS,
    ]
    assert d["down_brokers"] == [2, 3] and d["fenced_brokers"] == [3]
    assert d["leaderless_partitions"] == [
        {
            "topic": "solo",
            "partition": 0,
            "leader": -1,
            "leader_epoch": 3,
            "replicas": [3],
            "isr": [3],
        }
    ]
    assert d["under_replicated_partitions"][0]["isr"] == [1]
    assert d["controller_reachable"] is None


def test_state_key_ignores_the_metadata_offset_only() -> None:
    a = evaluate_health(cluster(), HEALTHY_TOPICS)
    moved = evaluate_health(cluster()._replace(metadata_offset=99), HEALTHY_TOPICS)
    assert a.state_key() == moved.state_key()
    assert a.state_key() != evaluate_health(cluster(2), HEALTHY_TOPICS).state_key()


def test_text_form_reads_like_rpk() -> None:
    topics = [topic("solo", part(0, -1, (3,), (3,))), topic("t", part(0, 1, (1, 3), (1,)))]
    text = render_text(
        evaluate_health(
            cluster(3),
            topics,
            source=SOURCE_CONTROLLER,
            controller_address="127.0.0.1:9093",
            controller_reachable=True,
        )
    )
    lines = {line.split(":", 1)[0]: line.split(":", 1)[1].strip() for line in text.splitlines()[2:]}
    assert text.startswith("CLUSTER HEALTH OVERVIEW\n")
    assert lines["Healthy"] == "false"
    assert lines["Unhealthy reasons"] == (
        "[brokers_down leaderless_partitions under_replicated_partitions]"
    )
    assert lines["Controller ID"] == "0"
    assert lines["Controller reachable"] == "true (127.0.0.1:9093)"
    assert lines["All brokers"] == "[1 2 3]"
    assert lines["Brokers down"] == "[3]"
    assert lines["Leaderless partitions (1)"] == "[solo-0]"
    assert lines["Under-replicated partitions (1)"] == "[t-0]"
    unknown = render_text(evaluate_health(cluster(), []))
    assert "Controller reachable:" in unknown and "unknown" in unknown


def voter(node_id: int, *, answered: bool = True, last_fetch: int = 10, leader: int = 0):
    down = voter_is_down(
        answered=answered,
        is_leader=node_id == leader,
        leader_known=leader >= 0,
        last_fetch_ms_ago=last_fetch,
    )
    role = ("leader" if node_id == leader else "follower") if answered else ""
    return VoterHealth(node_id, f"c{node_id}:9093", answered, role, 57, 0, last_fetch, down)


def test_a_voter_is_down_when_silent_or_not_fetching() -> None:
    assert not voter(1).down and not voter(0, last_fetch=0).down
    assert voter(1, answered=False).down  # its own silence, whatever the leader heard
    assert voter(1, last_fetch=STALE_FETCH_MS + 1).down  # answers, but does not fetch
    assert not voter(1, last_fetch=STALE_FETCH_MS).down
    assert voter(1, last_fetch=-1).down  # not one fetch in this epoch
    # No active controller: no one to say who fetches; only silence counts.
    assert not voter(1, last_fetch=-1, leader=-1).down
    assert voter(1, answered=False, leader=-1).down


def test_quorum_reasons() -> None:
    healthy = quorum_health(0, 4, 57, [voter(2), voter(0), voter(1)])
    assert [v.node_id for v in healthy.voters] == [0, 1, 2] and healthy.down_voters == ()
    h = evaluate_health(cluster(), HEALTHY_TOPICS, controller_reachable=True, quorum=healthy)
    assert h.healthy and h.to_dict()["quorum"]["voters"][1]["role"] == "follower"
    one_down = quorum_health(0, 4, 57, [voter(0), voter(1, answered=False), voter(2)])
    h = evaluate_health(cluster(), HEALTHY_TOPICS, controller_reachable=True, quorum=one_down)
    assert h.unhealthy_reasons == (CONTROLLER_VOTERS_DOWN,)
    assert h.to_dict()["quorum"]["down_voters"] == [1]
    leaderless = quorum_health(-1, 4, 57, [voter(n, leader=-1) for n in (0, 1)])
    h = evaluate_health(cluster(), HEALTHY_TOPICS, controller_reachable=True, quorum=leaderless)
    assert h.unhealthy_reasons == (NO_ACTIVE_CONTROLLER,)


def test_quorum_in_the_text_and_the_watch_key() -> None:
    q = quorum_health(0, 4, 57, [voter(0, last_fetch=0), voter(1, answered=False)])
    h = evaluate_health(cluster(), HEALTHY_TOPICS, controller_reachable=True, quorum=q)
    text = render_text(h)
    assert "Quorum leader:" in text and "0 (epoch 4, high watermark 57)" in text
    assert "Quorum voters down:" in text and text.count("Voter ") == 2
    assert "Voter 1 at c1:9093: no answer, DOWN, log end 57, lag 0, last fetch 10 ms ago" in text
    # --watch: fetch times and offsets move every check; the leader and the down set
    # are the change worth a line.
    moved = q._replace(high_watermark=99, voters=(q.voters[0]._replace(last_fetch_ms_ago=7),))
    assert h.state_key() == h._replace(quorum=moved).state_key()
    assert h.state_key() != h._replace(quorum=q._replace(down_voters=())).state_key()
    assert h.state_key() != h._replace(quorum=q._replace(leader_id=1)).state_key()
    unreachable = evaluate_health(cluster(), HEALTHY_TOPICS, controller_reachable=False)
    assert "Quorum leader:" in render_text(unreachable)
    assert "Quorum leader:" not in render_text(evaluate_health(cluster(), HEALTHY_TOPICS))


def test_parse_addresses() -> None:
    assert parse_addresses("a:1, b ,[::1]", 9093) == [("a", 1), ("b", 9093), ("::1", 9093)]
    for bad in ("", " , ", "a:1,b:x", "a:1,::1:5"):
        with pytest.raises(ValueError):
            parse_addresses(bad, 9093)


def test_parse_address() -> None:
    assert parse_address("h:1") == ("h", 1)
    assert parse_address("h", 9093) == ("h", 9093)
    assert parse_address("[::1]", 9093) == ("::1", 9093)
    assert parse_address("[::1]:5") == ("::1", 5)
    for bad in ("h", "h:x", "a:1,b:2", "::1:5", ""):
        with pytest.raises(ValueError):
            parse_address(bad)


def test_topics_from_metadata() -> None:
    response = MetadataResponse(
        topics=[
            MetadataTopic(
                name="z",
                topic_id="idz",
                partitions=[
                    MetadataPartition(
                        partition_index=1, leader_id=-1, replica_nodes=[2], isr_nodes=[2]
                    ),
                    MetadataPartition(
                        partition_index=0,
                        leader_id=1,
                        leader_epoch=4,
                        replica_nodes=[1, 2],
                        isr_nodes=[1],
                    ),
                ],
            ),
            MetadataTopic(name="gone", error_code=int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)),
        ]
    )
    (z,) = topics_from_metadata(response)
    assert (z.name, z.topic_id, z.replication_factor) == ("z", "idz", 2)
    assert [(p.partition, p.leader, p.leader_epoch, p.replicas, p.isr) for p in z.partitions] == [
        (0, 1, 4, (1, 2), (1,)),
        (1, -1, -1, (2,), (2,)),
    ]
