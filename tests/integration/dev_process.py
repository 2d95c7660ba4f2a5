"""`minibroker dev` as a user runs it, in the foreground: a free port range, its
output read as it comes, its stop by signal, and a sweep of its children on the way out
(tests/integration/test_cli.py, test_dev_secure.py)."""

from __future__ import annotations

import os
import queue
import random
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.integration.cluster import CLI
from tests.integration.cluster import CLI_ENV as ENV

REPO = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 90


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_base_port(brokers: int) -> int:
    """A base port whose broker ports (base + 2i), controller port (base + 1) and Kafka
    listener ports (base + 10000 + 2i, `minibroker dev`'s default) are free."""
    for _ in range(200):
        base = random.randrange(20_000, 22_700, 2)  # both ranges below Linux's ephemeral one
        ports = [base + i for i in range(2 * brokers)]
        if all(_port_free(p) and _port_free(p + 10_000) for p in ports):
            return base
    raise RuntimeError("no free port range found")


def pids_mentioning(text: str) -> set[int]:
    """Processes whose command line contains `text` (our children name the data dir)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            status = (entry / "status").read_text()
        except OSError:
            continue
        if text in cmdline and "State:\tZ" not in status:
            found.add(int(entry.name))
    return found


class DevProcess:
    def __init__(self, data_dir: Path, brokers: int, *extra: str) -> None:
        self.data_dir = data_dir
        self.base_port = free_base_port(max(brokers, 3))
        self.proc = subprocess.Popen(
            [
                *CLI,
                "dev",
                "--data-dir",
                str(data_dir),
                "--brokers",
                str(brokers),
                "--base-port",
                str(self.base_port),
                *extra,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=ENV,
            cwd=REPO,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        for stream, sink in ((self.proc.stdout, self.stdout), (self.proc.stderr, self.stderr)):
            threading.Thread(target=self._pump, args=(stream, sink), daemon=True).start()

    def _pump(self, stream, sink: list[str]) -> None:
        for line in stream:
            sink.append(line)
            self.lines.put(line)

    def output(self) -> str:
        return "".join(self.stdout) + "".join(self.stderr)

    def wait_for_bootstrap(self, prefix: str = "bootstrap: ") -> str:
        """The address list `minibroker dev` prints after `prefix` once it is ready."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            if line.startswith(prefix):
                return line[len(prefix) :].strip()
        logs = ""
        for log in sorted((self.data_dir / "logs").glob("*.log")):
            logs += f"\n--- {log.name}\n" + log.read_text(errors="replace")[-3000:]
        pytest.fail(f"`minibroker dev` did not become ready:\n{self.output()}{logs}")

    def stop(self, sig: int = signal.SIGINT, timeout: float = 90) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            for pid in pids_mentioning(str(self.data_dir)):
                os.kill(pid, signal.SIGKILL)
            raise


@contextmanager
def running_dev(data_dir: Path, brokers: int = 3, *extra: str) -> Iterator[DevProcess]:
    """A `minibroker dev` for one test: Ctrl-C at the end, then SIGKILL to any server left."""
    process = DevProcess(data_dir, brokers, *extra)
    try:
        yield process
    finally:
        if process.proc.poll() is None:
            process.proc.send_signal(signal.SIGINT)
            try:
                process.proc.wait(60)
            except subprocess.TimeoutExpired:
                process.proc.kill()
        for pid in pids_mentioning(str(process.data_dir)):
            os.kill(pid, signal.SIGKILL)
