"""The controller's data directory: its lock and its identity file.

Files in the data directory owned by this module:

``.lock``
    Empty; held with ``flock(LOCK_EX)`` while a controller runs, so two controllers
    never share one directory (runtime/fileio.py `DataDirLock`).

``meta.properties``
    The identity (format in runtime/meta_properties.py), written once when the
    directory is first used, replaced atomically. Its cluster id is generated once
    and never changes: brokers store it and refuse a controller with another
    (INCONSISTENT_CLUSTER_ID).
"""

from __future__ import annotations

import base64
import os
import uuid
from pathlib import Path

from controller.errors import DataDirError
from runtime import fileio
from runtime import meta_properties
from runtime.meta_properties import META_PROPERTIES

__all__ = [
    "META_PROPERTIES",
    "DataDirLock",
    "MetaProperties",
    "load_or_create",
    "new_uuid_string",
    "prepare_data_dir",
]


def new_uuid_string() -> str:
    """A random UUID as Kafka prints it: 22 chars of URL-safe base64, never starting
    with '-' (it would read as a command-line flag)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")
        if not text.startswith("-"):
            return text


class MetaProperties(meta_properties.MetaProperties, frozen=True):
    @classmethod
    def corrupt(cls, path: Path, problem: str) -> Exception:
        return DataDirError(f"{path} is corrupt ({problem}); restore it from a backup")


def _in_use(lock: Path) -> DataDirError:
    return DataDirError(
        f"data dir {lock.parent} is in use by another controller (lock {lock} is "
        "held); stop it or choose another --data-dir"
    )


class DataDirLock(fileio.DataDirLock):
    """Exclusive use of a data directory for the life of the process."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir, _in_use)

    def acquire(self) -> None:
        try:
            super().acquire()
        except OSError as exc:
            raise DataDirError(
                f"cannot lock {self.path}: {exc.strerror}; check the permissions of --data-dir"
            ) from exc


def prepare_data_dir(data_dir: Path) -> None:
    """Create the directory if needed and check that files can be written in it."""
    if data_dir.exists() and not data_dir.is_dir():
        raise DataDirError(f"data dir {data_dir} exists and is not a directory; fix --data-dir")
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataDirError(
            f"cannot create data dir {data_dir}: {exc.strerror}; fix --data-dir or its permissions"
        ) from exc
    if not os.access(data_dir, os.W_OK | os.X_OK):
        raise DataDirError(
            f"data dir {data_dir} is not writable; fix --data-dir or its permissions"
        )


def load_or_create(
    data_dir: Path, node_id: int, *, has_metadata: bool, cluster_id: str = ""
) -> MetaProperties:
    """Read the identity, or create it on a fresh directory.

    `has_metadata` says whether a metadata log or snapshot is present: then a missing
    identity file means damage (a new cluster id would orphan every broker), not a
    first start. `cluster_id` (--cluster-id): what a fresh directory is formatted with
    (one is made up when empty), and what an existing one must hold."""
    path = data_dir / META_PROPERTIES
    try:
        props = MetaProperties.read(data_dir)
    except OSError as exc:
        raise DataDirError(f"cannot read {path}: {exc}; restore it from a backup") from exc
    if props is not None:
        if not props.cluster_id:
            raise DataDirError(f"{path} has no cluster.id; restore it from a backup")
        if props.node_id != node_id:
            raise DataDirError(
                f"{path} belongs to controller {props.node_id}, not {node_id}; "
                "start with --node-id "
                f"{props.node_id} or use another --data-dir"
            )
        if cluster_id and props.cluster_id != cluster_id:
            raise DataDirError(
                f"{path} belongs to cluster {props.cluster_id}, not --cluster-id {cluster_id}; "
                "give the cluster id it was formatted with, or use another --data-dir"
            )
        return props
    if has_metadata:
        raise DataDirError(
            f"{path} is missing but {data_dir} holds a metadata log; restore meta.properties "
            "(its cluster.id must match the brokers') or start from an empty --data-dir"
        )
    props = MetaProperties(cluster_id=cluster_id or new_uuid_string(), node_id=node_id)
    props.write(data_dir)
    return props
