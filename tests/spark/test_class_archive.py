"""The class-data archive of a local session's JVM (client/spark/class_archive.py):
one session's JVM writes it at its exit, a later session maps it, and nothing a JVM
could die of is ever handed to one.

The invariant: Spark's JVM is only ever started with an archive that a JVM has
already started with (JDK 17 aborts on a torn archive, also with -Xshare:auto,
shown below), and no session is kept from starting by the archive.

The first tests drive `ClassArchive` with real JVMs running a one-file Java program
(seconds); the last ones run `local_session()` in fresh processes, as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from client.spark.class_archive import ClassArchive
from client.spark.class_archive import class_path_blockers
from client.spark.class_archive import java_binary
from tests.spark.conftest import require_spark

_WAIT_FOR_STDIN = "public class Wait { public static void main(String[] a) throws Exception { System.in.read(); } }\n"  # noqa: E501


@pytest.fixture
def java() -> Path:
    require_spark()
    found = java_binary()
    assert found is not None
    return found


def _start_writer(java: Path, options: str, tmp_path: Path) -> subprocess.Popen[bytes]:
    """A JVM started with `options` that runs until its stdin closes."""
    source = tmp_path / "Wait.java"
    source.write_text(_WAIT_FOR_STDIN)
    empty = tmp_path / "empty"
    empty.mkdir(exist_ok=True)
    return subprocess.Popen(
        [str(java), *options.split(), "-cp", str(empty), str(source)],
        stdin=subprocess.PIPE,
        cwd=tmp_path,
    )


def _archive_written_by_a_jvm(java: Path, tmp_path: Path) -> tuple[ClassArchive, Path]:
    """The first session's path: reserve, start the JVM, record it, let it exit."""
    archive = ClassArchive(tmp_path / "cache", "k", java)
    options = archive.java_options()
    assert "-XX:ArchiveClassesAtExit=" in options
    assert archive.writing is not None
    writer = _start_writer(java, options, tmp_path)
    archive.started(writer.pid, str(tmp_path / "empty"))

    # While that JVM runs, another session neither maps nor writes an archive.
    assert ClassArchive(tmp_path / "cache", "k", java).java_options() == ""

    assert writer.stdin is not None
    writer.stdin.close()
    assert writer.wait(timeout=120) == 0
    assert archive.writing.stat().st_size > 0
    return archive, archive.writing


def _java_version(java: Path, options: str, tmp_path: Path) -> int:
    class_path = str(tmp_path / "empty")
    return subprocess.run(
        [str(java), *options.split(), "-XX:ErrorFile=/dev/null", "-cp", class_path, "-version"],
        capture_output=True,
        timeout=60,
        cwd=tmp_path,
    ).returncode


def test_a_later_session_maps_the_archive_a_finished_jvm_wrote(java: Path, tmp_path: Path) -> None:
    first, _ = _archive_written_by_a_jvm(java, tmp_path)

    later = ClassArchive(tmp_path / "cache", "k", java)
    options = later.java_options()
    assert options.startswith(f"-XX:SharedArchiveFile={first.archive} "), options
    assert later.writing is None
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["k.jsa", "k.size"]
    assert _java_version(java, options.replace("-Xlog:cds*=off", "-Xshare:on"), tmp_path) == 0


def test_a_torn_archive_is_never_handed_to_a_jvm(java: Path, tmp_path: Path) -> None:
    """A JVM killed while writing leaves a torn archive: checked, refused, removed,
    and the next session writes a new one."""
    _, partial = _archive_written_by_a_jvm(java, tmp_path)
    whole = partial.read_bytes()
    partial.chmod(0o644)
    partial.write_bytes(whole[: len(whole) // 2])

    # Why it is checked: JDK 17 maps it and aborts, -Xshare:auto or not.
    assert _java_version(java, f"-XX:SharedArchiveFile={partial} -Xshare:auto", tmp_path) != 0

    later = ClassArchive(tmp_path / "cache", "k", java)
    options = later.java_options()
    assert "SharedArchiveFile" not in options
    assert "-XX:ArchiveClassesAtExit=" in options
    assert not partial.exists()
    assert not later.archive.exists()
    assert not list(tmp_path.glob("hs_err*")), "the check left a JVM crash report behind"


def test_an_archive_cut_after_it_was_checked_is_not_mapped(java: Path, tmp_path: Path) -> None:
    first, _ = _archive_written_by_a_jvm(java, tmp_path)
    assert "SharedArchiveFile" in ClassArchive(tmp_path / "cache", "k", java).java_options()
    whole = first.archive.read_bytes()
    first.archive.chmod(0o644)
    first.archive.write_bytes(whole[:-4096])

    options = ClassArchive(tmp_path / "cache", "k", java).java_options()
    assert "SharedArchiveFile" not in options


def test_a_reservation_whose_jvm_never_started_lapses(java: Path, tmp_path: Path) -> None:
    """A session that reserved the archive and died before its JVM ran holds no one
    back for ever: after the reservation window, the next session writes it."""
    first = ClassArchive(tmp_path / "cache", "k", java)
    assert "ArchiveClassesAtExit" in first.java_options()
    assert ClassArchive(tmp_path / "cache", "k", java).java_options() == ""
    assert first.writing is not None
    sidecar = first.writing.with_suffix(".json")
    sidecar.write_text(json.dumps({"reserved": time.time() - 3600}))

    later = ClassArchive(tmp_path / "cache", "k", java)
    assert "ArchiveClassesAtExit" in later.java_options()
    assert not sidecar.exists()


def test_a_cache_that_cannot_be_written_means_no_archive(java: Path, tmp_path: Path) -> None:
    """The session still starts, without an archive (nothing to map, nothing to
    write), when the cache directory cannot be made."""
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    archive = ClassArchive(blocked / "spark-class-archive", "k", java)
    assert archive.java_options() == ""
    assert archive.writing is None


def test_a_conf_directory_with_files_blocks_the_archive(tmp_path: Path) -> None:
    """HotSpot cannot write an archive with a non-empty directory ahead of the jars
    on its class path, and Spark's launcher puts its conf directory there."""
    home = tmp_path / "spark"
    (home / "conf").mkdir(parents=True)
    assert class_path_blockers(home) == []
    (home / "conf" / "spark-defaults.conf").write_text("spark.ui.enabled false\n")
    blocker = f"{home / 'conf'} is a directory with files on the class path"
    assert class_path_blockers(home) == [blocker]


_SESSION = textwrap.dedent(
    """
    import json, sys
    from client.spark.session import local_session
    session = local_session("class-archive-test", **json.loads(sys.argv[1]))
    bean = session.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    options = [str(a) for a in bean.getInputArguments() if "Archive" in str(a)]
    assert session.range(3).count() == 3
    print("OPTIONS", json.dumps(options), flush=True)
    """
)


def _session(env: dict[str, str], conf: dict[str, str] | None = None) -> tuple[list[str], str]:
    done = subprocess.run(
        [sys.executable, "-c", _SESSION, json.dumps(conf or {})],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("OPTIONS "))
    return json.loads(line.removeprefix("OPTIONS ")), done.stderr


def _wait_for_writers(directory: Path, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while any(directory.glob("*.json")):
        records = [json.loads(p.read_text()) for p in directory.glob("*.json")]
        if all(not Path(f"/proc/{r['pid']}").exists() for r in records if "pid" in r):
            return
        assert time.monotonic() < deadline, f"a JVM still writing its archive: {records}"
        time.sleep(0.5)


def test_the_second_local_session_maps_what_the_first_archived(tmp_path: Path) -> None:
    require_spark()
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("SPARK_HOME", None)
    directory = tmp_path / "cache" / "minibroker" / "spark-class-archive"

    first, _ = _session(env)
    assert len(first) == 1 and first[0].startswith("-XX:ArchiveClassesAtExit="), first
    _wait_for_writers(directory)

    loaded = tmp_path / "classes.log"
    conf = {"spark.driver.extraJavaOptions": f"-Xlog:class+load=info:file={loaded}"}
    second, _ = _session(env, conf)
    archives = list(directory.glob("*.jsa"))
    assert len(archives) == 1
    assert second == [f"-XX:SharedArchiveFile={archives[0]}"], second
    # Spark's own classes came out of the archive the first JVM wrote.
    from_archive = [
        line
        for line in loaded.read_text().splitlines()
        if "org.apache.spark." in line and "shared objects file (top)" in line
    ]
    assert len(from_archive) > 1000, len(from_archive)


def test_a_session_with_a_spark_conf_directory_starts_without_an_archive(
    tmp_path: Path,
) -> None:
    require_spark()
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text("spark.sql.session.timeZone UTC\n")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "SPARK_CONF_DIR": str(conf_dir)}
    env.pop("SPARK_HOME", None)

    options, stderr = _session(env)
    # Asked to write one, the JVM would print this as it exits, and write nothing.
    assert "Error occurred during initialization of VM" not in stderr
    assert options == []
