"""The `minibroker` CLI as a user runs it: `minibroker dev` in the foreground, topic
commands, `seq 1 1000 | minibroker produce`, `minibroker consume`, Ctrl-C.

The CLI runs as `python -m client.cli` (the console script `minibroker` is the same
`client.cli:main`); the servers are whatever `python -m controller` / `python -m
broker` are."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster import CLI
from cluster import CLI_ENV as ENV
from cluster import mb
from dev_process import DevProcess
from dev_process import free_base_port
from dev_process import pids_mentioning
from dev_process import running_dev
from kafka import KafkaConsumer
from kafka import TopicPartition as KTopicPartition

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


@pytest.fixture
def dev(tmp_path: Path) -> Iterator[DevProcess]:
    with running_dev(tmp_path / "data") as process:
        yield process


@pytest.mark.slow
def test_dev_topic_produce_consume_and_ctrl_c(dev: DevProcess) -> None:
    bootstrap = dev.wait_for_bootstrap()
    assert bootstrap == ",".join(f"127.0.0.1:{dev.base_port + 2 * i}" for i in range(3))
    kafka_bootstrap = dev.wait_for_bootstrap("kafka bootstrap: ")
    assert kafka_bootstrap == ",".join(
        f"127.0.0.1:{dev.base_port + 10_000 + 2 * i}" for i in range(3)
    )
    children = pids_mentioning(str(dev.data_dir)) - {dev.proc.pid}
    assert len(children) == 4, dev.output()  # the controller and 3 brokers

    created = mb(
        "topic", "create", "t", "--partitions", "3", "--replication-factor", "1", "-b", bootstrap
    )
    assert created.returncode == 0, created.stderr
    assert "created topic t: 3 partitions, replication factor 1" in created.stdout

    listed = mb("topic", "list", "-b", bootstrap)
    assert listed.returncode == 0, listed.stderr
    assert any(line.split() == ["t", "3", "1"] for line in listed.stdout.splitlines())

    seq = subprocess.run(["seq", "1", "1000"], capture_output=True, text=True, check=True).stdout
    produced = mb("produce", "t", "-b", bootstrap, stdin=seq)
    assert produced.returncode == 0, produced.stderr
    assert "produced 1000 records to t" in produced.stderr

    consumed = mb(
        "consume", "t", "--from-beginning", "-n", "1000", "--timeout-ms", "30000", "-b", bootstrap
    )
    assert consumed.returncode == 0, consumed.stderr
    lines = consumed.stdout.splitlines()
    assert len(lines) == 1000
    assert set(lines) == {str(i) for i in range(1, 1001)}

    # Per partition: offsets 0.. without gaps, values in the order they were produced.
    full = mb(
        "consume",
        "t",
        "--from-beginning",
        "-n",
        "1000",
        "--format",
        "json",
        "--timeout-ms",
        "30000",
        "-b",
        bootstrap,
    )
    assert full.returncode == 0, full.stderr
    records = [json.loads(line) for line in full.stdout.splitlines()]
    by_partition: dict[int, list[dict]] = {}
    for r in records:
        by_partition.setdefault(r["partition"], []).append(r)
    assert sum(len(v) for v in by_partition.values()) == 1000
    for rs in by_partition.values():
        assert [r["offset"] for r in rs] == list(range(len(rs)))
        values = [int(r["value"]) for r in rs]
        assert values == sorted(values)
        assert all(r["leader_epoch"] >= 0 for r in rs)

    # A Kafka client reads the same records through the Kafka listeners.
    kafka_consumer = KafkaConsumer(
        bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=10_000
    )
    try:
        kafka_consumer.assign([KTopicPartition("t", p) for p in range(3)])
        through_kafka = [m.value.decode() for m in itertools.islice(kafka_consumer, 1000)]
    finally:
        kafka_consumer.close()
    assert sorted(through_kafka) == sorted(str(i) for i in range(1, 1001))

    described = mb("topic", "describe", "t", "-b", bootstrap)
    assert described.returncode == 0, described.stderr
    rows = [line.split() for line in described.stdout.splitlines() if line[:1].isdigit()]
    assert [int(r[0]) for r in rows] == [0, 1, 2]
    # PARTITION LEADER EPOCH REPLICAS ISR LOG-START-OFFSET HIGH-WATERMARK
    assert sum(int(r[-1]) for r in rows) == 1000
    assert {int(r[-1]) for r in rows} == {len(v) for v in by_partition.values()} | (
        {0} if len(by_partition) < 3 else set()
    )

    code = dev.stop(signal.SIGINT)
    assert code == 0, dev.output()
    assert "stopped" in dev.output()
    deadline = time.monotonic() + 10
    while pids_mentioning(str(dev.data_dir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pids_mentioning(str(dev.data_dir)), "stray server processes"
    assert (dev.data_dir / "logs" / "controller.log").exists()
    assert (dev.data_dir / "logs" / "broker-3.log").exists()


# ------------------------------------------------------------------ no cluster needed


@pytest.mark.slow
def test_dev_with_a_quorum_of_three_controllers_survives_the_active_ones_death(
    tmp_path: Path,
) -> None:
    """`minibroker dev --controllers 3`: the brokers follow the active controller; when
    it is SIGKILLed, dev says so and runs on, the other two elect a new one, and topics
    are created and records produced and consumed as before."""
    dev = DevProcess(tmp_path / "quorum", 2, "--controllers", "3")
    try:
        bootstrap = dev.wait_for_bootstrap()
        controllers = ",".join(f"127.0.0.1:{dev.base_port + 1 + 2 * i}" for i in range(3))
        assert f"controllers {controllers}" in dev.output()
        status = mb("metadata-quorum", "describe", "--controller", controllers)
        assert status.returncode == 0, status.stderr
        leader = int(status.stdout.split("LeaderId:")[1].split()[0])
        assert "CurrentVoters:  [0,1,2]" in status.stdout
        victims = pids_mentioning(str(dev.data_dir / f"controller-{leader}"))
        assert len(victims) == 1, victims
        os.kill(victims.pop(), signal.SIGKILL)

        deadline = time.monotonic() + 60
        while True:  # through a broker, forwarded to whichever controller is active
            created = mb("topic", "create", "q", "-p", "2", "-r", "2", "-b", bootstrap)
            if created.returncode == 0:
                break
            assert time.monotonic() < deadline, created.stderr
            time.sleep(0.5)
        assert dev.proc.poll() is None, dev.output()
        assert f"controller {leader} exited (killed by SIGKILL); 2 of 3 controllers run on" in (
            "".join(dev.stderr)
        )
        status = mb("metadata-quorum", "describe", "--controller", controllers)
        assert status.returncode == 0, status.stderr
        assert int(status.stdout.split("LeaderId:")[1].split()[0]) != leader
        produced = mb("produce", "q", "-b", bootstrap, stdin="a\nb\nc\n")
        assert produced.returncode == 0, produced.stderr
        consumed = mb(
            "consume", "q", "--from-beginning", "-n", "3", "--timeout-ms", "30000", "-b", bootstrap
        )
        assert sorted(consumed.stdout.split()) == ["a", "b", "c"], consumed.stderr
        # A second shell brings it back: it rejoins as a voter.
        back = mb("dev", "restart", f"c{leader}", "--data-dir", str(dev.data_dir))
        assert back.returncode == 0, back.stderr
        status = mb("dev", "status", "--data-dir", str(dev.data_dir))
        assert status.stdout.count("controller  ") == 3
        assert status.stdout.count("running (pid") == 5, status.stdout
        deadline = time.monotonic() + 30
        while "MaxFollowerLag: 0\n" not in (
            quorum := mb("metadata-quorum", "describe", "--controller", controllers).stdout
        ):  # every follower caught up, the restarted one included
            assert time.monotonic() < deadline, quorum
            time.sleep(0.5)
    finally:
        dev.stop()
    assert "stopped\n" in dev.output()  # all running again, all stopped cleanly


def test_dev_refuses_a_busy_port(tmp_path: Path) -> None:
    base = free_base_port(1)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", base))
        busy.listen()
        result = mb(
            "dev",
            "--data-dir",
            str(tmp_path / "d"),
            "--brokers",
            "1",
            "--base-port",
            str(base),
            timeout=30,
        )
    assert result.returncode == 1
    assert f"port {base}" in result.stderr and "already in use" in result.stderr
    assert "Traceback" not in result.stderr
    assert not pids_mentioning(str(tmp_path / "d"))


def test_dev_reports_a_server_that_dies_at_startup(tmp_path: Path) -> None:
    data = tmp_path / "d"
    data.mkdir()
    (data / "controller").write_text("not a directory")
    result = mb(
        "dev",
        "--data-dir",
        str(data),
        "--brokers",
        "1",
        "--base-port",
        str(free_base_port(1)),
        timeout=60,
    )
    assert result.returncode == 1
    assert "controller exited during startup" in result.stderr
    assert str(data / "logs" / "controller.log") in result.stderr  # where to look
    assert "Traceback" not in result.stderr
    assert not pids_mentioning(str(data))


def test_unreachable_cluster_is_one_clear_line() -> None:
    port = free_base_port(1)
    for args in (["topic", "list"], ["consume", "t"], ["produce", "t"]):
        result = mb(*args, "-b", f"127.0.0.1:{port}", stdin="", timeout=60)
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        err = result.stderr.strip().splitlines()
        assert len(err) == 1, result.stderr
        assert err[0].startswith("error: no broker reachable at 127.0.0.1:")
        assert "minibroker dev" in err[0]


def test_elect_leader_asks_which_election_and_says_so() -> None:
    result = mb("topic", "elect-leader", "t", "-p", "0", "-b", "127.0.0.1:1")
    assert result.returncode == 1
    assert result.stderr.startswith("error: say which election: --preferred"), result.stderr
    assert "--unclean" in result.stderr
    unclean = mb("topic", "elect-leader", "t", "--unclean", "-b", "127.0.0.1:1")
    assert unclean.returncode == 1
    assert "--unclean needs NAME and the leaderless partitions" in unclean.stderr


def test_bootstrap_from_the_environment() -> None:
    port = free_base_port(1)
    result = subprocess.run(
        [*CLI, "topic", "list"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**ENV, "MINIBROKER_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}"},
    )
    assert result.returncode == 1
    assert f"127.0.0.1:{port}" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["dev"],
        ["topic"],
        ["topic", "create"],
        ["topic", "list"],
        ["topic", "describe"],
        ["topic", "delete"],
        ["topic", "elect-leader"],
        ["produce"],
        ["consume"],
        ["cluster"],
    ],
)
def test_help_everywhere(args: list[str]) -> None:
    result = mb(*args, "--help")
    assert result.returncode == 0, result.stderr
    assert "Usage: minibroker" in result.stdout


def test_server_commands_pass_arguments_through() -> None:
    for module in ("controller", "broker"):
        result = mb(module, "--help")
        assert result.returncode == 0, result.stderr
        assert f"python -m {module}" in result.stdout
        assert "--data-dir" in result.stdout


def test_console_script() -> None:
    script = shutil.which("minibroker", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.skip("console script not installed (pip install -e .)")
    result = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0
    assert "topic" in result.stdout and "dev" in result.stdout
