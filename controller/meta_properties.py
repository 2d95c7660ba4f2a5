"""The controller's data directory: its lock and its identity file.

Files in the data directory owned by this module:

``.lock``
    Empty; held with ``flock(LOCK_EX)`` while a controller runs, so two controllers
    never share one directory.

``meta.properties``
    Java-properties style text, written once when the directory is first used and
    replaced atomically (temp file, fsync, rename, fsync directory)::

        # minibroker controller identity; do not edit
        version=1
        cluster.id=<22-char URL-safe base64 of a random UUID, Kafka's style>
        node.id=<controller node id>

    The cluster id is generated once and never changes: brokers store it and refuse
    a controller with another (INCONSISTENT_CLUSTER_ID).
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from controller.errors import DataDirError

META_PROPERTIES = "meta.properties"
LOCK_FILE = ".lock"
VERSION = 1


def new_uuid_string() -> str:
    """A random UUID as Kafka prints it: 22 chars of URL-safe base64, never starting
    with '-' (it would read as a command-line flag)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")
        if not text.startswith("-"):
            return text


@dataclass(frozen=True)
class MetaProperties:
    cluster_id: str
    node_id: int


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so a crash leaves either the old or the new file."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


class DataDirLock:
    """Exclusive use of a data directory for the life of the process."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._fd: int | None = None

    def acquire(self) -> None:
        path = self.data_dir / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise DataDirError(
                f"cannot create {path}: {exc.strerror}; check the permissions of --data-dir"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise DataDirError(
                f"data dir {self.data_dir} is in use by another controller (lock {path} is "
                "held); stop it or choose another --data-dir"
            ) from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


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


def _parse(text: str, path: Path) -> MetaProperties:
    values: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise DataDirError(f"{path} is corrupt (line {line!r}); restore it from a backup")
        values[key.strip()] = value.strip()
    try:
        version = int(values["version"])
        cluster_id = values["cluster.id"]
        node_id = int(values["node.id"])
    except (KeyError, ValueError) as exc:
        raise DataDirError(
            f"{path} is corrupt or incomplete ({exc}); restore it from a backup"
        ) from None
    if version != VERSION:
        raise DataDirError(f"{path} has version {version}, this controller reads {VERSION}")
    if not cluster_id:
        raise DataDirError(f"{path} has an empty cluster.id; restore it from a backup")
    return MetaProperties(cluster_id=cluster_id, node_id=node_id)


def load_or_create(data_dir: Path, node_id: int, *, has_metadata: bool) -> MetaProperties:
    """Read the identity, or create it on a fresh directory.

    `has_metadata` says whether a metadata log or snapshot is present: then a missing
    identity file means damage (a new cluster id would orphan every broker), not a
    first start."""
    path = data_dir / META_PROPERTIES
    if path.exists():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise DataDirError(f"cannot read {path}: {exc}; restore it from a backup") from exc
        props = _parse(text, path)
        if props.node_id != node_id:
            raise DataDirError(
                f"{path} belongs to controller {props.node_id}, not {node_id}; "
                "start with --node-id "
                f"{props.node_id} or use another --data-dir"
            )
        return props
    if has_metadata:
        raise DataDirError(
            f"{path} is missing but {data_dir} holds a metadata log; restore meta.properties "
            "(its cluster.id must match the brokers') or start from an empty --data-dir"
        )
    props = MetaProperties(cluster_id=new_uuid_string(), node_id=node_id)
    body = (
        "# minibroker controller identity; do not edit\n"
        f"version={VERSION}\ncluster.id={props.cluster_id}\nnode.id={props.node_id}\n"
    )
    atomic_write(path, body.encode("utf-8"))
    return props
