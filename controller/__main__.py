"""`python -m controller`: the controller's command line.

Every option also reads `MINIBROKER_<NAME>` from the environment and `<name>` (with
dashes) from the TOML file given with `--config`; precedence is flag > environment >
file > default. The settings are declared once, in controller/config.py
(ControllerConfig).
"""

from __future__ import annotations

import os
import sys

import click

from controller.config import ControllerConfig
from runtime import settings


@click.command(
    name="controller",
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@settings.options(ControllerConfig)
def main(**options: object) -> None:
    """Run the minibroker controller: the cluster's metadata log, broker liveness and
    leader elections."""
    config = settings.build(ControllerConfig, options)
    # Imported here so `--help` and flag errors stay fast.
    from controller.app import run

    sys.exit(run(config))


if __name__ == "__main__":
    main(prog_name=f"{os.path.basename(sys.executable)} -m controller")
