"""`meta.properties` on a broker: the file format lives in runtime/meta_properties.py;
this is the broker's error type and its claim rule.

A broker configured with a different node id than the file refuses to start: the
directory holds another node's replicas, and serving them under a new identity would
let stale data rejoin the ISR.
"""

from __future__ import annotations

from pathlib import Path

from broker.storage.errors import CorruptCheckpointError
from broker.storage.errors import StorageError
from runtime import meta_properties
from runtime.meta_properties import META_PROPERTIES
from runtime.meta_properties import META_VERSION

__all__ = ["META_PROPERTIES", "META_VERSION", "MetaProperties"]


class MetaProperties(meta_properties.MetaProperties, frozen=True):
    @classmethod
    def corrupt(cls, path: Path, problem: str) -> Exception:
        return CorruptCheckpointError(
            f"corrupt {path}: {problem}; restore it, or move it away if this data "
            "directory may be treated as a new node's"
        )

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
