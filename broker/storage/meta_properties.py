"""`meta.properties`: the identity of a broker data directory.

A Java-properties-like text file at the top of the data directory::

    #minibroker: identity of this data directory, do not edit
    version=1
    node.id=3
    cluster.id=7fM2aJ1dQkq6r9Ov0y5x2w

`cluster.id` is absent until the broker learns it. Lines are `key=value`; blank lines
and lines starting with '#' or '!' are comments; unknown keys are ignored; the file
ends with a newline. It is written with `atomic_write`.

A broker configured with a different node id than the file refuses to start: the
directory holds another node's replicas, and serving them under a new identity would
let stale data rejoin the ISR.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from broker.storage.errors import CorruptCheckpointError, StorageError
from broker.storage.fileio import atomic_write

META_PROPERTIES = "meta.properties"
META_VERSION = 1


class MetaProperties(msgspec.Struct, frozen=True):
    cluster_id: str | None
    node_id: int

    @classmethod
    def read(cls, data_dir: Path) -> MetaProperties | None:
        """The file's content, None when it does not exist; CorruptCheckpointError when
        it does not parse."""
        path = Path(data_dir) / META_PROPERTIES
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        return cls.parse(raw, path)

    @classmethod
    def parse(cls, raw: bytes, path: Path) -> MetaProperties:
        def corrupt(problem: str) -> CorruptCheckpointError:
            return CorruptCheckpointError(
                f"corrupt {path}: {problem}; restore it, or move it away if this data "
                "directory may be treated as a new node's"
            )

        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise corrupt(f"not UTF-8 text (byte {exc.start})") from exc
        if not text.endswith("\n"):
            raise corrupt("does not end with a newline (truncated?)")
        values: dict[str, str] = {}
        for number, line in enumerate(text[:-1].split("\n"), start=1):
            stripped = line.strip()
            if not stripped or stripped[0] in "#!":
                continue
            key, sep, value = stripped.partition("=")
            if not sep:
                raise corrupt(f"line {number} is not key=value: {line!r}")
            key = key.strip()
            if key in values:
                raise corrupt(f"line {number} repeats key {key!r}")
            values[key] = value.strip()
        if values.get("version") != str(META_VERSION):
            raise corrupt(f"version is {values.get('version')!r}, expected {META_VERSION}")
        node_text = values.get("node.id", "")
        if not node_text.isascii() or not node_text.isdigit():
            raise corrupt(f"node.id {node_text!r} is not a non-negative integer")
        return cls(cluster_id=values.get("cluster.id") or None, node_id=int(node_text))

    def to_bytes(self) -> bytes:
        lines = [
            "#minibroker: identity of this data directory, do not edit",
            f"version={META_VERSION}",
            f"node.id={self.node_id}",
        ]
        if self.cluster_id is not None:
            lines.append(f"cluster.id={self.cluster_id}")
        return ("\n".join(lines) + "\n").encode("utf-8")

    def write(self, data_dir: Path) -> None:
        if self.node_id < 0:
            raise ValueError(f"node id must be >= 0, got {self.node_id}")
        if self.cluster_id is not None and (
            not self.cluster_id or any(ch.isspace() for ch in self.cluster_id)
        ):
            raise ValueError(f"invalid cluster id {self.cluster_id!r}")
        atomic_write(Path(data_dir) / META_PROPERTIES, self.to_bytes())

    @classmethod
    def check_or_write(
        cls, data_dir: Path, *, node_id: int, cluster_id: str | None = None
    ) -> MetaProperties:
        """Claim `data_dir` for this node: write the file when absent, refuse a file of
        another node or cluster, fill in a cluster id learnt since."""
        existing = cls.read(data_dir)
        path = Path(data_dir) / META_PROPERTIES
        if existing is None:
            meta = cls(cluster_id=cluster_id, node_id=node_id)
            meta.write(data_dir)
            return meta
        if existing.node_id != node_id:
            raise StorageError(
                f"data directory {data_dir} belongs to node {existing.node_id} ({path}), but "
                f"this broker is configured as node {node_id}; start it with node id "
                f"{existing.node_id} or give it its own data directory"
            )
        if cluster_id is not None and existing.cluster_id not in (None, cluster_id):
            raise StorageError(
                f"data directory {data_dir} belongs to cluster {existing.cluster_id!r} "
                f"({path}), not {cluster_id!r}; point the broker at the right controller "
                "or give it its own data directory"
            )
        if cluster_id is not None and existing.cluster_id is None:
            existing = cls(cluster_id=cluster_id, node_id=node_id)
            existing.write(data_dir)
        return existing
