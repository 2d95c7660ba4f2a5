"""`minibroker dev` as a cluster to try failures on: a second shell's `minibroker dev
status/kill/stop/restart` (client/dev_control.py) against a running `minibroker dev`,
real processes throughout."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster import mb
from dev_process import DevProcess
from dev_process import pids_mentioning
from dev_process import running_dev

pytestmark = pytest.mark.integration

DEADLINE_S = 30


@pytest.fixture
def dev(tmp_path: Path) -> Iterator[DevProcess]:
    with running_dev(tmp_path / "data") as process:
        yield process


def dev_cmd(dev: DevProcess, *args: str):
    return mb("dev", *args, "--data-dir", str(dev.data_dir))


def until(check, what: str):
    deadline = time.monotonic() + DEADLINE_S
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def in_sync(bootstrap: str) -> set[int]:
    """Partition 0's ISR, from `topic describe`'s ISR column ("[3 2 1]")."""
    described = mb("topic", "describe", "t", "-b", bootstrap)
    assert described.returncode == 0, described.stderr
    row = next(line for line in described.stdout.splitlines() if line.startswith("0 "))
    isr = row.split("]", 2)[1].split("[")[1]
    return {int(node) for node in isr.split()}


@pytest.mark.slow
def test_a_killed_broker_leaves_the_others_serving_and_restarts_into_the_isr(
    dev: DevProcess,
) -> None:
    bootstrap = dev.wait_for_bootstrap()
    created = mb(
        "topic", "create", "t", "-p", "1", "-r", "3", "-c", "min.insync.replicas=2",
        "-b", bootstrap,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    produced = mb("produce", "t", "--acks", "all", "-b", bootstrap, stdin="a\nb\n")
    assert produced.returncode == 0, produced.stderr
    assert in_sync(bootstrap) == {1, 2, 3}

    killed = dev_cmd(dev, "kill", "2")
    assert killed.returncode == 0, killed.stderr
    assert killed.stdout.strip() == "broker 2 killed (SIGKILL) on request"
    status = dev_cmd(dev, "status")
    assert status.returncode == 0, status.stderr
    row = next(line for line in status.stdout.splitlines() if line.startswith("2 "))
    assert "stopped on request (killed by SIGKILL)" in row
    assert not pids_mentioning(str(dev.data_dir / "broker-2"))

    until(lambda: in_sync(bootstrap) == {1, 3}, "broker 2 out of the ISR")
    # Two of three in sync is enough for min.insync.replicas=2: acks=all goes on.
    produced = until(
        lambda: (
            (r := mb("produce", "t", "--acks", "all", "-b", bootstrap, stdin="c\nd\n")).returncode
            == 0
            and r
        ),
        "acks=all produce with broker 2 dead",
    )
    assert dev.proc.poll() is None, dev.output()

    again = dev_cmd(dev, "kill", "2")
    assert again.returncode == 1
    assert again.stderr.strip() == (
        "error: broker 2 is not running: `minibroker dev restart 2` starts it"
    )
    restarted = dev_cmd(dev, "restart", "2")
    assert restarted.returncode == 0, restarted.stderr
    assert restarted.stdout.startswith("broker 2 restarted (pid ")
    until(lambda: in_sync(bootstrap) == {1, 2, 3}, "broker 2 back in the ISR")
    consumed = mb(
        "consume", "t", "--from-beginning", "-n", "4", "--timeout-ms", "20000", "-b", bootstrap
    )
    assert sorted(consumed.stdout.split()) == ["a", "b", "c", "d"], consumed.stderr

    # A death not asked for: one line in dev's output, the cluster goes on.
    victim = pids_mentioning(str(dev.data_dir / "broker-3"))
    assert len(victim) == 1
    os.kill(victim.pop(), signal.SIGKILL)
    until(lambda: "broker 3 exited (killed by SIGKILL)" in dev.output(), "the death reported")
    assert "the others keep serving (2 of 3 brokers up)" in dev.output()
    assert dev.proc.poll() is None


def test_bad_control_requests_are_one_line_errors_and_an_unfenced_dead_leader_is_marked(
    dev: DevProcess, tmp_path: Path
) -> None:
    bootstrap = dev.wait_for_bootstrap()
    for args, message in [
        (("kill", "7"), "error: no node '7' in this dev cluster (nodes: c0, 1, 2, 3)"),
        (("stop", "x1"), "error: unknown node name 'x1'"),
    ]:
        result = dev_cmd(dev, *args)
        assert result.returncode == 1
        assert result.stderr.startswith(message), result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    nothing = mb("dev", "status", "--data-dir", str(tmp_path / "none"))
    assert nothing.returncode == 1
    assert nothing.stderr.startswith(f"error: no `minibroker dev` running at {tmp_path / 'none'}")

    created = mb("topic", "create", "solo", "-p", "3", "-r", "1", "-b", bootstrap)
    assert created.returncode == 0, created.stderr
    # With the controller stopped nobody fences broker 2: its leaderships stay its own.
    stopped = dev_cmd(dev, "stop", "c0")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.strip() == "controller stopped on request (exit code 0)"
    assert dev_cmd(dev, "kill", "2").returncode == 0
    described = mb("topic", "describe", "solo", "-b", bootstrap)
    assert described.returncode == 0, described.stderr
    rows = [line for line in described.stdout.splitlines() if line[:1].isdigit()]
    dead_led = [row for row in rows if row.split()[1] == "2"]
    assert len(dead_led) == 1, described.stdout
    assert " leader-unreachable " in dead_led[0]
    assert (
        "leader 2 not answering (Connection refused); the controller has not fenced it yet"
        in (dead_led[0])
    )
    assert "minibroker dev" not in described.stdout  # no hint to start a cluster
    assert all(" ok " in row for row in rows if row not in dead_led)

    restarted = dev_cmd(dev, "restart", "controller-0")
    assert restarted.returncode == 0, restarted.stderr
    assert restarted.stdout.startswith("controller restarted (pid ")

    # The socket is bounded: an oversized or malformed request gets a one-line refusal.
    for request, refusal in [
        (b"x" * 5000 + b"\n", "request over 1024 bytes"),
        (b"not json\n", "request is not a JSON line"),
        (b'{"op": "format"}\n', "unknown operation: use one of status, kill, stop, restart"),
    ]:
        with socket.socket(socket.AF_UNIX) as raw:
            raw.settimeout(10)
            raw.connect(str(dev.data_dir / "dev.sock"))
            raw.sendall(request)
            reply = json.loads(raw.makefile("rb").readline())
        assert reply == {"ok": False, "error": refusal}
