"""pytest settings of the chaos tests.

Markers (registered here too, so they work before pyproject lists them):
  chaos          the docker-compose runs (need Docker and the minibroker:latest image)
  chaos_process  the process-backend runs (local processes, no Docker; ~1 minute)

The full campaign (RF=3, min.insync.replicas=2, acks=all, every fault, strict
verdicts) is off by default: `pytest tests/chaos --chaos-full` or
MINIBROKER_CHAOS_FULL=1. MINIBROKER_CHAOS_REQUIRE_DOCKER=1 (or CI set, as on
CI machines, which must run it) turns the docker test's skip (no Docker, no image)
into a failure.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    # Only seen when tests/chaos is on the command line (pytest reads options from the
    # initial conftests); MINIBROKER_CHAOS_FULL=1 works from anywhere.
    group = parser.getgroup("chaos")
    group.addoption(
        "--chaos-full",
        action="store_true",
        default=False,
        help="run the full chaos campaign tests (RF=3, every fault, several minutes)",
    )
    group.addoption(
        "--chaos-seed", type=int, default=None, help="seed of the chaos runs [fixed per test]"
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "chaos: needs Docker; kills containers")
    config.addinivalue_line(
        "markers", "chaos_process: chaos run on local processes (no Docker), about a minute"
    )


FULL_CAMPAIGN_IS_OPT_IN = (
    "full chaos campaign is off by default (RF=3, every fault, several minutes)"
)


@dataclass(frozen=True)
class ChaosOptions:
    full: bool
    seed: int | None

    def seed_or(self, default: int) -> int:
        return default if self.seed is None else self.seed

    def require_full(self, what: str = FULL_CAMPAIGN_IS_OPT_IN) -> None:
        """Skip (with how to run it) unless the full campaign was asked for: it is an
        opt-in run, not part of the default suite."""
        if not self.full:
            pytest.skip(f"{what}: pytest tests/chaos --chaos-full, or MINIBROKER_CHAOS_FULL=1")


@pytest.fixture
def chaos_options(request: pytest.FixtureRequest) -> ChaosOptions:
    config = request.config
    full = bool(config.getoption("chaos_full", default=False)) or os.environ.get(
        "MINIBROKER_CHAOS_FULL", ""
    ) not in ("", "0")
    seed = config.getoption("chaos_seed", default=None)
    if seed is None and os.environ.get("MINIBROKER_CHAOS_SEED"):
        seed = int(os.environ["MINIBROKER_CHAOS_SEED"])
    return ChaosOptions(full=full, seed=seed)
