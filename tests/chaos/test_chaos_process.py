"""Chaos runs on local processes (no Docker): workload + nemesis + checker end to end.

- `test_process_run_compound` (marker chaos_process, ~30 s): RF=3,
  min.insync.replicas=2, acks=all, idempotent producers with 16 records in flight each
  and short timeouts, and overlapping faults (up to 3 at once): pauses of brokers and
  of the controller, SIGKILL of brokers, leaders and the controller, guarded wiped
  disks. No acknowledged write lost, nothing written twice, no offset with two values,
  consumers monotonic and without skips, replicas identical below the high watermark;
  and the instrument did see what it claims to test (overlapping faults, indeterminate
  sends).
- `test_process_run_with_librdkafka_clients` (~30 s): the compound run with
  confluent-kafka's producers and consumers through the brokers' Kafka listeners.
- `test_process_run_with_a_consumer_group` (~30 s): the compound run with the
  consumers as members of one group (issue 16): no partition delivered to two members
  of one generation, and everything acknowledged read by the group.
- `test_process_run_with_a_controller_quorum` (~30 s): the compound run with a quorum
  of three controllers (issue 17) while the nemesis kills the active controller, kills
  and stalls voters, and kills and pauses brokers: nothing acknowledged lost, and the
  metadata check (no two leaders of one epoch, high watermarks never going back, the
  voters' metadata logs identical below the committed offset, nothing committed lost).
- `test_process_run_on_tls` (~20 s): the compound run with every listener on TLS and
  TLS between the servers and from the clients (issue 18): the same guarantees.
- `test_process_run_secure` (~20 s): the compound run with SASL_SSL (SCRAM) on every
  listener and between the servers, the authorizer on and the workload a user with ACLs
  on its topic and group (issue 18): the same guarantees.
- `test_process_run_unclean_divergence` (~25 s): RF=3, min.insync.replicas=1, unclean
  election on, the `diverge` fault: a leader alone takes writes, dies, an out-of-sync
  follower leads a new lineage. Acknowledged writes are lost by design (expected);
  every consumer that read them must be told of the truncation at the right offset.
- `test_process_run_catches_real_loss` (~20 s): RF=1 with wiped disks and producers
  without idempotence: acknowledged writes are lost for real and the checker must find
  them (the run fails); the producers really were non-idempotent.
- `test_process_run_full` (also --chaos-full / MINIBROKER_CHAOS_FULL=1): every fault,
  longer; network partitions are skipped here, with the reason in the history.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from . import presets
from .checker import summary
from .conftest import ChaosOptions
from .history import NEMESIS
from .history import PRODUCER_START
from .history import load
from .runner import RunConfig
from .runner import run_once

pytestmark = [pytest.mark.chaos_process, pytest.mark.timeout(900)]


def assert_clean(result: dict) -> None:
    """Valid with nothing anomalous, everything checked, the workload intact."""
    text = summary(result)
    assert result["anomaly-types"] == [], text
    assert "error" not in result, text
    assert "workload-errors" not in result["run"], result["run"]
    assert result["stats"].get("acknowledged", 0) >= 1000, text
    assert result["stats"].get("records-final", 0) >= result["stats"]["acknowledged"], text
    assert result["valid"] is True, text


def clean_run(cfg: RunConfig, tmp_path: Path, name: str) -> dict:
    """Run `cfg`; it must be clean, with no duplicate even expected (idempotent)."""
    result = run_once(cfg, tmp_path, name=name)
    print(summary(result))
    assert_clean(result)
    assert result["expected"] == {}, summary(result)
    return result


def producer_starts(run_dir: Path) -> list[dict]:
    return [op.extra or {} for op in load(run_dir / "history.jsonl") if op.f == PRODUCER_START]


def test_process_run_compound(tmp_path: Path, chaos_options: ChaosOptions) -> None:
    # Seed 15 draws 3 wiped disks, 2 controller stalls overlapping them (the issue 13
    # data loss), a broker pause and 2 leader kills.
    cfg = presets.compound("process", chaos_options.seed_or(15))
    result = clean_run(cfg, tmp_path, "compound")
    stats = result["stats"]
    # The instrument saw what it claims to test: overlapping faults, pipelined
    # producers, indeterminate sends (no acknowledgement within ack_timeout).
    assert result["run"]["faults-applied"] >= 3, summary(result)
    assert result["run"]["faults-max-concurrent"] >= 2, summary(result)
    assert stats["nemesis-max-concurrent"] >= 2, summary(result)
    assert stats["acknowledged"] >= 5000, summary(result)  # one record in flight made ~2,600
    assert stats.get("send-info", 0) + stats.get("send-pending", 0) >= 1, summary(result)
    assert stats["producer-sessions"] == stats["idempotent-sessions"] >= 2, summary(result)
    assert stats["replicas"]["compared"] and stats["replicas"]["pairs"] == 9, summary(result)


def test_process_run_with_librdkafka_clients(tmp_path: Path, chaos_options: ChaosOptions) -> None:
    """Issue 15: Kafka's own client (librdkafka 2.16) through the Kafka listeners under
    the compound faults: nothing acknowledged lost, nothing written twice."""
    cfg = presets.librdkafka("process", chaos_options.seed_or(15))
    result = clean_run(cfg, tmp_path, "librdkafka")
    stats = result["stats"]
    assert result["run"]["faults-applied"] >= 2, summary(result)
    # Every librdkafka producer session got a producer id (idempotent for real).
    assert stats["producer-sessions"] == stats["idempotent-sessions"] >= 2, summary(result)
    # Every consumer caught up, also one that read past the ends (a late acknowledged
    # retry): it was waited for until the 60 s bound and left out of the unseen check.
    assert len(result["run"]["caught-up"]) == cfg.workload.consumers, result["run"]


def test_process_run_with_a_consumer_group(tmp_path: Path, chaos_options: ChaosOptions) -> None:
    cfg = presets.group("process", chaos_options.seed_or(15))
    result = clean_run(cfg, tmp_path, "group")
    assert result["run"]["faults-applied"] >= 2, summary(result)
    ops = load(tmp_path / "group" / "history.jsonl")
    # The members really shared the partitions: several generations, every member
    # assigned something at some point.
    generations = {(op.extra or {}).get("generation") for op in ops if op.f == "poll"}
    assert len(generations - {None, -1}) >= 2, generations
    assigned = {
        op.process for op in ops if op.f == "seek" and (op.extra or {}).get("why") == "assigned"
    }
    assert len(assigned) >= 2, assigned


def test_process_run_with_a_controller_quorum(tmp_path: Path, chaos_options: ChaosOptions) -> None:
    cfg = presets.quorum("process", chaos_options.seed_or(15))
    result = clean_run(cfg, tmp_path, "quorum")
    quorum = result["stats"]["quorum"]
    assert quorum["compared"] and quorum["voters"] == 3, summary(result)
    # The instrument saw failovers: the active controller killed while the quorum was
    # sampled, and leaders of several epochs.
    ops = load(tmp_path / "quorum" / "history.jsonl")
    killed = [
        op.value
        for op in ops
        if op.process == NEMESIS
        and op.f == "kill-active-controller"
        and op.type == "info"
        and not op.error
    ]
    assert killed, summary(result)
    assert quorum["leader-epochs"] >= 2 and quorum["samples"] >= 20, quorum
    assert quorum["committed"] > 0, quorum


def test_process_run_on_tls(tmp_path: Path, chaos_options: ChaosOptions) -> None:
    # Opt-in since 2026-11-29 (the default run's length): the secure run below has
    # every listener and every server-to-server link on TLS too, with SASL on top.
    chaos_options.require_full(
        "the TLS-only chaos run is opt-in (test_process_run_secure runs the same faults"
        " over TLS with SASL)"
    )
    cfg = presets.tls("process", chaos_options.seed_or(15), time_limit=14.0)
    result = clean_run(cfg, tmp_path, "tls")
    assert result["run"]["faults-applied"] >= 3, summary(result)
    assert result["stats"]["replicas"]["compared"], summary(result)  # DescribeReplicaLog over TLS
    logs = "".join(p.read_text() for p in (tmp_path / "tls" / "logs").glob("*.log"))
    assert logs.count("TLS on PLAINTEXT, KAFKA") >= 3, "every broker's listeners on TLS"
    assert "TLS handshake failed" not in logs


def test_process_run_secure(tmp_path: Path, chaos_options: ChaosOptions) -> None:
    """Issue 18's last line: the chaos run passes with TLS and SASL on between the
    servers, and the authorizer on (the workload a user with ACLs on its topic only)."""
    cfg = presets.secure("process", chaos_options.seed_or(31), time_limit=14.0)  # as tls
    result = clean_run(cfg, tmp_path, "secure")
    assert result["run"]["faults-applied"] >= 3, summary(result)
    assert result["stats"]["replicas"]["compared"], summary(result)  # over SASL_SSL
    assert result["run"]["quorum-samples"] > 0, summary(result)
    logs = "".join(p.read_text() for p in (tmp_path / "secure" / "logs").glob("*.log"))
    assert logs.count("TLS on PLAINTEXT, KAFKA; SASL on PLAINTEXT, KAFKA") >= 3
    assert "on controller: authenticated as chaos-server" in logs  # brokers to controller
    assert "on PLAINTEXT: authenticated as chaos-server" in logs  # follower to leader
    assert "on PLAINTEXT: authenticated as chaos-workload" in logs
    assert "refused:" not in logs, "an ACL refused a server or the workload"
    assert "SASL authentication" not in logs or "failed" not in logs


def test_process_run_unclean_divergence(tmp_path: Path, chaos_options: ChaosOptions) -> None:
    """A divergent unclean election really happens, its losses are expected (not
    failures), and the consumers that read the lost records were told where."""
    cfg = presets.unclean_divergence("process", chaos_options.seed_or(17))
    result = run_once(cfg, tmp_path, name="unclean")
    print(summary(result))
    assert_clean(result)
    ends = [
        op.extra
        for op in load(tmp_path / "unclean" / "history.jsonl")
        if op.process == NEMESIS and op.f == "diverge-end"
    ]
    assert len(ends) == 1, summary(result)
    assert ends[0] is not None and ends[0]["leader-alone"] and ends[0]["new-leader"], ends
    # Divergent: acknowledged writes of the old leader's lineage are gone (expected
    # with unclean election), and consumers were told (checked: no mismatch, none
    # unreported).
    assert result["expected"].get("lost-write", 0) >= 1, summary(result)
    assert result["stats"]["truncations-reported"] >= 1, summary(result)


def test_process_run_catches_real_loss(tmp_path: Path, chaos_options: ChaosOptions) -> None:
    """RF=1 and wiped disks lose acknowledged writes: the run must be invalid, with
    the loss found (and its offsets reused by later writes). The run was told "no
    idempotence" and its producers really were not idempotent: they never got a
    producer id (no InitProducerId)."""
    cfg = presets.known_loss("process", chaos_options.seed_or(13))
    result = run_once(cfg, tmp_path, name="loss")
    print(summary(result))
    assert result["run"]["faults-applied"] >= 1, summary(result)
    assert result["valid"] is False, summary(result)
    assert result["anomalies"]["lost-write"]["count"] > 0, summary(result)
    assert result["anomalies"]["inconsistent-offsets"]["count"] > 0, summary(result)
    run_dir = tmp_path / "loss"
    starts = producer_starts(run_dir)
    assert starts, "no producer-start event recorded"
    assert {(s["enable_idempotence"], s["producer_id"]) for s in starts} == {(False, -1)}, starts
    assert result["stats"]["idempotent-sessions"] == 0
    assert json.loads((run_dir / "config.json").read_text())["workload"]["idempotent"] is False
    # An invalid run keeps what is needed to look into it.
    for name in ("history.jsonl", "results.json", "summary.txt", "replicas.json"):
        assert (run_dir / name).exists(), name
    assert (run_dir / "logs" / "broker-1.log").exists()
    assert (run_dir / "cluster").is_dir()  # data directories kept


def test_process_run_full(tmp_path: Path, chaos_options: ChaosOptions) -> None:
    chaos_options.require_full()
    cfg = presets.full("process", chaos_options.seed_or(21))
    result = run_once(cfg, tmp_path, name="full")
    print(summary(result))
    assert result["run"]["faults-skipped"] == ["partition"]
    assert_clean(result)
