"""The README's configuration tables, generated from the declarations.

    python -m tests.config_tables

prints each table under the start of the paragraph it follows in README.md's
"## Configuration" section; paste them there after changing a setting.
tests/unit/test_readme_configuration.py fails while the README and the declarations
differ.

It lives with the tests because it reads both processes' declarations
(broker/config.py, controller/config.py) and the topic configs
(protocol/topic_configs.py), and the runtime package below them must not import them.
"""

from __future__ import annotations

from broker.config import BrokerConfig
from controller.config import ControllerConfig
from protocol.topic_configs import TOPIC_CONFIGS
from protocol.topic_configs import TopicConfigDef
from runtime.settings import markdown_table
from runtime.settings import settings_of
from runtime.settings import switch_rows

# Each table, keyed by the start of the README paragraph it follows.
CONTROLLER_TITLE = "Controller (`python -m controller`):"
BROKER_TITLE = "Broker (`python -m broker`):"
TEST_SWITCHES_TITLE = "Test-only switches"
TOPIC_TITLE = "Topic configs"

SERVERS: dict[str, type] = {"controller": ControllerConfig, "broker": BrokerConfig}


def topic_table() -> str:
    rows = ["| topic config | values | default | meaning |", "|---|---|---|---|"]
    for definition in TOPIC_CONFIGS.values():
        rows.append(
            f"| `{definition.name}` | {definition.valid_values} | {_topic_default(definition)} "
            f"| {definition.doc} |"
        )
    return "\n".join(rows)


def _topic_default(definition: TopicConfigDef) -> str:
    """The flag that sets the cluster-wide default, or the fixed default."""
    for server, config_class in SERVERS.items():
        for declared in settings_of(config_class):
            if declared.setting.topic_config is definition:
                return f"{server}'s `{declared.flag}` ({declared.default_text()})"
    return "none" if definition.default is None else str(definition.default).lower()


def switch_table() -> str:
    """Both servers' test-only switches; one row for a switch both declare alike."""
    rows = ["| server | flag | what it does |", "|---|---|---|"]
    seen: dict[tuple[str, str], list[str]] = {}
    for server, config_class in SERVERS.items():
        for flag, doc in switch_rows(config_class):
            seen.setdefault((flag, doc), []).append(server)
    for (flag, doc), servers in seen.items():
        where = "both" if len(servers) == len(SERVERS) else servers[0]
        rows.append(f"| {where} | `{flag}` | {doc} |")
    return "\n".join(rows)


def tables() -> dict[str, str]:
    """The start of a README paragraph -> the table that follows it."""
    return {
        CONTROLLER_TITLE: markdown_table(ControllerConfig),
        BROKER_TITLE: markdown_table(BrokerConfig),
        TEST_SWITCHES_TITLE: switch_table(),
        TOPIC_TITLE: topic_table(),
    }


def main() -> None:
    print("\n\n".join(f"{title}\n\n{table}" for title, table in tables().items()))


if __name__ == "__main__":
    main()
