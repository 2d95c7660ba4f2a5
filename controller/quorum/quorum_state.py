"""The quorum state file of one controller: what it must never forget across a crash.

File ``quorum-state`` in the controller's data directory, one JSON object (KRaft keeps
the first three facts in its own ``quorum-state`` file)::

    {"version": 2, "epoch": 5, "voted_for": 2, "leader_id": 2, "held_entries": 1,
     "catching_up": 0, "crc": 3735928559}

- ``epoch``: the highest quorum epoch this voter has seen (never goes back);
- ``voted_for``: the candidate it voted for in that epoch, -1 if none (one vote per
  epoch: the vote is written here before it is granted);
- ``leader_id``: the leader it knows in that epoch, -1 if none;
- ``held_entries`` (version 2): 1 once the voter's metadata log held durable entries
  (written before the first of them is reported to a leader or counted by one), 0
  before that and after a truncation cut the log back to nothing. With 1 and an empty
  log at start, the log was lost: the voter catches up before it votes
  (voting_rights.py);
- ``catching_up`` (version 2): 1 while a voter that started without the right to vote
  (no quorum state, or a lost log) has not caught up with a leader, so that a restart
  does not give it back;
- ``crc``: CRC-32C of the canonical JSON of the other fields (sorted keys, no
  spaces), so that a file damaged on disk is told apart from a valid one.

Version 1 (before ``held_entries`` and ``catching_up``) is read with both 0, the
behaviour of the builds that wrote it; the next change of state is written as
version 2, and a non-empty log marks ``held_entries`` at once.

Replaced atomically on every change (runtime/fileio.py `atomic_write`: temp file,
fsync, rename, fsync the directory): a crash leaves the old state or the new one.
A missing file is a voter that never voted (epoch 0). A file that does not parse,
fails its CRC or has an unknown version is refused: guessing would risk a second vote
in an epoch, so the controller stops and says how to recover.
"""

from __future__ import annotations

import json
from pathlib import Path

import crc32c

from controller.errors import CorruptMetadataError
from controller.quorum.replica import QuorumState
from runtime.fileio import atomic_write
from runtime.fileio import describe_os_error

QUORUM_STATE_FILE = "quorum-state"
VERSION = 2
_FIELDS = {
    1: ("version", "epoch", "voted_for", "leader_id"),
    2: ("version", "epoch", "voted_for", "leader_id", "held_entries", "catching_up"),
}


def _canonical(fields: dict[str, int]) -> bytes:
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


class QuorumStateFile:
    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / QUORUM_STATE_FILE

    def exists(self) -> bool:
        return self.path.exists()

    def read(self) -> QuorumState:
        """The saved state, or the initial one (epoch 0) when there is no file."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return QuorumState()
        except OSError as exc:  # a directory in its place, EIO, EACCES, ...
            raise self._corrupt(f"cannot be read ({describe_os_error(exc)})") from None
        try:
            data = json.loads(raw)
            version = data["version"]
            if version not in _FIELDS:
                versions = " and ".join(str(v) for v in _FIELDS)
                raise self._corrupt(f"has version {version!r}; this build reads {versions}")
            fields = {k: data[k] for k in _FIELDS[version]}
            crc = data["crc"]
            if not all(type(v) is int for v in (*fields.values(), crc)):
                raise ValueError("every field must be an integer")
        except (ValueError, KeyError, TypeError) as exc:
            raise self._corrupt(f"does not parse ({exc})") from None
        if crc32c.crc32c(_canonical(fields)) != crc:
            raise self._corrupt("fails its CRC check")
        if fields["epoch"] < 0:
            raise self._corrupt(f"has a negative epoch {fields['epoch']}")
        for flag in ("held_entries", "catching_up"):
            if fields.get(flag, 0) not in (0, 1):
                raise self._corrupt(f"has {flag} {fields[flag]}, not 0 or 1")
        return QuorumState(
            epoch=fields["epoch"],
            voted_for=fields["voted_for"],
            leader_id=fields["leader_id"],
            held_entries=bool(fields.get("held_entries", 0)),
            catching_up=bool(fields.get("catching_up", 0)),
        )

    def write(self, state: QuorumState) -> None:
        """Durable when it returns (the caller answers a vote only afterwards)."""
        fields = {
            "version": VERSION,
            "epoch": state.epoch,
            "voted_for": state.voted_for,
            "leader_id": state.leader_id,
            "held_entries": int(state.held_entries),
            "catching_up": int(state.catching_up),
        }
        record = dict(fields, crc=crc32c.crc32c(_canonical(fields)))
        atomic_write(self.path, json.dumps(record, sort_keys=True).encode() + b"\n")

    def _corrupt(self, why: str) -> CorruptMetadataError:
        return CorruptMetadataError(
            f"quorum state file {self.path} {why}: it records this controller's votes and "
            "cannot be guessed. Restore it from a backup, or, if this controller's data is "
            "lost, move the data directory away: the controller then rejoins as a voter "
            "without a disk and catches up from the others before it votes again"
        )
