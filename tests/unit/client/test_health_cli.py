"""The operations commands with the admin scripted: `cluster health` (exit codes,
JSON, --watch / --exit-when-healthy / --timeout), `topic describe` status and
filters, `debug replica-log` output and argument checks."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from client_fakes import REPLICA_LOG_NUMBERS

from client.admin import AsyncAdmin
from client.admin import BrokerDescription
from client.admin import ClusterDescription
from client.admin import EpochEntry
from client.admin import PartitionDescription
from client.admin import ReplicaBatch
from client.admin import ReplicaLogDescription
from client.admin import TopicDescription
from client.cli import cli
from client.health import REASONS
from client.health import STALE_FETCH_MS
from client.health import ClusterHealth
from client.health import evaluate_health

CLUSTER = ClusterDescription("cid", 0, [BrokerDescription(i, "h", i) for i in (1, 2, 3)], 5)
FENCED = CLUSTER._replace(brokers=[b._replace(is_fenced=b.node_id == 3) for b in CLUSTER.brokers])
TOPICS = [
    TopicDescription(
        "t",
        "id-t",
        [
            PartitionDescription(
                0, 1, 2, (1, 2, 3), (1, 2, 3), log_start_offset=0, high_watermark=7
            ),
            PartitionDescription(
                1, 2, 2, (2, 3, 1), (2, 1), (3,), log_start_offset=0, high_watermark=8
            ),
        ],
    ),
    TopicDescription(
        "solo",
        "id-solo",
        [
            PartitionDescription(0, -1, 1, (3,), (3,), error="LEADER_NOT_AVAILABLE"),
            PartitionDescription(1, 1, 0, (1,), (1,), log_start_offset=0, high_watermark=3),
        ],
    ),
    TopicDescription("fine", "id-fine", [PartitionDescription(0, 1, 0, (1,), (1,))]),
]
HEALTHY = evaluate_health(CLUSTER, [TOPICS[2]])
UNHEALTHY = evaluate_health(FENCED, TOPICS)


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[ClusterHealth]]:
    """Reports `cluster_health` returns in turn (the last one repeats)."""
    reports: list[ClusterHealth] = []

    async def cluster_health(self: AsyncAdmin, **_kwargs: object) -> ClusterHealth:
        return reports.pop(0) if len(reports) > 1 else reports[0]

    monkeypatch.setattr(AsyncAdmin, "cluster_health", cluster_health)
    yield reports


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_health_exit_codes(script: list[ClusterHealth]) -> None:
    script.append(HEALTHY)
    ok = invoke("cluster", "health")
    assert ok.exit_code == 0, ok.output
    assert "Healthy:" in ok.output and "true" in ok.output
    script[:] = [UNHEALTHY]
    bad = invoke("cluster", "health")
    assert bad.exit_code == 1
    assert "[brokers_down leaderless_partitions under_replicated_partitions]" in bad.output
    assert "[solo-0]" in bad.output and "[t-1]" in bad.output


def test_health_json(script: list[ClusterHealth]) -> None:
    script.append(UNHEALTHY)
    result = invoke("cluster", "health", "--json")
    assert result.exit_code == 1
    report = json.loads(result.output)
    assert report["healthy"] is False and report["fenced_brokers"] == [3]
    assert [p["topic"] for p in report["leaderless_partitions"]] == ["solo"]


def test_exit_when_healthy_prints_each_change_once(script: list[ClusterHealth]) -> None:
    script[:] = [UNHEALTHY, UNHEALTHY, UNHEALTHY, HEALTHY]
    result = invoke("cluster", "health", "--exit-when-healthy", "--interval", "0.05")
    assert result.exit_code == 0, result.output
    assert result.output.count("CLUSTER HEALTH OVERVIEW") == 2
    assert not script[1:]  # every scripted report was consumed


def test_watch_gives_up_at_the_timeout(script: list[ClusterHealth]) -> None:
    script.append(UNHEALTHY)
    result = invoke("cluster", "health", "-e", "--json", "--timeout", "0.3", "--interval", "0.05")
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert len(lines) == 1  # JSON Lines: one object per change
    assert json.loads(lines[0])["healthy"] is False and "time" in json.loads(lines[0])


def test_health_checks_the_controller_addresses() -> None:
    for value, why in [
        ("h:x", "bad address 'h:x': port must be a number"),
        ("a:1,h:x", "bad address 'h:x': port must be a number"),
        ("a:1,::1:5", "write an IPv6 address as [HOST]:PORT"),
        (",", "expected HOST:PORT[,HOST:PORT...], got ','"),
        ("a:70000", "bad address 'a:70000': expected HOST:PORT"),
    ]:
        result = CliRunner().invoke(cli, ["cluster", "health", "--controller", value])
        assert result.exit_code == 2, value
        assert "Invalid value for '--controller'" in result.output and why in result.output


def test_health_help_names_every_reason() -> None:
    text = invoke("cluster", "health", "--help").output
    for reason in REASONS:
        assert f"  {reason}  " in text, reason
    assert f"for {STALE_FETCH_MS // 1000} s" in text  # the bound the code applies
    assert "HOST:PORT[,HOST:PORT...]" in text


def test_health_passes_the_controller(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[object] = []

    async def cluster_health(self: AsyncAdmin, **kwargs: object) -> ClusterHealth:
        seen.append(kwargs)
        return HEALTHY

    monkeypatch.setattr(AsyncAdmin, "cluster_health", cluster_health)
    monkeypatch.setenv("MINIBROKER_CONTROLLER", "c:9")
    assert invoke("cluster", "health", "--no-probe").exit_code == 0
    assert invoke("cluster", "health", "--controller", "d,e:7").exit_code == 0
    assert seen[0] == {"controller": [("c", 9)], "probe_brokers": False, "probe_timeout_ms": 3000}
    assert seen[1]["controller"] == [("d", 9093), ("e", 7)]  # type: ignore[index]


# ------------------------------------------------------------------ topic describe


@pytest.fixture
def topics(monkeypatch: pytest.MonkeyPatch) -> None:
    async def start(self: AsyncAdmin) -> None:
        self._started = True

    async def describe_topics(self: AsyncAdmin, names=None, **_kw) -> list[TopicDescription]:
        return [t for t in TOPICS if names is None or t.name in names]

    monkeypatch.setattr(AsyncAdmin, "start", start)
    monkeypatch.setattr(AsyncAdmin, "describe_topics", describe_topics)


def rows(output: str) -> list[list[str]]:
    return [line.split() for line in output.splitlines() if line[:1].isdigit()]


def test_describe_marks_under_replicated_and_leaderless(topics: None) -> None:
    result = invoke("topic", "describe")
    assert result.exit_code == 0, result.output
    assert "STATUS" in result.output
    assert "t  (2 partitions, replication factor 3, id id-t, 1 under-replicated)" in result.output
    assert "solo  (2 partitions, replication factor 1, id id-solo, 1 leaderless)" in result.output
    statuses = rows(result.output)
    # PARTITION LEADER EPOCH REPLICAS ISR OFFLINE STATUS LOG-START-OFFSET HIGH-WATERMARK
    assert ["1", "2", "2", "[2", "3", "1]", "[2", "1]", "[3]", "under-replicated", "0", "8"] in (
        statuses
    )
    assert [
        *("0", "none", "1", "[3]", "[3]", "-", "leaderless", "-", "-", "LEADER_NOT_AVAILABLE")
    ] in statuses


def test_describe_filters(topics: None) -> None:
    under = invoke("topic", "describe", "--under-replicated")
    assert under.exit_code == 0
    assert [(r[0], r[-3]) for r in rows(under.output)] == [("1", "under-replicated")]
    assert "solo" not in under.output and "fine" not in under.output
    unavailable = invoke("topic", "describe", "--unavailable-partitions")
    assert [r[6] for r in rows(unavailable.output)] == ["leaderless"]
    both = invoke("topic", "describe", "--unavailable", "--under-replicated-partitions")
    assert len(rows(both.output)) == 2
    none = invoke("topic", "describe", "fine", "--under-replicated")
    assert none.exit_code == 0 and none.stdout == ""
    assert "no under-replicated partitions" in none.output


# ------------------------------------------------------------------ debug replica-log

REPLICA = ReplicaLogDescription(
    broker_id=2,
    host="h",
    port=9094,
    topic="t",
    partition=0,
    **REPLICA_LOG_NUMBERS,
    isr=(1, 2),
    epoch_entries=(EpochEntry(0, 0), EpochEntry(2, 3)),
    batches=(ReplicaBatch(0, 2, 0, 0xDEADBEEF, 90), ReplicaBatch(3, 5, 2, 7, 91)),
)


@pytest.fixture
def replica(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    calls: list[tuple] = []

    async def start(self: AsyncAdmin) -> None:
        self._started = True

    async def describe_replica_log(self: AsyncAdmin, broker, topic, partition, **kw):
        calls.append((broker, topic, partition, kw))
        return REPLICA

    monkeypatch.setattr(AsyncAdmin, "start", start)
    monkeypatch.setattr(AsyncAdmin, "describe_replica_log", describe_replica_log)
    return calls


def test_replica_log_text(replica: list[tuple]) -> None:
    result = invoke("debug", "replica-log", "t", "0", "--broker", "2")
    assert result.exit_code == 0, result.output
    assert replica == [(2, "t", 0, {"include_batches": True, "max_batches": 100_000})]
    out = result.output
    assert "replica of t-0 on broker 2 at h:9094" in out
    assert "log end offset:    6" in out and "high watermark:    5" in out
    assert "leader:            1 (leader epoch 2, partition epoch 4)" in out
    assert "ISR:               [1 2]" in out
    assert "leader-epoch cache (2 entries):" in out
    assert "batches (2):" in out
    assert ["0", "2", "0", "deadbeef", "90"] in rows(out)
    assert ["2", "3"] in rows(out)  # epoch cache row


def test_replica_log_json_and_address(replica: list[tuple]) -> None:
    result = invoke("debug", "replica-log", "t", "0", "--at", "h:9094", "--json", "--no-batches")
    assert result.exit_code == 0, result.output
    assert replica[0][0] == "h:9094" and replica[0][3]["include_batches"] is False
    d = json.loads(result.output)
    assert d["log_end_offset"] == 6 and d["isr"] == [1, 2]
    assert d["batches"][0] == {
        "base_offset": 0,
        "last_offset": 2,
        "leader_epoch": 0,
        "crc": 0xDEADBEEF,
        "size": 90,
    }


def test_replica_log_needs_one_target() -> None:
    for extra in ([], ["--broker", "1", "--at", "h:1"]):
        result = CliRunner().invoke(cli, ["debug", "replica-log", "t", "0", *extra])
        assert result.exit_code == 2
        assert "exactly one of --broker ID and --at HOST:PORT" in result.output
    bad = CliRunner().invoke(cli, ["debug", "replica-log", "t", "0", "--at", "h"])
    assert bad.exit_code == 2 and "HOST:PORT" in bad.output
