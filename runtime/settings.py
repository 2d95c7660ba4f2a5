"""Declarative settings: each server setting is declared once, as a field of its
process's frozen config dataclass (`BrokerConfig`, `ControllerConfig`), and everything
else is derived from that one declaration:

- the command-line flag: the field name with dashes (`segment_bytes` ->
  `--segment-bytes`), shown by `--help` with its environment variable and default;
- the environment variable: `MINIBROKER_` + the field name in capitals;
- the TOML key in the file given with `--config`: the flag without its dashes;
- the checks (type, bounds, choices) for the command line, the TOML file and a config
  built directly in code (`problems`);
- the README's configuration table (`markdown_table`).

    @dataclass(frozen=True, kw_only=True)
    class BrokerConfig:
        heartbeat_interval_ms: int = setting(500, minimum=1, doc="Heartbeat period.")
        segment_bytes: int = topic_setting(SEGMENT_BYTES)  # the topic config's type,
                                                           # default and bounds

A field without a declaration is an internal bound: no flag, not in the README.

Precedence flag > environment > TOML file > default is click's own order (command
line, envvar, default_map, default): the `--config` option is eager and loads the file
into click's default_map before any other option is read.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import tomllib
from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import MISSING
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from typing import Literal
from typing import TypeVar

import click

from protocol.invariants import InvariantError
from protocol.topic_configs import TopicConfigDef

ENV_PREFIX = "MINIBROKER_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"
# Test-only switches are refused unless test faults are enabled (--enable-test-faults or
# this variable set to 1), so a production deployment cannot turn a protection off.
TEST_FAULTS_ENV = ENV_PREFIX + "ENABLE_TEST_FAULTS"
CONFIG_DOC = (
    "TOML file of settings, keys named like the options without the leading dashes "
    "(e.g. node-id = 1); flags and environment variables override it."
)
TEST_FAULTS_DOC = (
    "TEST ONLY: serve the FaultControl API (delay, drop, drop the response of, or hold "
    "until released a chosen RPC type at this node, incoming or outgoing, optionally only "
    "for one peer) and allow the --unsafe-* switches. Logged loudly at start; never in "
    "production."
)

Kind = Literal["int", "bool", "text", "choice", "path", "file"]  # path: a directory
# "setting": an ordinary setting; "test-faults": the switch that enables the test-only
# ones; "unsafe": a test-only switch that turns a protection off.
Role = Literal["setting", "test-faults", "unsafe"]
# parse(text, option="--flag") -> the field's value; raises ValueError naming the flag.
Parser = Callable[..., Any]
Command = TypeVar("Command", bound=Callable[..., Any])

_METADATA_KEY = "minibroker.setting"


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the setting and the fix."""


@dataclass(frozen=True)
class Setting:
    """What a field declares: everything but its name, which the field gives it."""

    doc: str
    kind: Kind
    default: Any = MISSING  # MISSING: required
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] = ()  # kind "choice": accepted in any case, kept upper-case
    parse: Parser | None = None  # kind "text": the flag's text -> the field's value
    shown_default: str | None = None  # --help and README, when not the value itself
    topic_config: TopicConfigDef | None = None  # the topic config it is the default of
    # True: the default is stored with each new topic that does not set the topic
    # config (the controller's); False: it applies to every topic without one (a
    # broker's), at once.
    at_creation: bool = False
    role: Role = "setting"
    # The flag's name when one setting fills several fields (`--listen` ->
    # listen_host, listen_port: see `part`); otherwise the field's name is used.
    name: str | None = None

    def part(self, index: int) -> Any:
        """The field that holds item `index` of the parsed value (a setting whose
        parser returns a tuple, one item per field)."""
        if self.name is None or self.parse is None:
            raise InvariantError("a setting split over several fields needs a name and a parser")
        return dataclasses.field(
            default=self.parse(self.default, option="default")[index],
            metadata={_METADATA_KEY: (self, index)},
        )


def setting(
    default: Any = MISSING,
    *,
    doc: str,
    minimum: int | None = None,
    maximum: int | None = None,
    choices: tuple[str, ...] = (),
    parse: Parser | None = None,
    shown_default: str | None = None,
    kind: Kind | None = None,
) -> Any:
    """Declare a setting as a dataclass field: `x: int = setting(5, minimum=1, doc=...)`.
    With `parse`, the default is the flag's text and the field holds its parsed value."""
    kind = kind or _kind_of(default, parse=parse, choices=choices, minimum=minimum)
    # Positional, in Setting's field order.
    return _field(Setting(doc, kind, default, minimum, maximum, choices, parse, shown_default))


def topic_setting(definition: TopicConfigDef, *, at_creation: bool = False) -> Any:
    """Declare the setting that gives a topic config its cluster-wide default: doc,
    type, default and bounds are the topic config's (protocol/topic_configs.py)."""
    declared = Setting(
        doc=definition.doc,
        kind="bool" if definition.type == "boolean" else "int",
        default=definition.default,
        minimum=definition.minimum,
        maximum=definition.maximum,
        topic_config=definition,
        at_creation=at_creation,
    )
    return _field(declared)


def unsafe_switch(doc: str) -> Any:
    """Declare a test-only switch that turns a protection off; refused unless test
    faults are enabled (`refusal`)."""
    return _field(Setting(doc=doc, kind="bool", default=False, role="unsafe"))


def enable_test_faults_switch(*, follow_environment: bool = False) -> Any:
    """Declare `--enable-test-faults`. With `follow_environment`, a config built in code
    takes its value from MINIBROKER_ENABLE_TEST_FAULTS too."""
    declared = Setting(doc=TEST_FAULTS_DOC, kind="bool", default=False, role="test-faults")
    if not follow_environment:
        return _field(declared)
    return dataclasses.field(
        default_factory=lambda: os.environ.get(TEST_FAULTS_ENV) == "1",
        metadata={_METADATA_KEY: (declared, None)},
    )


def _kind_of(
    default: Any, *, parse: Parser | None, choices: tuple[str, ...], minimum: int | None
) -> Kind:
    if parse is not None:
        return "text"
    if choices:
        return "choice"
    if isinstance(default, bool):
        return "bool"
    if isinstance(default, int) or minimum is not None:
        return "int"
    if isinstance(default, Path):
        return "path"
    raise InvariantError(f"cannot tell the kind of a setting with default {default!r}")


def _field(declared: Setting) -> Any:
    metadata = {_METADATA_KEY: (declared, None)}
    default = declared.default
    if default is MISSING:
        return dataclasses.field(metadata=metadata)
    if declared.kind in ("path", "file") and isinstance(default, str):
        return dataclasses.field(default=Path(default), metadata=metadata)
    if declared.parse is not None and isinstance(default, str):
        # A fresh parsed value per instance: it may be a list or a dict.
        parse = functools.partial(declared.parse, default, option="default")
        return dataclasses.field(default_factory=parse, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def parse_host_port(value: str, *, option: str, allow_port_zero: bool = False) -> tuple[str, int]:
    """`HOST:PORT` (IPv6 as `[::1]:9093`); port 0 (any free port) only where allowed."""
    host, sep, port_text = value.strip().rpartition(":")
    lowest = 0 if allow_port_zero else 1
    if not sep or not host or not port_text.isdigit() or not lowest <= int(port_text) <= 65535:
        raise ConfigError(
            f"{option}: {value!r} is not HOST:PORT with a port in {lowest}..65535 "
            "(e.g. 127.0.0.1:9093)"
        )
    return host.strip("[]"), int(port_text)


# ------------------------------------------------------------------ the declarations


@dataclass(frozen=True)
class Declared:
    """A declared setting with its name and the fields it fills."""

    name: str
    setting: Setting
    fields: tuple[str, ...]

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def toml_key(self) -> str:
        return self.name.replace("_", "-")

    def default_text(self) -> str:
        """The default as --help and the README show it."""
        s = self.setting
        if s.shown_default is not None:
            return s.shown_default
        if s.default is MISSING:
            return "required"
        if s.default is None:
            return "none"
        if isinstance(s.default, bool):
            return "true" if s.default else "false"
        return str(s.default)

    def help_text(self, *, markdown: bool = False) -> str:
        s = self.setting
        if s.topic_config is None:
            return s.doc
        name = f"`{s.topic_config.name}`" if markdown else s.topic_config.name
        if s.at_creation:
            return f"{s.doc} Given to each new topic that does not set {name}."
        return f"{s.doc} Topic config {name} overrides it per topic."

    def click_option(self) -> Callable[[Command], Command]:
        s = self.setting
        attrs: dict[str, Any] = {
            "envvar": self.env,
            "show_envvar": True,
            "help": self.help_text(),
        }
        if s.default is MISSING:
            attrs["required"] = True
        else:
            attrs["default"] = s.default
            shown = s.shown_default or ("none" if s.default is None else None)
            attrs["show_default"] = shown or True
        if s.kind == "int":
            attrs["type"] = click.IntRange(min=s.minimum, max=s.maximum)
        elif s.kind == "bool":
            # A bare flag means true; `--flag false` and MINIBROKER_FLAG=0 also work.
            attrs.update(type=click.BOOL, is_flag=False, flag_value=True)
        elif s.kind == "choice":
            attrs["type"] = click.Choice(s.choices, case_sensitive=False)
        elif s.kind == "path":
            attrs["type"] = click.Path(file_okay=False, path_type=Path)
        elif s.kind == "file":
            attrs["type"] = click.Path(dir_okay=False, path_type=Path)
        return click.option(self.flag, self.name, **attrs)

    def from_command_line(self, value: Any) -> dict[str, Any]:
        """The field values for the option's value (parsed; ValueError names the flag)."""
        s = self.setting
        if value is None or (value == "" and s.default is None):
            parsed = None
        elif s.kind == "text" and s.parse is not None:
            parsed = s.parse(value, option=self.flag)
        elif s.kind == "choice":
            parsed = str(value).upper()
        else:
            parsed = value
        if len(self.fields) == 1:
            return {self.fields[0]: parsed}
        return dict(zip(self.fields, parsed, strict=True))

    def problems(self, config: object) -> list[str]:
        """What is wrong with this setting's value in `config` (type, bounds, choices)."""
        s = self.setting
        if len(self.fields) != 1 or s.kind in ("text", "path", "file"):
            return []  # parsed values were checked by their parser
        value = getattr(config, self.fields[0])
        if s.kind == "bool":
            return [] if isinstance(value, bool) else [f"{self.flag} must be true or false"]
        if s.kind == "choice":
            if isinstance(value, str) and value.upper() in s.choices:
                return []
            return [f"{self.flag} must be one of {', '.join(s.choices)}, got {value!r}"]
        if value is None and s.default is None:
            return []
        if not isinstance(value, int) or isinstance(value, bool):
            return [f"{self.flag} must be an integer, got {value!r}"]
        if s.minimum is not None and value < s.minimum:
            return [f"{self.flag} must be >= {s.minimum}, got {value}"]
        if s.maximum is not None and value > s.maximum:
            return [f"{self.flag} must be <= {s.maximum}, got {value}"]
        return []


@functools.cache
def settings_of(config_class: type) -> tuple[Declared, ...]:
    """The settings a config dataclass declares, in field order."""
    parts: dict[int, tuple[Setting, list[tuple[int, str]]]] = {}
    singles: dict[int, Declared] = {}
    order: list[int] = []
    for f in dataclasses.fields(config_class):
        ref = f.metadata.get(_METADATA_KEY)
        if ref is None:
            continue
        declared, index = ref
        key = id(declared)
        if key not in parts and key not in singles:
            order.append(key)
        if index is None:
            singles[key] = Declared(declared.name or f.name, declared, (f.name,))
        else:
            parts.setdefault(key, (declared, []))[1].append((index, f.name))
    out = []
    for key in order:
        if key in singles:
            out.append(singles[key])
            continue
        declared, fields = parts[key]
        if declared.name is None:
            raise InvariantError(f"{config_class.__name__}: a split setting needs a name")
        out.append(Declared(declared.name, declared, tuple(name for _, name in sorted(fields))))
    return tuple(out)


# ------------------------------------------------------------------ checks


def problems(config: object) -> list[str]:
    """Every declared setting of `config` whose value is out of its type or bounds."""
    return [p for d in settings_of(type(config)) for p in d.problems(config)]


def topic_defaults(config: object, scope: str = "log") -> dict[str, Any]:
    """The topic-config defaults `config` sets, by the topic config's field name
    (`segment_bytes`), for the topic configs of `scope`."""
    return {
        d.setting.topic_config.field: getattr(config, d.fields[0])
        for d in settings_of(type(config))
        if d.setting.topic_config is not None and d.setting.topic_config.scope == scope
    }


def unsafe_switches_on(config: object) -> tuple[str, ...]:
    """The test-only switches that are on, by flag name without dashes."""
    return tuple(
        d.toml_key
        for d in settings_of(type(config))
        if d.setting.role == "unsafe" and getattr(config, d.fields[0])
    )


def refusal(config: object) -> str | None:
    """Why `config` must be refused: a test-only switch on without test faults."""
    on = unsafe_switches_on(config)
    enabled = any(
        getattr(config, d.fields[0])
        for d in settings_of(type(config))
        if d.setting.role == "test-faults"
    )
    if not on or enabled:
        return None
    return (
        f"{', '.join('--' + name for name in on)}: test-only switch(es) that turn a "
        "protection off; refused unless --enable-test-faults (or "
        f"{TEST_FAULTS_ENV}=1) is given too. Never use them in production."
    )


def announce_test_switches(config: object, log: logging.Logger, process: str) -> None:
    """Log, loudly, that test faults are on and what each unsafe switch that is on
    turns off (its declaration's doc): one place for every process's warning."""
    log.warning("TEST FAULTS ENABLED: never use this in production (%s)", process)
    for d in settings_of(type(config)):
        if d.setting.role == "unsafe" and getattr(config, d.fields[0]):
            log.warning("UNSAFE TEST SWITCH %s is ON: %s", d.flag, d.setting.doc)


# ------------------------------------------------------------------ command line


def options(config_class: type) -> Callable[[Command], Command]:
    """The click options of every declared setting of `config_class`, plus `--config`."""

    def decorate(command: Command) -> Command:
        decorators = [_config_file_option(), *(d.click_option() for d in settings_of(config_class))]
        for decorator in reversed(decorators):  # click lists options in decorator order
            command = decorator(command)
        return command

    return decorate


def build(config_class: type[Any], values: Mapping[str, Any]) -> Any:
    """The config for click's option values; click.UsageError (exit code 2) names the
    setting that cannot be used."""
    fields: dict[str, Any] = {}
    try:
        for declared in settings_of(config_class):
            fields.update(declared.from_command_line(values[declared.name]))
        config = config_class(**fields)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    refused = refusal(config)
    if refused:
        raise click.UsageError(refused)
    return config


def _config_file_option() -> Callable[[Command], Command]:
    return click.option(
        "--config",
        type=click.Path(dir_okay=False),
        envvar=CONFIG_ENV,
        show_envvar=True,
        is_eager=True,
        expose_value=False,
        callback=_load_toml,
        help=CONFIG_DOC,
    )


def _load_toml(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    """Eager: check the TOML file's settings and put them in click's default_map, below
    flags and environment variables."""
    if not value:
        return
    path = Path(value)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise click.BadParameter(f"cannot read {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"{path} is not valid TOML: {exc}") from None
    known = {p.name: p for p in ctx.command.params if p.name and p.name != "config"}
    defaults: dict[str, Any] = {}
    for key, item in data.items():
        option = known.get(key.replace("-", "_"))
        if option is None:
            names = ", ".join(sorted(name.replace("_", "-") for name in known))
            raise click.BadParameter(f"unknown key {key!r} in {path}; known keys: {names}")
        defaults[option.name or key] = _toml_value(ctx, option, path, key, item)
    ctx.default_map = {**(ctx.default_map or {}), **defaults}


def _toml_value(
    ctx: click.Context, option: click.Parameter, path: Path, key: str, item: object
) -> object:
    """`item` if the option takes it (checked now, so the error names the file)."""
    wants_bool = option.type is click.BOOL
    problem = None
    if isinstance(item, dict | list):
        problem = "must be a single value, not a table or an array"
    elif isinstance(item, bool) != wants_bool:
        problem = "must be true or false" if wants_bool else "must not be true or false"
    else:
        try:
            option.type.convert(item, option, ctx)
        except click.BadParameter as exc:
            problem = exc.message
    if problem:
        raise click.BadParameter(f"{path}: {key} = {item!r}: {problem}")
    return item


# ------------------------------------------------------------------ README


def markdown_table(config_class: type) -> str:
    """The README table of `config_class`'s settings (test-only switches apart)."""
    rows = ["| flag | environment | default | meaning |", "|---|---|---|---|"]
    for d in settings_of(config_class):
        if d.setting.role == "setting":
            rows.append(
                f"| `{d.flag}` | `{d.env}` | {_cell(d.default_text())} | "
                f"{_cell(d.help_text(markdown=True))} |"
            )
    rows.append(f"| `--config` | `{CONFIG_ENV}` | - | {_cell(CONFIG_DOC)} |")
    return "\n".join(rows)


def switch_rows(config_class: type) -> list[tuple[str, str]]:
    """(flag, doc) of `config_class`'s test-only switches, the enabling one first."""
    found = [d for d in settings_of(config_class) if d.setting.role != "setting"]
    found.sort(key=lambda d: d.setting.role != "test-faults")
    return [(d.flag, d.setting.doc) for d in found]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")
