"""`python -m broker`: the broker process.

Configuration precedence: flags > environment (MINIBROKER_*) > TOML file given with
--config (keys are the option names with dashes, e.g. `node-id = 1`) > defaults; the
settings are declared once, in broker/config.py (BrokerConfig).
Exit codes: 0 after a clean shutdown (SIGTERM/SIGINT), 1 when start-up or the broker
fails (one `error: ...` line on stderr says what and what to do), 2 for bad flags
(including an --unsafe-* switch without --enable-test-faults).
"""

from __future__ import annotations

import asyncio
import logging
import sys

import click
import uvloop

from broker.config import BrokerConfig
from runtime import settings

LOG_FORMAT = "%(asctime)s %(levelname)s [node {node}] %(name)s: %(message)s"


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@settings.options(BrokerConfig)
def main(**options: object) -> None:
    """Run a minibroker broker: registers with the controller, leads and follows the
    partitions assigned to it, and serves clients."""
    sys.exit(run(settings.build(BrokerConfig, options)))


def run(config: BrokerConfig) -> int:
    logging.basicConfig(
        level=config.log_level,
        format=LOG_FORMAT.format(node=config.node_id),
        stream=sys.stderr,
        force=True,
    )
    # Imported here so that `--help` and flag errors do not load the whole broker.
    from broker.server import Broker
    from broker.server import StartupError
    from runtime.allocator import keep_freed_memory

    # Process-wide, so here and not in Broker (tests run brokers inside pytest).
    kept = keep_freed_memory(config.allocator_retain_bytes)
    if kept:
        logging.getLogger("broker").info(
            "the allocator keeps up to %d bytes of freed memory for reuse", kept
        )

    async def _main() -> int:
        broker = Broker(config)
        return await broker.run()

    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(_main())
    except StartupError as exc:
        click.echo(f"error: broker {config.node_id}: {exc}", err=True)
        return 1
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    main()
