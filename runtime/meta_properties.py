"""`meta.properties`: the identity of a data directory, broker's or controller's.

A Java-properties-like text file at the top of the data directory::

    #minibroker: identity of this data directory, do not edit
    version=1
    node.id=3
    cluster.id=7fM2aJ1dQkq6r9Ov0y5x2w

On a broker `cluster.id` is absent until the broker learns it; a controller writes it
once, when it formats a new cluster, and it never changes (brokers store it and
refuse a controller with another: INCONSISTENT_CLUSTER_ID). Lines are `key=value`;
blank lines and lines starting with '#' or '!' are comments; unknown keys are
ignored; the file ends with a newline. It is written with `atomic_write`.

Each process subclasses `MetaProperties` for its own error type (`corrupt`) and its
own claim rule (the broker's `check_or_write`, the controller's `load_or_create`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Self

import msgspec

from runtime.fileio import atomic_write
from runtime.fileio import text_lines

META_PROPERTIES = "meta.properties"
META_VERSION = 1


class MetaProperties(msgspec.Struct, frozen=True):
    cluster_id: str | None
    node_id: int

    @classmethod
    def corrupt(cls, path: Path, problem: str) -> Exception:
        """The error for an unreadable file; each process raises its own type."""
        return ValueError(f"corrupt {path}: {problem}")

    @classmethod
    def read(cls, data_dir: Path) -> Self | None:
        """The file's content, None when it does not exist; `corrupt(...)` when it does
        not parse. Other OSErrors pass through."""
        path = Path(data_dir) / META_PROPERTIES
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        return cls.parse(raw, path)

    @classmethod
    def parse(cls, raw: bytes, path: Path) -> Self:
        values: dict[str, str] = {}
        lines = text_lines(raw, lambda problem: cls.corrupt(path, problem))
        for number, line in enumerate(lines, start=1):
            stripped = line.strip()
            if not stripped or stripped[0] in "#!":
                continue
            key, sep, value = stripped.partition("=")
            if not sep:
                raise cls.corrupt(path, f"line {number} is not key=value: {line!r}")
            key = key.strip()
            if key in values:
                raise cls.corrupt(path, f"line {number} repeats key {key!r}")
            values[key] = value.strip()
        if values.get("version") != str(META_VERSION):
            raise cls.corrupt(
                path, f"version is {values.get('version')!r}, expected {META_VERSION}"
            )
        node_text = values.get("node.id", "")
        if not node_text.isascii() or not node_text.isdigit():
            raise cls.corrupt(path, f"node.id {node_text!r} is not a non-negative integer")
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
