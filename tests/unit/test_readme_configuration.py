"""The README's configuration tables are the declarations: a default, bound, flag or
doc changed in one place and not the other fails here (issue 14, item 3)."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

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
