"""Fixtures shared by the unit tests of more than one component."""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest


@pytest.fixture
def capture_run(monkeypatch: pytest.MonkeyPatch) -> Callable[[ModuleType], list[Any]]:
    """capture_run(module): the CLI's `module.run` (broker.__main__, controller.app) only
    records the config it is given and returns 0, and no MINIBROKER_* variable is set;
    the list of configs, for the CLI tests to check what the flags, environment and file
    made of them."""

    def capture(module: ModuleType) -> list[Any]:
        configs: list[Any] = []
        monkeypatch.setattr(module, "run", lambda config: configs.append(config) or 0)
        for key in list(os.environ):
            if key.startswith("MINIBROKER_"):
                monkeypatch.delenv(key)
        return configs

    return capture
