"""The README's configuration tables and `--help` are the declarations: a default, bound,
flag or doc changed in one place and not the other fails here (issue 14, item 3)."""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import broker.__main__
import controller.__main__
from broker.config import BrokerConfig
from controller.config import ControllerConfig
from runtime.settings import settings_of
from tests import config_tables

README = Path(__file__).resolve().parents[2] / "README.md"


def configuration_section() -> list[str]:
    lines = README.read_text(encoding="utf-8").splitlines()
    start = lines.index("## Configuration")
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("## "))
    return lines[start:end]


def table_after(section: list[str], title: str) -> list[str]:
    """The first markdown table after the paragraph that starts with `title`."""
    starts = [i for i, line in enumerate(section) if line.startswith(title)]
    assert starts, f"README's Configuration section has no paragraph starting {title!r}"
    first = next(i for i in range(starts[0], len(section)) if section[i].startswith("|"))
    table = []
    for line in section[first:]:
        if not line.startswith("|"):
            break
        table.append(line)
    return table


@pytest.mark.parametrize("title", list(config_tables.tables()))
def test_readme_configuration_table_matches_the_declarations(title: str) -> None:
    generated = config_tables.tables()[title].splitlines()
    in_readme = table_after(configuration_section(), title)
    if in_readme != generated:
        diff = "\n".join(
            difflib.unified_diff(in_readme, generated, "README.md", "declarations", lineterm="")
        )
        pytest.fail(
            f"README's {title!r} table differs from the declarations; run "
            f"`python -m tests.config_tables` and paste the table into README.md:\n{diff}"
        )


def help_entries(output: str) -> dict[str, str]:
    """--help's text per option, white space removed (click wraps lines anywhere)."""
    entries: dict[str, str] = {}
    flag = None
    for line in output.splitlines():
        start = re.match(r"^  (?:-\w, )?(--[\w-]+)", line)
        if start:
            flag = start[1]
        if flag:
            entries[flag] = entries.get(flag, "") + re.sub(r"\s+", "", line)
    return entries


@pytest.mark.parametrize(
    ("command", "config_class"),
    [(broker.__main__.main, BrokerConfig), (controller.__main__.main, ControllerConfig)],
)
def test_help_shows_every_declared_setting_with_its_variable_and_default(
    command: click.Command, config_class: type
) -> None:
    result = CliRunner().invoke(command, ["--help"], terminal_width=200)
    assert result.exit_code == 0
    entries = help_entries(result.output)
    for declared in settings_of(config_class):
        entry = entries[declared.flag]
        assert f"envvar:{declared.env}" in entry
        assert re.sub(r"\s+", "", declared.help_text()) in entry
        if declared.default_text() == "required":
            assert "required" in entry
        else:  # click writes booleans False / True
            shown = declared.default_text().replace(" ", "").lower()
            assert f"default:{shown}" in entry.lower().replace("(", ""), entry
