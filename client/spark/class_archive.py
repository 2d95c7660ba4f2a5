"""`ClassArchive`: a class-data-sharing archive of the Spark driver JVM that
`local_session()` starts, written by one session and mapped by the later ones.

Why: the JVM of a local session loads, parses and verifies thousands of classes from
Spark's jars when it starts and again while the first query of the session runs.
HotSpot can map them, already parsed and verified, from an archive an earlier JVM
wrote at its exit (AppCDS dynamic archives, JEP 350, JDK 13+). Measured on this
project's 2-core machine (bench/README.md "Issue 20: Spark cold start"): starting a
session 8.1 -> 4.9 s, the first streaming query 7.7-7.9 -> 6.0-7.1 s.

How, per key (the java binary and its libjvm, the Spark home, its jars and the extra
driver class path; anything else is a different archive):

1. No archive for the key and no JVM writing one: the session's JVM gets
   `-XX:ArchiveClassesAtExit=<key>.<token>.partial` and writes every class it loaded
   when it exits (~10 s of CPU after the Python process has gone, once per key). A
   sidecar `<key>.<token>.json` records that JVM's pid, its java and its class path.
2. A later session finds that partial archive, and once its JVM has exited checks it:
   `java -Xshare:on` with the archive and the recorded class path must start. A torn
   archive (its JVM killed while writing) makes that JVM abort, and would abort
   Spark's too: JDK 17 maps a truncated archive and dies (SIGABRT, measured, also with
   -Xshare:auto and -XX:+VerifySharedSpaces), so nothing unchecked is ever used. A
   checked archive is renamed to `<key>.jsa`, its size recorded beside it
   (`<key>.size`); a failed one is removed (it is this cache's own file).
3. `<key>.jsa` whose size is the recorded one: the JVM starts with
   `-XX:SharedArchiveFile=<key>.jsa`. If Spark's JVM still fails to start with it,
   `local_session()` removes it and starts again without (`discard()`).

No archive when the class path holds a directory with files (a Spark conf directory,
HADOOP_CONF_DIR): HotSpot cannot write one then (`class_path_blockers`).
The JVM's messages about archives (`-Xlog:cds`) are off: writing one prints a line
per class it skips. Files live in `$XDG_CACHE_HOME/minibroker/spark-class-archive`
(or `~/.cache`); a Spark or JDK upgrade leaves the old key's archive (~160 MB) there
to be removed by hand.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.fileio import atomic_write

log = logging.getLogger(__name__)

_QUIET = "-Xlog:cds*=off"
# A session reserves the archive to write before its JVM starts, and records the JVM
# once it runs; a reservation older than this was never followed by a JVM.
_RESERVATION_S = 600.0
_CHECK_TIMEOUT_S = 60.0


def java_binary() -> Path | None:
    """The java Spark's launch scripts run: $JAVA_HOME/bin/java, else java on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    found = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if not found or not Path(found).exists():
        return None
    return Path(found).resolve()


def archive_key(java: Path, spark_home: Path, extra_class_path: str = "") -> str:
    """What an archive was written for: the JVM build and every jar it may map."""
    digest = hashlib.sha256()
    libjvm = java.parent.parent / "lib" / "server" / "libjvm.so"
    for path in (java, libjvm):
        with contextlib.suppress(OSError):
            st = path.stat()
            digest.update(f"{path}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    digest.update(f"{spark_home}\n{extra_class_path}\n".encode())
    with contextlib.suppress(OSError):
        for jar in sorted((spark_home / "jars").iterdir()):
            st = jar.stat()
            digest.update(f"{jar.name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:20]


def class_path_blockers(spark_home: Path, extra_class_path: str = "") -> list[str]:
    """Why HotSpot would fail to archive Spark's classes: a JVM told to write an
    archive with a non-empty directory before a used jar on its class path writes
    nothing and prints "Error occurred during initialization of VM" as it exits
    (JDK 17, measured), and Spark's launcher puts its conf directory first there, and
    the Hadoop and YARN conf directories when they are set."""
    blockers = [
        f"{name} is set"
        for name in ("HADOOP_CONF_DIR", "YARN_CONF_DIR", "SPARK_DIST_CLASSPATH")
        if os.environ.get(name)
    ]
    conf = Path(os.environ.get("SPARK_CONF_DIR") or spark_home / "conf")
    for entry in [conf, *(Path(p) for p in extra_class_path.split(os.pathsep) if p)]:
        with contextlib.suppress(OSError):
            if entry.is_dir() and any(entry.iterdir()):
                blockers.append(f"{entry} is a directory with files on the class path")
    return blockers


@dataclass
class ClassArchive:
    """One key's archive files in `directory` (see the module docstring)."""

    directory: Path
    key: str
    java: Path
    writing: Path | None = None  # the partial archive this session's JVM will write

    @property
    def archive(self) -> Path:
        return self.directory / f"{self.key}.jsa"

    @property
    def _recorded_size(self) -> Path:
        return self.directory / f"{self.key}.size"

    def java_options(self) -> str:
        """The JVM options for a session starting now: map the archive, write one, or
        nothing (another JVM is writing it, or the cache cannot be written)."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            writers = self._settle()
            if self._usable():
                return f"-XX:SharedArchiveFile={self.archive} {_QUIET}"
            if writers:
                return ""
            self.writing = self.directory / f"{self.key}.{secrets.token_hex(4)}.partial"
            _write_record(self.writing, {"reserved": time.time()})
            return f"-XX:ArchiveClassesAtExit={self.writing} {_QUIET}"
        except OSError as exc:
            log.info("no class archive for Spark's JVM: %s", exc)
            return ""

    def started(self, jvm_pid: int, class_path: str) -> None:
        """Record the JVM that will write `self.writing` when it exits."""
        if self.writing is None:
            return
        started = _start_time(jvm_pid)
        # Without a known JVM the archive is never checked (it might be half written
        # when looked at), so the reservation lapses and a later session removes it.
        if started is not None:
            record = {"pid": jvm_pid, "started": started, "class_path": class_path}
            with contextlib.suppress(OSError):
                _write_record(self.writing, record)

    def discard(self) -> None:
        """Spark's JVM would not start with the archive: never offer it again."""
        for path in (self.archive, self._recorded_size):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def _usable(self) -> bool:
        try:
            recorded = int(self._recorded_size.read_text())
            return self.archive.stat().st_size == recorded
        except (OSError, ValueError):
            return False

    def _settle(self) -> int:
        """Promote a finished archive that starts a JVM, remove the other finished or
        abandoned ones; return how many may still be written."""
        writers = 0
        tokens = {p.name.split(".")[1] for p in self.directory.glob(f"{self.key}.*.partial*")}
        tokens |= {p.name.split(".")[1] for p in self.directory.glob(f"{self.key}.*.json")}
        for token in sorted(tokens):
            partial = self.directory / f"{self.key}.{token}.partial"
            record = _read_record(partial)
            if _being_written(partial, record):
                writers += 1
                continue
            class_path = record.get("class_path") if record else None
            if (
                isinstance(class_path, str)
                and partial.exists()
                and not self._usable()
                and self._starts_a_jvm(partial, class_path)
            ):
                os.replace(partial, self.archive)
                atomic_write(self._recorded_size, str(self.archive.stat().st_size).encode())
                log.info("Spark's JVM will map the classes archived in %s", self.archive)
            for path in (partial, partial.with_suffix(".json")):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
        return writers

    def _starts_a_jvm(self, archive: Path, class_path: str) -> bool:
        try:
            check = [str(self.java), f"-XX:SharedArchiveFile={archive}", "-Xshare:on"]
            # A torn archive aborts this JVM: no hs_err file left in the working dir.
            check += [_QUIET, f"-XX:ErrorFile={os.devnull}", "-XX:-CreateCoredumpOnCrash"]
            done = subprocess.run(
                [*check, "-cp", class_path, "-version"],
                capture_output=True,
                timeout=_CHECK_TIMEOUT_S,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            log.info("could not check the class archive %s: %s", archive, exc)
            return False
        if done.returncode != 0:
            log.info("class archive %s is damaged (java exited %d)", archive, done.returncode)
        return done.returncode == 0


def _write_record(partial: Path, record: dict[str, Any]) -> None:
    atomic_write(partial.with_suffix(".json"), json.dumps(record).encode())


def _read_record(partial: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(partial.with_suffix(".json").read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _being_written(partial: Path, record: dict[str, Any] | None) -> bool:
    """Whether `partial` may still appear or grow: its recorded JVM runs (a pid reused
    by another process has another start time), or a session reserved it lately and
    is still starting its JVM."""
    if record is not None and isinstance(record.get("pid"), int):
        started = record.get("started")
        return started is not None and _start_time(record["pid"]) == started
    if record is not None and isinstance(record.get("reserved"), float | int):
        return time.time() - record["reserved"] < _RESERVATION_S
    return False


def _start_time(pid: int) -> int | None:
    """The start time of a running process, None once it has exited (a zombie
    included: it will write nothing more)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return None if fields[0] == "Z" else int(fields[19])
