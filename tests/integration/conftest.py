"""The `cluster` fixture of the integration tests: a Cluster (tests/integration/cluster.py)
under the test's temp dir whose processes are all stopped on the way out."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster import Cluster
from cluster import running_cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with running_cluster(tmp_path) as c:
        yield c
