"""Adding a setting is one declaration (issue 14, item 3): one field with `setting(...)`
gives the flag, the MINIBROKER_* variable, the TOML key with its precedence, the checks
and the README row, with nothing else written anywhere."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from click.testing import Result

from runtime import settings
from runtime.settings import ConfigError
from runtime.settings import markdown_table
from runtime.settings import setting


@dataclass(frozen=True, kw_only=True)
class PollerConfig:
    """A process with two settings, declared once each."""

    poll_interval_ms: int = setting(
        250, minimum=1, maximum=60_000, doc="How often the poller polls."
    )
    log_level: str = setting("INFO", choices=("DEBUG", "INFO"), doc="Logging level.")
    internal_bound: int = 7  # not a setting: no flag, no README row

    def __post_init__(self) -> None:
        found = settings.problems(self)
        if found:
            raise ConfigError("; ".join(found))


@click.command()
@settings.options(PollerConfig)
def poller(**options: Any) -> None:
    config = settings.build(PollerConfig, options)
    click.echo(f"{config.poll_interval_ms} {config.log_level}")


def run(args: list[str], env: dict[str, str] | None = None) -> Result:
    unset = dict.fromkeys(["MINIBROKER_POLL_INTERVAL_MS", "MINIBROKER_LOG_LEVEL"])
    return CliRunner().invoke(poller, args, env={**unset, **(env or {})})


def test_one_declaration_gives_flag_environment_toml_and_precedence(tmp_path: Path) -> None:
    toml = tmp_path / "poller.toml"
    toml.write_text("poll-interval-ms = 300\n")
    assert run([]).output == "250 INFO\n"  # default
    assert run(["--config", str(toml)]).output == "300 INFO\n"  # TOML over default
    env = {"MINIBROKER_POLL_INTERVAL_MS": "400"}
    assert run(["--config", str(toml)], env).output == "400 INFO\n"  # env over TOML
    flag = ["--config", str(toml), "--poll-interval-ms", "500", "--log-level", "debug"]
    assert run(flag, env).output == "500 DEBUG\n"  # flag over env


def test_one_declaration_gives_the_checks_everywhere(tmp_path: Path) -> None:
    refused = run(["--poll-interval-ms", "0"])
    assert refused.exit_code == 2 and "1<=x<=60000" in refused.output
    toml = tmp_path / "poller.toml"
    toml.write_text("internal-bound = 3\n")
    unknown = run(["--config", str(toml)])
    assert unknown.exit_code == 2 and "unknown key 'internal-bound'" in unknown.output
    with pytest.raises(ConfigError, match="--poll-interval-ms must be <= 60000, got 60001"):
        PollerConfig(poll_interval_ms=60_001)
    with pytest.raises(ConfigError, match="--log-level must be one of DEBUG, INFO"):
        PollerConfig(log_level="TRACE")


def test_one_declaration_gives_the_readme_row_and_the_help_line() -> None:
    assert markdown_table(PollerConfig).splitlines()[2:4] == [
        "| `--poll-interval-ms` | `MINIBROKER_POLL_INTERVAL_MS` | 250 "
        "| How often the poller polls. |",
        "| `--log-level` | `MINIBROKER_LOG_LEVEL` | INFO | Logging level. |",
    ]
    text = " ".join(CliRunner().invoke(poller, ["--help"]).output.split())
    assert "How often the poller polls. [env var: MINIBROKER_POLL_INTERVAL_MS; default: 250" in text
    assert "internal-bound" not in text
