"""`python -m tests.chaos` refuses, before starting anything, options whose runs the
checker could not judge, and says what to do instead (issue 13 item 9c: `--idempotent
--acks 1` was accepted and every run ended "unknown"). No cluster: the command exits 2
before any server starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def chaos_cli(*args: str, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.chaos", "--backend", "process", "--out", str(out), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--idempotent", "--acks", "1"],
            "--idempotent with --acks 1: an idempotent producer needs acks=all",
        ),
        (["--acks", "0"], "--acks 0: no write is ever acknowledged"),
        (["--min-insync", "3", "--rf", "2"], "--min-insync 3 with --rf 2"),
        (["--rf", "4"], "--rf 4: the cluster has 3 brokers"),
        (["--faults", "partition"], "none can be injected by the process backend"),
        (["--faults", "diverge", "--rf", "1", "--min-insync", "1"], "--faults diverge needs"),
        (
            ["--faults", "wipe", "--rf", "1", "--min-insync", "1"],
            "add --unguarded-wipes to wipe anyway",
        ),
        (["--in-flight", "0"], "--in-flight 0: want at least 1"),
        (["--max-concurrent-faults", "0"], "--max-concurrent-faults >= 1"),
    ],
)
def test_options_the_checker_cannot_judge_are_refused(
    tmp_path: Path, args: list[str], message: str
) -> None:
    r = chaos_cli(*args, out=tmp_path / "out")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert message in r.stderr, r.stderr
    assert r.stderr.startswith("error: ")
    assert not (tmp_path / "out").exists()  # nothing ran


def test_idempotence_is_explicit_both_ways() -> None:
    """--idempotent and --no-idempotent both exist; the help says the default."""
    r = subprocess.run(
        [sys.executable, "-m", "tests.chaos", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "--idempotent, --no-idempotent" in r.stdout
    for flag in ("--in-flight", "--ack-timeout", "--max-concurrent-faults", "--unguarded-wipes"):
        assert flag in r.stdout
