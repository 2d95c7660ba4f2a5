"""The operations commands on a real cluster (tests/integration/cluster.py), run as a
user runs them (`python -m client.cli ...`): `cluster health` while healthy, after a
broker is killed (unreachable at once, fenced after the controller's session
timeout: its RF=1 partitions leaderless, the RF=3 partition under-replicated) and
with the controller down; `topic describe --under-replicated / --unavailable`;
`debug replica-log` on a leader, on a broker without the replica, on the controller;
`cluster health --controller` on a quorum of three controllers: healthy, one voter
SIGKILLed (down, the cluster still works), two (down, then no active controller)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from cluster import Cluster
from cluster import mb

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SESSION_TIMEOUT_MS = 1500
WAIT_S = 30.0


def ok(*args: str, stdin: str | None = None) -> str:
    result = mb(*args, stdin=stdin)
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result.stdout


def health(*args: str) -> tuple[int, dict[str, Any]]:
    result = mb("cluster", "health", "--json", *args)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


def wait_for_health(
    args: tuple[str, ...], until: Callable[[dict[str, Any]], bool]
) -> tuple[int, dict[str, Any]]:
    deadline = time.monotonic() + WAIT_S
    while True:
        code, report = health(*args)
        if until(report):
            return code, report
        assert time.monotonic() < deadline, f"health never got there; last report: {report}"
        time.sleep(0.3)


def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    """partition -> leader, from `topic describe`."""
    out = ok("topic", "describe", topic, "-b", bootstrap)
    return {
        int(r[0]): int(r[1])
        for r in (line.split() for line in out.splitlines())
        if r and r[0].isdigit()
    }


def test_health_describe_and_replica_log_through_a_broker_death(cluster: Cluster) -> None:
    controller = cluster.start_controller(session_timeout_ms=SESSION_TIMEOUT_MS)
    brokers = cluster.start_brokers((1, 2, 3))
    bootstrap = ",".join(f"{b.host}:{b.port}" for b in brokers.values())
    via_broker = ("-b", bootstrap)
    via_controller = ("-b", bootstrap, "--controller", controller.address)

    ok("topic", "create", "solo", "-p", "3", "-r", "1", *via_broker)
    ok("topic", "create", "triple", "-p", "1", "-r", "3", *via_broker)

    # ---- healthy: exit 0, in every form.
    ok("cluster", "health", "--exit-when-healthy", "--timeout", str(WAIT_S), *via_controller)
    code, report = health(*via_controller)
    assert code == 0 and report["healthy"] is True, report
    assert report["unhealthy_reasons"] == []
    assert report["source"] == "controller" and report["controller_reachable"] is True
    assert report["controller_id"] == 0
    # A single controller is a quorum of one, its own leader.
    assert report["quorum"]["leader_id"] == 0 and report["quorum"]["down_voters"] == []
    assert [v["address"] for v in report["quorum"]["voters"]] == [controller.address]
    assert report["brokers"] == report["live_brokers"] == [1, 2, 3]
    assert (report["topic_count"], report["partition_count"]) == (2, 4)
    text = ok("cluster", "health", *via_broker)
    lines = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    assert lines["Healthy"].strip() == "true"
    assert lines["Unhealthy reasons"].strip() == "[]"
    assert lines["All brokers"].strip() == "[1 2 3]"
    assert lines["Controller reachable"].strip().startswith("unknown")

    # ---- debug replica-log on the leader of solo-0, after writing to it.
    solo_leaders = leaders(bootstrap, "solo")
    assert sorted(solo_leaders.values()) == [1, 2, 3]  # round robin: one each
    leader = solo_leaders[0]
    seq = "".join(f"{i}\n" for i in range(20))
    ok("produce", "solo", "-p", "0", *via_broker, stdin=seq)
    replica = json.loads(
        ok("debug", "replica-log", "solo", "0", "--broker", str(leader), "--json", *via_broker)
    )
    assert replica["broker_id"] == leader and replica["leader_id"] == leader
    assert (replica["log_start_offset"], replica["log_end_offset"]) == (0, 20)
    assert replica["high_watermark"] == 20 and replica["isr"] == [leader]
    assert replica["epoch_entries"] == [{"epoch": replica["leader_epoch"], "start_offset": 0}]
    assert replica["batches"][0]["base_offset"] == 0
    assert replica["batches"][-1]["last_offset"] == 19
    assert all(b["size"] > 61 and b["leader_epoch"] == 0 for b in replica["batches"])
    leader_address = f"{brokers[leader].host}:{brokers[leader].port}"
    text = ok("debug", "replica-log", "solo", "0", "--at", leader_address)
    assert f"replica of solo-0 on {leader_address}" in text
    assert "log end offset:    20" in text and "BASE-OFFSET" in text
    other = next(i for i in brokers if i != leader)
    missing = mb("debug", "replica-log", "solo", "0", "--broker", str(other), *via_broker)
    assert missing.returncode == 1
    assert "UNKNOWN_TOPIC_OR_PARTITION" in missing.stderr and "Traceback" not in missing.stderr
    unserved = mb("debug", "replica-log", "solo", "0", "--at", controller.address)
    assert unserved.returncode == 1
    assert "does not serve DescribeReplicaLog" in unserved.stderr
    assert len(unserved.stderr.strip().splitlines()) == 1

    # ---- kill a broker: down at once (the probe), fenced after the session timeout.
    victim = 3
    victim_partition = next(p for p, b in solo_leaders.items() if b == victim)
    brokers[victim].kill()
    code, report = health(*via_broker)
    assert code == 1 and victim in report["down_brokers"], report
    assert "brokers_down" in report["unhealthy_reasons"]

    code, report = wait_for_health(
        via_controller,
        lambda r: (
            victim in r["fenced_brokers"]
            and len(r["leaderless_partitions"]) == 1
            and len(r["under_replicated_partitions"]) == 1
        ),
    )
    assert code == 1
    assert report["unhealthy_reasons"] == [
        "brokers_down",
        "leaderless_partitions",
        "under_replicated_partitions",
    ]
    assert report["live_brokers"] == [1, 2] and report["down_brokers"] == [victim]
    (leaderless,) = report["leaderless_partitions"]
    assert (leaderless["topic"], leaderless["partition"]) == ("solo", victim_partition)
    assert leaderless["leader"] == -1 and leaderless["isr"] == [victim]  # the last ISR member
    (under,) = report["under_replicated_partitions"]
    assert (under["topic"], under["partition"]) == ("triple", 0)
    assert sorted(under["isr"]) == [1, 2] and len(under["replicas"]) == 3
    assert under["leader"] in (1, 2)

    # The brokers' images follow the controller's log: the same verdict through them.
    code, from_broker = wait_for_health(
        via_broker, lambda r: r["fenced_brokers"] == [victim] and r["under_replicated_partitions"]
    )
    assert code == 1 and from_broker["source"] == "broker"
    assert from_broker["leaderless_partitions"] == report["leaderless_partitions"]
    text_result = mb("cluster", "health", *via_controller)
    assert text_result.returncode == 1
    assert f"Leaderless partitions (1):        [solo-{victim_partition}]" in text_result.stdout
    assert "Under-replicated partitions (1):  [triple-0]" in text_result.stdout
    still = mb("cluster", "health", "-e", "--timeout", "1", "--interval", "0.2", *via_broker)
    assert still.returncode == 1 and "timed out after 1 s" in still.stderr

    # ---- describe: the marks and the filters.
    out = ok("topic", "describe", *via_broker)
    assert "triple  (1 partition, replication factor 3" in out and "1 under-replicated" in out
    assert "solo  (3 partitions, replication factor 1" in out and "1 leaderless" in out
    under_rows = [
        line.split()
        for line in ok("topic", "describe", "--under-replicated", *via_broker).splitlines()
    ]
    assert under_rows[0][0] == "triple" and "solo" not in {r[0] for r in under_rows if r}
    assert [r[0] for r in under_rows if r and r[0].isdigit()] == ["0"]
    assert any("under-replicated" in r for r in under_rows)
    unavailable = ok("topic", "describe", "--unavailable", *via_broker).splitlines()
    assert unavailable[0].startswith("solo ")
    rows = [line.split() for line in unavailable if line[:1].isdigit()]
    assert [(int(r[0]), r[1]) for r in rows] == [(victim_partition, "none")]
    assert "leaderless" in rows[0]

    # ---- the controller down: reported unreachable; the brokers still answer.
    controller.kill()
    code, report = health(*via_controller)
    assert code == 1 and report["controller_reachable"] is False, report
    assert report["unhealthy_reasons"][0] == "controller_unreachable"
    assert report["source"] == "broker" and report["quorum"] is None
    assert any(e.startswith(f"controller {controller.address}: ") for e in report["errors"])
    for b in brokers.values():
        b.kill()  # a controlled shutdown would wait for the dead controller


def test_health_on_a_controller_quorum_through_voter_deaths(cluster: Cluster) -> None:
    cluster.start_quorum(3, session_timeout_ms=SESSION_TIMEOUT_MS)
    brokers = cluster.start_brokers((1, 2))
    bootstrap = ",".join(f"{b.host}:{b.port}" for b in brokers.values())
    # Any voter finds the others; all of them are given below, as an operator would.
    via_one = ("-b", bootstrap, "--controller", cluster.quorum[0].address)
    via_all = ("-b", bootstrap, "--controller", str(cluster.controller_bootstrap))

    # ---- healthy: the leader, its epoch, three voters that fetch.
    ok("cluster", "health", "--exit-when-healthy", "--timeout", str(WAIT_S), *via_one)
    code, report = health(*via_one)
    assert code == 0 and report["unhealthy_reasons"] == [], report
    quorum = report["quorum"]
    leader = quorum["leader_id"]
    assert leader in cluster.quorum and quorum["leader_epoch"] >= 1
    assert report["controller_id"] == leader and report["source"] == "controller"
    assert report["controller_address"] == cluster.quorum[leader].address
    assert [(v["node_id"], v["address"]) for v in quorum["voters"]] == [
        (n, p.address) for n, p in sorted(cluster.quorum.items())
    ]
    assert quorum["down_voters"] == [] and all(v["answered"] for v in quorum["voters"])
    assert all(0 <= v["last_fetch_ms_ago"] < 3000 for v in quorum["voters"])

    # ---- one follower SIGKILLed: down at once; the quorum (two of three) still works.
    victim = next(n for n in sorted(cluster.quorum) if n != leader)
    cluster.quorum[victim].kill()
    code, report = health(*via_all)
    assert code == 1 and report["unhealthy_reasons"] == ["controller_voters_down"], report
    assert report["quorum"]["leader_id"] == leader
    assert report["quorum"]["down_voters"] == [victim]
    assert any(e.startswith(f"controller voter {victim} at ") for e in report["errors"])
    ok("topic", "create", "after-one", "-p", "1", "-r", "2", "-b", bootstrap)
    text = mb("cluster", "health", *via_all)
    assert text.returncode == 1
    lines = dict(line.split(":", 1) for line in text.stdout.splitlines() if ":" in line)
    assert lines["Unhealthy reasons"].strip() == "[controller_voters_down]"
    assert lines["Quorum leader"].strip().startswith(f"{leader} (epoch ")
    assert lines["Quorum voters"].strip() == "[0 1 2]"
    assert lines["Quorum voters down"].strip() == f"[{victim}]"
    assert f"Voter {victim} at {cluster.quorum[victim].address}: no answer, DOWN" in text.stdout

    # ---- the other follower too: no majority. Down at once; the leader steps down
    # once it has heard from no majority for the fetch timeout (check-quorum, 1 s).
    second = next(n for n in cluster.quorum if n not in (leader, victim))
    cluster.quorum[second].kill()
    code, report = health(*via_all)
    assert code == 1 and "controller_voters_down" in report["unhealthy_reasons"], report
    assert report["quorum"]["down_voters"] == sorted([victim, second])
    code, report = wait_for_health(
        via_all, lambda r: "no_active_controller" in r["unhealthy_reasons"]
    )
    assert code == 1
    assert report["unhealthy_reasons"][:2] == ["no_active_controller", "controller_voters_down"]
    assert report["quorum"]["leader_id"] == -1 and report["controller_reachable"] is True
    assert report["source"] == "broker"  # no active controller to ask for metadata
    for b in brokers.values():
        b.kill()  # a controlled shutdown would wait for a controller
