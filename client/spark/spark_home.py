"""`compiled_spark_home()`: a SPARK_HOME for a pip-installed PySpark whose Python
processes import the installed, byte-compiled `pyspark` package instead of
`python/lib/pyspark.zip`.

Why: Spark puts `$SPARK_HOME/python/lib/pyspark.zip` (and py4j's zip) first on the
PYTHONPATH of every Python process it starts - each daemon, each worker it cannot
fork, the streaming source runner of every query - and runs them with bytecode
writing off. The zip holds sources only, so each of those processes compiles all of
pyspark it imports, ~1.2 s of CPU each on this project's 2-core machine
(`import pyspark.daemon, pyspark.worker, pyspark.sql.worker.plan_data_source_read`:
1.64 s of CPU from the zip, 0.41 s from the installed package); the first streaming
query of a session starts eight of them (bench/README.md "Issue 20: Spark cold start").

How: a directory of symlinks to every entry of the pip-installed Spark home except
`python/`. Spark's launch scripts find `bin/`, `jars/` and `conf/` through it as
before; the zips it names on the workers' PYTHONPATH do not exist, so Python skips
them and imports pyspark and py4j from site-packages, where pip compiled them.
Nothing of the installation is modified. The directory lives in the user's cache
(`$XDG_CACHE_HOME` or `~/.cache`), one per PySpark installation, and is rebuilt if
anything in it no longer matches.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

# What a pip-installed PySpark holds that marks it as its own Spark home.
_SPARK_HOME_MARKERS = ("bin/spark-submit", "jars", "python/lib/pyspark.zip")


def compiled_spark_home(installed_home: Path | None = None) -> Path | None:
    """The SPARK_HOME to start Spark with (see the module docstring), or None when it
    does not apply: SPARK_HOME is already set (a Spark installation the user chose),
    PySpark is not a pip installation, or the cache directory cannot be written (then
    Spark runs as it would have, only slower to start its Python processes)."""
    if installed_home is None:
        if os.environ.get("SPARK_HOME"):
            return None
        installed_home = pip_spark_home()
        if installed_home is None:
            return None
    if not all((installed_home / marker).exists() for marker in _SPARK_HOME_MARKERS):
        return None
    key = hashlib.sha256(str(installed_home.resolve()).encode()).hexdigest()[:16]
    home = cache_dir() / f"spark-home-{key}"
    try:
        if not _is_current(home, installed_home):
            _build(home, installed_home)
    except OSError as exc:
        log.info("Spark's Python processes will import pyspark from its zip: %s", exc)
        return None
    return home


def pip_spark_home() -> Path | None:
    try:
        import pyspark
    except ImportError:
        return None
    return Path(pyspark.__file__).resolve().parent


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "minibroker"


def _entries(installed_home: Path) -> list[Path]:
    return sorted(p for p in installed_home.iterdir() if p.name != "python")


def _is_current(home: Path, installed_home: Path) -> bool:
    """Every entry of the installation linked, nothing else, owned by this user."""
    try:
        if home.is_symlink() or home.stat().st_uid != os.getuid():
            return False
        linked = {p.name: p for p in home.iterdir()}
    except OSError:
        return False
    wanted = _entries(installed_home)
    if set(linked) != {p.name for p in wanted}:
        return False
    return all(
        linked[p.name].is_symlink() and os.readlink(linked[p.name]) == str(p) for p in wanted
    )


def _build(home: Path, installed_home: Path) -> None:
    """Build the link farm beside `home`, then rename it into place, so that a reader
    never sees half of one (another process may be building the same one). An
    out-of-date farm is moved aside first, and only if it holds nothing but links."""
    home.parent.mkdir(parents=True, exist_ok=True)
    if home.exists() or home.is_symlink():
        _move_aside(home)
    staging = Path(tempfile.mkdtemp(prefix=home.name + ".", dir=home.parent))
    try:
        for entry in _entries(installed_home):
            (staging / entry.name).symlink_to(entry)
        os.rename(staging, home)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if _is_current(home, installed_home):  # another process built it first
            return
        raise


def _move_aside(home: Path) -> None:
    if not home.is_symlink() and any(not p.is_symlink() for p in home.iterdir()):
        raise OSError(f"{home} holds more than links to a Spark home: remove it by hand")
    stale = Path(tempfile.mkdtemp(prefix=home.name + ".stale.", dir=home.parent))
    with contextlib.suppress(FileNotFoundError):  # another process moved it first
        os.rename(home, stale / "old")
    shutil.rmtree(stale, ignore_errors=True)  # links only: their targets stay
