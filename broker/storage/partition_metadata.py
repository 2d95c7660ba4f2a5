"""`partition.metadata`: which topic id a partition directory belongs to.

Kafka's file, in Kafka's format, at the top of each `<topic>-<partition>/`::

    version: 0
    topic_id: 7fM2aJ1dQkq6r9Ov0y5x2w

Written (atomically, fsynced) when the broker first opens the replica for a topic id,
before any record is appended, so a directory with data always names its topic id.
A topic deleted and created again under the same name gets a new id: the id in this
file is what tells the old replica's directory from the new one, so the old data is
never served as the new topic's, and a replica is deleted only by a deletion record
naming exactly this id.

Data directories written before this file existed have none: such a log has no known
topic id, and the broker adopts the id of the partition the metadata assigns to it
under that name (the behaviour of those versions), or sets it aside as stray when the
metadata assigns it nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

from broker.storage.errors import CorruptCheckpointError
from runtime.fileio import atomic_write

PARTITION_METADATA = "partition.metadata"
VERSION = 0
# Kafka's layout; topic ids are printable ASCII without spaces.
_FORMAT = re.compile(
    rb"version: *(?P<version>[0-9]{1,9})\r?\ntopic_id: *(?P<topic_id>[!-~]{1,64})\s*"
)
_TOPIC_ID = re.compile(r"[!-~]{1,64}")


def _valid_topic_id(topic_id: str) -> bool:
    return _TOPIC_ID.fullmatch(topic_id) is not None


def read_topic_id(dir: Path) -> str | None:
    """The topic id recorded in `dir`, None when the file is absent (an older
    version's directory). CorruptCheckpointError when it does not parse."""
    path = Path(dir) / PARTITION_METADATA
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    return parse(raw, path)


def parse(raw: bytes, path: Path) -> str:
    match = _FORMAT.fullmatch(raw)
    if match is None or int(match["version"]) != VERSION:
        problem = (
            f"version {int(match['version'])}, expected {VERSION}"
            if match is not None
            else f"expected 'version: {VERSION}' and 'topic_id: <id>' lines, got {raw[:200]!r}"
        )
        raise CorruptCheckpointError(
            f"corrupt {path}: {problem}; it names the topic id of this replica: restore "
            "it, or move the directory out of the data directory if it is not needed"
        )
    return match["topic_id"].decode("ascii")


def write_topic_id(dir: Path, topic_id: str) -> None:
    if not _valid_topic_id(topic_id):
        raise ValueError(f"invalid topic id {topic_id!r}")
    text = f"version: {VERSION}\ntopic_id: {topic_id}\n"
    atomic_write(Path(dir) / PARTITION_METADATA, text.encode("utf-8"))
