"""Users' SCRAM credentials on real processes (issue 18): `minibroker user
create|delete|list` through a broker, stored by the controller in the metadata log.

- create for both mechanisms, list shows each with its iterations;
- the password appears nowhere in the controller's data directory (log or snapshot),
  nor in the answers; the credential on disk checks the password (and no other);
- the credentials survive a restart of the controller and of the broker, replayed
  from a snapshot (--snapshot-every 2) and the log after it;
- delete one mechanism, then the user; errors say which user and why.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.metadata_log import MetadataLog
from protocol.metadata_records import ScramCredentialRecord
from runtime.scram import ScramCredential
from tests.integration.cluster import Cluster
from tests.integration.cluster import mb

pytestmark = pytest.mark.integration

PASSWORD = "correct horse battery staple"


def users(bootstrap: str) -> list[list[str]]:
    listed = mb("-b", bootstrap, "user", "list")
    assert listed.returncode == 0, listed.stderr
    return [line.split() for line in listed.stdout.splitlines()[1:]]


def stored_credentials(data_dir: Path) -> dict[tuple[str, int], ScramCredentialRecord]:
    """What a restart of the controller replays (snapshot, then log), read from a
    copy of its data dir."""
    _, recovered = MetadataLog.open(data_dir)
    records = [*recovered.snapshot_records, *(e.record for e in recovered.entries)]
    out: dict[tuple[str, int], ScramCredentialRecord] = {}
    for r in records:
        if isinstance(r, ScramCredentialRecord):
            out[(r.name, r.mechanism)] = r
    return out


def test_users_are_stored_salted_and_survive_restarts(tmp_path: Path) -> None:
    c = Cluster(tmp_path)
    c.root.mkdir(exist_ok=True)
    try:
        c.start_controller("--snapshot-every", "2")
        c.start_broker(1)
        bootstrap = "{}:{}".format(*c.brokers[1].address)
        for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            created = mb(
                *("-b", bootstrap, "user", "create", "alice"),
                *("--mechanism", mechanism, "--password-stdin"),
                stdin=PASSWORD + "\n",
            )
            assert created.returncode == 0, created.stderr
            assert f"{mechanism} credential set (8192 iterations)" in created.stdout
        assert users(bootstrap) == [
            ["alice", "SCRAM-SHA-256", "8192"],
            ["alice", "SCRAM-SHA-512", "8192"],
        ]
        data = c.root / "controller"
        for path in data.rglob("*"):
            if path.is_file():
                assert PASSWORD.encode() not in path.read_bytes(), path
        c.controller.terminate()  # type: ignore[union-attr]
        stored = stored_credentials(data)
        assert sorted(stored) == [("alice", 1), ("alice", 2)]
        for record in stored.values():
            cred = ScramCredential(
                record.mechanism,
                record.iterations,
                record.salt,
                record.stored_key,
                record.server_key,
            )
            assert cred.matches(PASSWORD) and not cred.matches("wrong")
        c.start_controller("--snapshot-every", "2")
        c.brokers[1].terminate()
        c.start_broker(1)
        assert len(users(bootstrap)) == 2, "kept across restarts"

        deleted = mb("-b", bootstrap, "user", "delete", "alice", "--mechanism", "SCRAM-SHA-256")
        assert deleted.returncode == 0, deleted.stderr
        assert users(bootstrap) == [["alice", "SCRAM-SHA-512", "8192"]]
        assert mb("-b", bootstrap, "user", "delete", "alice").returncode == 0
        assert users(bootstrap) == []

        missing = mb("-b", bootstrap, "user", "delete", "bob", "--mechanism", "SCRAM-SHA-256")
        assert missing.returncode == 1
        assert "bob" in missing.stderr and "no SCRAM-SHA-256 credential" in missing.stderr
        few = mb(
            *("-b", bootstrap, "user", "create", "bob", "--iterations", "100"),
            "--password-stdin",
            stdin="x\n",
        )
        assert few.returncode == 2 and "4096" in few.stderr
        empty = mb("-b", bootstrap, "user", "create", "bob", "--password-stdin", stdin="\n")
        assert empty.returncode == 2 and "password is empty" in empty.stderr
    finally:
        c.stop_all()
