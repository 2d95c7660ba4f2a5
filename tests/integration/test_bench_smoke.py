"""The benchmarks run end to end: one produce cell and one raw-fetch consume cell with
--quick against a real cluster, and their JSON holds sane, non-zero figures (no
timed asserts: the numbers depend on the machine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
}


def run_bench(name: str, out: Path, *args: str, written_as: str | None = None) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "bench", name, "--quick", "--out", str(out), *args],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"bench {name} failed:\n{done.stdout}\n{done.stderr}"
    doc = json.loads(out.read_text())
    assert doc["bench"] == (written_as or name) and doc["mode"] == "quick"
    assert doc["machine"]["cores"] >= 1 and doc["machine"]["uvloop"]
    assert doc["machine"]["cpu_probe_ms"] > 0  # the CPU speed the run had
    assert doc["results"], "no result rows"
    return doc


def test_produce_one_cell_writes_sane_json(tmp_path: Path) -> None:
    doc = run_bench(
        "produce",
        tmp_path / "produce.json",
        *("--rf", "1", "--acks", "1", "--record-size", "100", "--batch-size", "16384"),
        *("--producers", "1", "--seconds", "1"),
    )
    (row,) = doc["results"]
    # The bench itself checked that the log holds exactly the records sent.
    assert row["records"] > 0 and row["seconds"] > 0
    assert row["records_per_s"] > 0 and row["mb_per_s"] > 0
    assert row["records_per_s"] == pytest.approx(row["records"] / row["seconds"], rel=0.01)


def test_produce_with_both_clients_in_one_run(tmp_path: Path) -> None:
    """--client minibroker,confluent: librdkafka through the Kafka listeners beside
    minibroker's producer; the bench checks each cell's log holds what was sent."""
    doc = run_bench(
        "produce",
        tmp_path / "produce.json",
        *("--rf", "1", "--acks", "all", "--record-size", "100", "--batch-size", "16384"),
        *("--producers", "1", "--seconds", "1", "--client", "minibroker,confluent"),
    )
    rows = {row["client"]: row for row in doc["results"]}
    assert set(rows) == {"minibroker", "confluent"}
    for row in rows.values():
        assert row["records"] > 0 and row["records_per_s"] > 0


def test_produce_batch_api_cell_writes_sane_json(tmp_path: Path) -> None:
    """--api batch: whole batches through create_batch()/send_batch(); the bench checks
    that the log holds exactly the records sent, as for send()."""
    doc = run_bench(
        "produce",
        tmp_path / "produce-batch.json",
        *("--rf", "1", "--acks", "all", "--record-size", "100", "--batch-size", "16384"),
        *("--producers", "1", "--seconds", "1", "--api", "batch"),
        written_as="produce-batch",
    )
    (row,) = doc["results"]
    assert row["api"] == "batch" and row["records"] > 0 and row["records_per_s"] > 0


def test_consume_raw_cell_writes_sane_json(tmp_path: Path) -> None:
    doc = run_bench(
        "consume",
        tmp_path / "consume.json",
        *("--reader", "raw", "--partitions", "1", "--batch-size", "16384"),
        *("--data-mib", "4", "--seconds", "0.5"),
    )
    (row,) = doc["results"]
    assert row["data_bytes"] >= 4 * 1024 * 1024 - 16384
    assert row["records"] > 0 and row["bytes"] > 0 and row["mb_per_s"] > 0


def test_consume_per_record_readers_read_every_record_once(tmp_path: Path) -> None:
    """poll() and `async for` (the per-record APIs issue 20 measures) read the whole
    4 MiB topic: every record, none twice."""
    doc = run_bench(
        "consume",
        tmp_path / "consume.json",
        *("--reader", "client,iterate", "--partitions", "1", "--batch-size", "16384"),
        *("--data-mib", "4", "--seconds", "30"),
    )
    client, iterate = doc["results"]
    assert (client["reader"], iterate["reader"]) == ("client", "iterate")
    written = client["data_bytes"] // 16384 * (16384 // 108)  # about: batches x records
    assert client["records"] == iterate["records"] > 0.9 * written
    assert client["max_poll_records"] == 500 and iterate["max_poll_records"] is None


def test_consume_with_librdkafka_through_the_kafka_listener(tmp_path: Path) -> None:
    doc = run_bench(
        "consume",
        tmp_path / "consume.json",
        *("--reader", "confluent", "--partitions", "1", "--batch-size", "16384"),
        *("--data-mib", "4", "--seconds", "5"),
    )
    (row,) = doc["results"]
    assert row["reader"] == "confluent"
    # One pass over everything written (4 MiB of 100 B records) within the time.
    assert row["records"] * 100 >= 0.9 * 4 * 1024 * 1024


def test_broker_cpu_writes_leader_and_follower_cost(tmp_path: Path) -> None:
    doc = run_bench(
        "broker-cpu",
        tmp_path / "broker-cpu.json",
        *("--record-size", "100", "--records", "20000", "--repeats", "1"),
    )
    (row,) = doc["results"]
    assert row["records"] >= 30_000  # --quick's count, whole batches
    # Each broker did some work per record; the leader (validation, appends, answers
    # to two followers) more than a follower.
    assert row["follower_us_per_record"] > 0
    assert row["leader_us_per_record"] > row["follower_us_per_record"]


def test_listener_cpu_measures_both_protocols(tmp_path: Path) -> None:
    doc = run_bench("listener-cpu", tmp_path / "listener-cpu.json", "--requests", "100")
    rows = {row["request"]: row for row in doc["results"] if "request" in row}
    assert set(rows) == {"produce", "fetch"}
    for row in rows.values():
        # The broker spent CPU on each request in both protocols.
        assert row["native_us"] > 0 and row["kafka_us"] > 0
        assert row["kafka_over_native"] == pytest.approx(row["kafka_us"] / row["native_us"], 0.05)
    codecs = {row["codec_alone"]: row for row in doc["results"] if "codec_alone" in row}
    assert set(codecs) == {"produce", "fetch"}
    for row in codecs.values():
        # Each codec's decode and encode were timed, and the difference is their sum's.
        times = [row[f"{p}_{op}_us"] for p in ("native", "kafka") for op in ("decode", "encode")]
        assert all(t > 0 for t in times)
        extra = times[2] + times[3] - times[0] - times[1]
        assert row["kafka_extra_us"] == pytest.approx(extra, abs=0.02)


def test_rebalance_times_each_case(tmp_path: Path) -> None:
    doc = run_bench("rebalance", tmp_path / "rebalance.json", "--members", "2", "--partitions", "4")
    rows = {row["case"]: row for row in doc["results"]}
    assert set(rows) == {"join", "leave", "kill", "first generation"}
    for case in ("join", "leave", "kill"):
        assert 0 < rows[case]["median_s"] <= rows[case]["max_s"] < 60
    # A killed member is only noticed once its session (2 s with --quick) expires.
    assert rows["kill"]["median_s"] >= 2.0 > rows["leave"]["median_s"]


def test_controller_failover_kills_the_active_controller(tmp_path: Path) -> None:
    doc = run_bench(
        "failover",
        tmp_path / "failover.json",
        *("--target", "controller", "--rate", "200"),
        *("--session-timeout-ms", "2000"),  # the default 4 s, twice over, is the test's length
    )
    rows = {row["kind"]: row for row in doc["results"]}
    assert set(rows) == {"controller", "leader+controller"}
    assert 0 < rows["controller"]["failover_s"] < 60
    assert rows["controller"]["unavailable_s"] is None  # produce is not measured alone
    # The dead leader broker is fenced only after its session: produce waited for it.
    assert 0 < rows["leader+controller"]["unavailable_s"] < 60
    assert {s["kind"] for s in doc["summary"]} == {"controller", "leader+controller"}


def test_tls_bench_measures_both_listeners_with_both_clients(tmp_path: Path) -> None:
    """Issue 18: the same writes and reads through a PLAINTEXT and an SSL listener of
    one broker, by minibroker's client (native listeners) and by librdkafka (Kafka
    listeners); each carried every byte (the SSL ones over TLS, or they would fail) and
    the broker's CPU per MB of each phase is measured."""
    doc = run_bench("tls", tmp_path / "tls.json")
    rows = {(r["client"], r["direction"]): r for r in doc["results"]}
    assert set(rows) == {
        (client, direction)
        for client in ("minibroker", "librdkafka")
        for direction in ("write", "read")
    }
    for row in rows.values():
        assert row["plaintext_mb_per_s"] > 0 and row["ssl_mb_per_s"] > 0
        assert row["plaintext_broker_cpu_ms_per_mb"] >= 0
        assert row["ssl_broker_cpu_ms_per_mb"] >= 0
        assert row["ssl_over_plaintext"] == pytest.approx(
            row["ssl_mb_per_s"] / row["plaintext_mb_per_s"], rel=0.01
        )


def test_bench_scale_smoke(tmp_path: Path) -> None:
    """bench scale (issue 20 item 5) at one small size: every step ran and measured."""
    doc = run_bench(
        "scale",
        tmp_path / "scale.json",
        "--partitions",
        "6",
        "--idle-seconds",
        "1",
        "--produce-seconds",
        "1",
        "--session-timeout-ms",
        "2000",
    )
    (row,) = doc["results"]
    assert row["partitions"] == 6 and row["led_by_victim"] >= 2  # 6 over 3 brokers
    assert row["produce_mb_s"] > 0 and row["ack_p99_ms"] > 0
    assert row["fds"] >= 6  # at least the log of each replica it holds
    # The killed broker's partitions moved only after the controller fenced it: a session
    # timeout (2 s) after its last heartbeat, which came up to one heartbeat interval
    # (500 ms by default) before the kill.
    assert 2.0 - 0.5 <= row["failover_s"] < 2.0 + 30
    assert row["broker_restart_s"] > 0 and row["isr_back_s"] >= row["broker_restart_s"]
    assert 0 < row["controller_restart_s"] <= row["controller_serving_s"]


def test_latency_with_trace_breaks_every_hop_down(tmp_path: Path) -> None:
    """bench latency --trace: every record reached the consumer, and the sampled ones
    were followed through every hop, the consumer's last (written at the end of the run
    from the offsets it kept) included."""
    doc = run_bench(
        "latency",
        tmp_path / "latency.json",
        *("--rate", "2000", "--seconds", "1.5", "--warmup", "0.5"),
        *("--trace", "--trace-sample", "5"),
    )
    rows = {row["measure"]: row for row in doc["results"]}
    assert rows["end-to-end"]["count"] > 0 and rows["produce ack"]["count"] > 0
    assert 0 < rows["end-to-end"]["p50_ms"] <= rows["end-to-end"]["max_ms"]
    trace = doc["trace"]
    assert "error" not in trace, trace
    assert trace["records"] >= 20  # ~1.5 s x 2,000/s sampled 1 in 5
    segments = trace["groups"]["p45-p55"]["segments_ms"]
    assert segments["consumer decode -> poll returns"] >= 0
    assert all(ms >= 0 for ms in segments.values()), segments


def test_bench_recovery_smoke(tmp_path: Path) -> None:
    """bench recovery reads the broker's own load lines: a change of their wording broke
    it once unnoticed (the clean/unclean words moved out of parentheses)."""
    doc = run_bench("recovery", tmp_path / "recovery.json", "--gib", "0.01")
    shutdowns = [row["shutdown"] for row in doc["results"]]
    assert "unclean" in shutdowns and "clean" in shutdowns, shutdowns
    for row in doc["results"]:
        assert 0 <= row["scan_s"] <= row["to_loaded_s"] <= row["to_serving_s"], row
