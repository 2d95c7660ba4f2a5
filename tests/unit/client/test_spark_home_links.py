"""compiled_spark_home(): the link farm that lets Spark's Python processes import the
byte-compiled pyspark package instead of compiling it from pyspark.zip at each start
(bench/README.md "Issue 20: Spark cold start"). Real directories and links."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from client.spark.spark_home import compiled_spark_home


def fake_pip_spark_home(root: Path) -> Path:
    """What a pip-installed PySpark holds at its top: the package and Spark's home."""
    home = root / "site-packages" / "pyspark"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "spark-submit").write_text("#!/bin/sh\n")
    (home / "jars").mkdir()
    (home / "python" / "lib").mkdir(parents=True)
    (home / "python" / "lib" / "pyspark.zip").write_bytes(b"PK")
    (home / "__init__.py").write_text("")
    (home / "sql").mkdir()
    return home


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("SPARK_HOME", raising=False)


def test_links_every_entry_but_python(tmp_path: Path) -> None:
    installed = fake_pip_spark_home(tmp_path)
    home = compiled_spark_home(installed)
    assert home is not None and home.parent == tmp_path / "cache" / "minibroker"
    assert sorted(p.name for p in home.iterdir()) == ["__init__.py", "bin", "jars", "sql"]
    assert all((home / name).is_symlink() for name in ("bin", "jars", "sql", "__init__.py"))
    assert (home / "bin" / "spark-submit").read_text() == "#!/bin/sh\n"
    # The point: the zips Spark names on its workers' PYTHONPATH do not exist.
    assert not (home / "python" / "lib" / "pyspark.zip").exists()
    assert (installed / "python" / "lib" / "pyspark.zip").exists()  # untouched


def test_reused_then_rebuilt_when_the_installation_changes(tmp_path: Path) -> None:
    installed = fake_pip_spark_home(tmp_path)
    home = compiled_spark_home(installed)
    assert home is not None
    inode = home.stat().st_ino
    assert compiled_spark_home(installed) == home and home.stat().st_ino == inode
    (installed / "examples").mkdir()  # a PySpark upgrade adds an entry
    assert compiled_spark_home(installed) == home
    assert (home / "examples").is_symlink()
    leftovers = [p.name for p in home.parent.iterdir() if p != home]
    assert leftovers == []


def test_a_directory_with_real_files_is_never_removed(tmp_path: Path) -> None:
    installed = fake_pip_spark_home(tmp_path)
    home = compiled_spark_home(installed)
    assert home is not None
    (home / "notes.txt").write_text("somebody's file")
    # Not a farm of links any more: refused (Spark then starts as it would have).
    assert compiled_spark_home(installed) is None
    assert (home / "notes.txt").read_text() == "somebody's file"


def test_not_applied_to_a_spark_home_the_user_chose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "spark-3.5"))
    assert compiled_spark_home() is None


def test_not_applied_to_something_that_is_not_a_spark_home(tmp_path: Path) -> None:
    installed = fake_pip_spark_home(tmp_path)
    (installed / "python" / "lib" / "pyspark.zip").unlink()
    assert compiled_spark_home(installed) is None


def test_unwritable_cache_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() == 0:
        # root writes through permission bits: make the cache path a file instead
        (tmp_path / "cache").write_text("")
    else:
        (tmp_path / "cache").mkdir(mode=0o500)
    installed = fake_pip_spark_home(tmp_path)
    assert compiled_spark_home(installed) is None


def test_client_package_imports_its_parts_on_first_use() -> None:
    """`import client` no longer imports every client (PEP 562 lazy names), and every
    public name still resolves to the class its module defines."""
    code = (
        "import sys, client; before = 'client.admin' in sys.modules;"
        "from client import *; import client.admin, client.sync;"
        "assert client.AsyncAdmin is client.admin.AsyncAdmin;"
        "assert client.Consumer is client.sync.Consumer;"
        "missing = [n for n in client.__all__ if getattr(client, n, None) is None];"
        "print(before, missing)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "False []", out.stdout + out.stderr
