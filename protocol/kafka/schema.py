"""How a Kafka message is declared once and read or written at any served version.

A message is a `KStruct`: the native message class it maps onto (protocol/messages)
and its fields in wire order. Each `Field` names the native attribute it fills, its
wire type, the versions it exists in, the versions in which it may be null, and, for
a tagged field, its tag. The declarations (protocol/kafka/apis.py) are written from
Kafka's protocol guide and message definitions; one declaration serves every version,
so a field added in version N is one line with `versions="N+"`.

Reading a version: the fields present in it, in order; in a flexible version (compact
strings, bytes and arrays, tagged fields) each struct ends with its tagged fields,
where unknown tags are skipped, as Kafka does. A field the native class does not have
(`mapped=False`) is read and dropped, and written as its `default`. A native attribute
that a version does not carry keeps the native class's default when read and is not
written.

Per (struct, version) the fields present are worked out once (`_Plan`), and from the
plan a reader and a writer are generated as Python source (one straight line of reads
or writes, no per-field dispatch; runs of fixed-size fields unpacked at once) and
compiled once: what the codec runs for every request and answer (bench/README.md,
issue 15, for what it costs against MessagePack).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from typing import Any

from protocol.errors import DecodeError
from protocol.kafka.primitives import I8
from protocol.kafka.primitives import I16
from protocol.kafka.primitives import I32
from protocol.kafka.primitives import I64
from protocol.kafka.primitives import Reader
from protocol.kafka.primitives import Writer

MAX_VERSION = 0x7FFF


def versions(spec: str) -> tuple[int, int]:
    """ "3+" -> (3, MAX), "2-5" -> (2, 5), "4" -> (4, 4), "none" -> empty."""
    if spec == "none":
        return (1, 0)
    if spec.endswith("+"):
        return (int(spec[:-1]), MAX_VERSION)
    lo, _, hi = spec.partition("-")
    return (int(lo), int(hi or lo))


def _in(span: tuple[int, int], version: int) -> bool:
    return span[0] <= version <= span[1]


# ------------------------------------------------------------------ wire types


class WireType:
    """One wire type: the Python source that reads and writes a value of it (compiled
    into each struct's reader and writer), and its smallest encoding."""

    def read(self, r: Reader, version: int, flexible: bool, nullable: bool) -> Any:
        return _one_value(self, version, flexible, nullable)[0](r)

    def write(self, w: Writer, value: Any, version: int, flexible: bool, nullable: bool) -> None:
        _one_value(self, version, flexible, nullable)[1](w, value)

    def min_size(self, version: int, flexible: bool) -> int:
        raise NotImplementedError

    def read_source(self, version: int, flexible: bool, nullable: bool, ns: _Namespace) -> str:
        """A Python expression reading one value from `r` (see KStruct.reader)."""
        raise NotImplementedError

    def write_source(
        self, value: str, version: int, flexible: bool, nullable: bool, ns: _Namespace
    ) -> str:
        """A Python statement writing the value of expression `value` to `w`."""
        raise NotImplementedError


@dataclass(frozen=True)
class _Fixed(WireType):
    packing: struct.Struct
    what: str

    def min_size(self, version: int, flexible: bool) -> int:
        return self.packing.size

    def read_source(self, version: int, flexible: bool, nullable: bool, ns: _Namespace) -> str:
        return f"r.fixed({ns.bind(self.packing)}, {self.what!r})"

    def write_source(
        self, value: str, version: int, flexible: bool, nullable: bool, ns: _Namespace
    ) -> str:
        return f"w.fixed({ns.bind(self.packing)}, {value})"


@dataclass(frozen=True)
class _Plain(WireType):
    """BOOLEAN, STRING (an INT16 length) and BYTES / RECORDS (an INT32 length; a record
    set is kept as a view of the payload, not copied), lengths compact in flexible
    versions: a Reader and a Writer method each, called as `read_call` and `write_call` say."""

    read_call: str  # formatted with flexible, nullable
    write_call: str  # formatted with value, flexible, nullable
    size: int
    compact_size: int

    def min_size(self, version: int, flexible: bool) -> int:
        return self.compact_size if flexible else self.size

    def read_source(self, version: int, flexible: bool, nullable: bool, ns: _Namespace) -> str:
        return self.read_call.format(flexible=flexible, nullable=nullable)

    def write_source(
        self, value: str, version: int, flexible: bool, nullable: bool, ns: _Namespace
    ) -> str:
        return self.write_call.format(value=value, flexible=flexible, nullable=nullable)


_LENGTHS = "compact={flexible}, nullable={nullable}"


INT8 = _Fixed(I8, "INT8")
INT16 = _Fixed(I16, "INT16")
INT32 = _Fixed(I32, "INT32")
INT64 = _Fixed(I64, "INT64")
BOOL = _Plain("r.boolean()", "w.boolean({value})", 1, 1)
STRING = _Plain(f"r.string({_LENGTHS})", f"w.string({{value}}, {_LENGTHS})", 2, 1)
BYTES = _Plain(f"r.bytes_({_LENGTHS})", f"w.bytes_({{value}}, {_LENGTHS})", 4, 1)
RECORDS = BYTES


@dataclass(frozen=True)
class Array(WireType):
    item: WireType

    def min_size(self, version: int, flexible: bool) -> int:
        return 1 if flexible else 4

    def read_source(self, version: int, flexible: bool, nullable: bool, ns: _Namespace) -> str:
        item = ns.bind(_one_value(self.item, version, flexible, False)[0])
        size = self.item.min_size(version, flexible)
        return f"_array(r, {item}, {flexible}, {size}, {nullable})"

    def write_source(
        self, value: str, version: int, flexible: bool, nullable: bool, ns: _Namespace
    ) -> str:
        item = ns.bind(_one_value(self.item, version, flexible, False)[1])
        return f"_write_array(w, {value}, {item}, {flexible}, {nullable})"


def _array(
    r: Reader, item: Callable[[Reader], Any], compact: bool, size: int, nullable: bool
) -> Any:
    n = r.array_length(compact=compact, min_item_size=size)
    if n < 0:
        if nullable:
            return None
        raise DecodeError("null ARRAY where a value is required")
    return [item(r) for _ in range(n)]


def _write_array(
    w: Writer, value: Any, item: Callable[[Writer, Any], None], compact: bool, nullable: bool
) -> None:
    if value is None and not nullable:
        value = []  # what a client gets instead of a null it cannot read
    w.array_length(None if value is None else len(value), compact=compact)
    for one in value or ():
        item(w, one)


_ONE_VALUE: dict[tuple[int, int, bool, bool], tuple[Callable[..., Any], Callable[..., None]]] = {}


def _one_value(
    wire: WireType, version: int, flexible: bool, nullable: bool
) -> tuple[Callable[[Reader], Any], Callable[[Writer, Any], None]]:
    """A reader and a writer of one value of `wire` (cached: the declared types live as
    long as the process), for array items and tagged fields."""
    key = (id(wire), version, flexible, nullable)
    pair = _ONE_VALUE.get(key)
    if pair is None:
        ns = _Namespace()
        read = wire.read_source(version, flexible, nullable, ns)
        write = wire.write_source("v", version, flexible, nullable, ns)
        source = f"def read(r):\n    return {read}\ndef write(w, v):\n    {write}\n"
        exec(source, ns.values)
        pair = _ONE_VALUE[key] = (ns.values["read"], ns.values["write"])
    return pair


class _Namespace:
    """The globals of one generated reader or writer: the values its source names."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {
            "_array": _array,
            "_write_array": _write_array,
            "DecodeError": DecodeError,
        }

    def bind(self, value: Any) -> str:
        name = f"_g{len(self.values)}"
        self.values[name] = value
        return name


# ------------------------------------------------------------------ structs


@dataclass(frozen=True)
class Field:
    name: str  # the native attribute (or the dict key when the struct has no class)
    type: WireType
    versions: str = "0+"
    nullable: str = "none"
    tag: int | None = None  # a tagged field (flexible versions only)
    default: Any = None  # what is written when the value is not given
    mapped: bool = True  # False: the native class has no such attribute
    # Converters between the wire value and the native one, for shapes that differ
    # (a list of one-field structs on the wire, a list of names natively).
    to_native: Callable[[Any], Any] | None = None
    from_native: Callable[[Any], Any] | None = None

    def __post_init__(self) -> None:
        # An unmapped field is written as its default: a fixed-size one needs a value.
        fixed_size = isinstance(self.type, _Fixed) or self.type is BOOL
        if not self.mapped and self.default is None and fixed_size:
            raise ValueError(f"field {self.name}: unmapped, so it needs a default to write")


class _Plan:
    """The fields of one struct at one version: regular ones in order, tagged by tag."""

    __slots__ = ("min_size", "regular", "tagged")

    def __init__(self, fields: tuple[Field, ...], version: int, flexible: bool) -> None:
        present = [f for f in fields if _in(versions(f.versions), version)]
        self.regular = [
            (f, _in(versions(f.nullable), version))
            for f in present
            if f.tag is None or not flexible
        ]
        self.tagged = {f.tag: f for f in present if f.tag is not None and flexible}
        self.min_size = sum(f.type.min_size(version, flexible) for f, _ in self.regular) + int(
            flexible
        )


@dataclass(frozen=True)
class KStruct(WireType):
    native: type | None  # None: read as a dict
    fields: tuple[Field, ...]
    _plans: dict[tuple[int, bool], _Plan] = field(default_factory=dict, compare=False)
    _readers: dict[tuple[int, bool], Callable[[Reader], Any]] = field(
        default_factory=dict, compare=False
    )
    _writers: dict[tuple[int, bool], Callable[[Writer, Any], None]] = field(
        default_factory=dict, compare=False
    )

    def plan(self, version: int, flexible: bool) -> _Plan:
        key = (version, flexible)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = _Plan(self.fields, version, flexible)
        return plan

    def read(self, r: Reader, version: int, flexible: bool, nullable: bool = False) -> Any:
        return self.reader(version, flexible)(r)

    def read_source(self, version: int, flexible: bool, nullable: bool, ns: _Namespace) -> str:
        return f"{ns.bind(self.reader(version, flexible))}(r)"

    def reader(self, version: int, flexible: bool) -> Callable[[Reader], Any]:
        """This struct's reader at a version: Python source generated from the plan
        (one straight line of reads, no per-field dispatch) and compiled once."""
        key = (version, flexible)
        reader = self._readers.get(key)
        if reader is None:
            reader = self._readers[key] = self._compile_reader(version, flexible)
        return reader

    def _compile_reader(self, version: int, flexible: bool) -> Callable[[Reader], Any]:
        plan = self.plan(version, flexible)
        ns = _Namespace()
        lines = ["def read(r):"]
        names: list[tuple[str, str]] = []
        run: list[tuple[int, Field, _Fixed]] = []  # consecutive fixed-size fields

        def flush_run() -> None:
            if not run:
                return
            packing = struct.Struct(">" + "".join(t.packing.format[1:] for _, _, t in run))
            what = "+".join(t.what for _, _, t in run)
            targets = ", ".join(f"v{i}" for i, _, _ in run)
            lines.append(f"    {targets}, = r.fixed_run({ns.bind(packing)}, {what!r})")
            run.clear()

        for i, (f, can_be_null) in enumerate(plan.regular):
            if f.mapped:
                names.append((f.name, f"v{i}"))
            if isinstance(f.type, _Fixed) and not (f.mapped and f.to_native is not None):
                run.append((i, f, f.type))
                continue
            flush_run()
            source = f.type.read_source(version, flexible, can_be_null, ns)
            if f.mapped and f.to_native is not None:
                source = f"{ns.bind(f.to_native)}({source})"
            lines.append(f"    v{i} = {source}")
        flush_run()
        values = "{" + ", ".join(f"{name!r}: {var}" for name, var in names) + "}"
        keywords = ", ".join(f"{name}={var}" for name, var in names)
        if self.native is None:
            build = {"values": "values", "keywords": values}
        else:
            native = ns.bind(self.native)
            build = {"values": f"{native}(**values)", "keywords": f"{native}({keywords})"}
        refused = f"{getattr(self.native, '__name__', 'struct')}: "

        def returning(indent: str, call: str) -> list[str]:
            # A value the native class refuses is a DecodeError like any other bad input.
            return [
                f"{indent}try:",
                f"{indent}    return {call}",
                f"{indent}except (TypeError, ValueError) as exc:",
                f"{indent}    raise DecodeError({refused!r} + str(exc)) from None",
            ]

        if flexible:
            # Tagged fields: a count, nearly always 0 (then nothing more to read).
            ns.values["_tags"] = KStruct._read_tagged
            lines += [
                "    tags = r.uvarint()",
                "    if tags:",
                f"        values = {values}",
                f"        _tags(r, {ns.bind(plan)}, {version}, values, tags)",
                *returning("        ", build["values"]),
            ]
        lines += returning("    ", build["keywords"])
        exec("\n".join(lines) + "\n", ns.values)
        reader: Callable[[Reader], Any] = ns.values["read"]
        return reader

    @staticmethod
    def _read_tagged(
        r: Reader, plan: _Plan, version: int, values: dict[str, Any], count: int
    ) -> None:
        """`count` tagged fields (the count read by the caller) into `values`."""
        previous = -1
        for _ in range(count):
            tag = r.uvarint()
            if tag <= previous:
                raise DecodeError(f"tagged fields out of order: tag {tag} after {previous}")
            previous = tag
            data = r.raw(r.uvarint(), "tagged field")
            f = plan.tagged.get(tag)
            if f is None:
                continue  # a tag this version does not know: skipped, as Kafka does
            sub = Reader(data)
            value = f.type.read(sub, version, True, _in(versions(f.nullable), version))
            if sub.remaining:
                raise DecodeError(f"tagged field {tag} has {sub.remaining} bytes left over")
            if f.mapped:
                values[f.name] = f.to_native(value) if f.to_native else value

    def write(
        self, w: Writer, value: Any, version: int, flexible: bool, nullable: bool = False
    ) -> None:
        self.writer(version, flexible)(w, value)

    def write_source(
        self, value: str, version: int, flexible: bool, nullable: bool, ns: _Namespace
    ) -> str:
        return f"{ns.bind(self.writer(version, flexible))}(w, {value})"

    def writer(self, version: int, flexible: bool) -> Callable[[Writer, Any], None]:
        """This struct's writer at a version, generated and compiled as `reader` is."""
        key = (version, flexible)
        writer = self._writers.get(key)
        if writer is None:
            writer = self._writers[key] = self._compile_writer(version, flexible)
        return writer

    def _compile_writer(self, version: int, flexible: bool) -> Callable[[Writer, Any], None]:
        plan = self.plan(version, flexible)
        ns = _Namespace()
        lines = ["def write(w, obj):"]
        for f, can_be_null in plan.regular:
            if not f.mapped:
                value = ns.bind(f.default)
            elif self.native is None:
                value = f"obj.get({f.name!r}, {ns.bind(f.default)})"
            else:
                value = f"obj.{f.name}"
            if f.mapped and f.from_native is not None:
                value = f"{ns.bind(f.from_native)}({value})"
            lines.append("    " + f.type.write_source(value, version, flexible, can_be_null, ns))
        if flexible:
            ns.values["_tags"] = KStruct._write_tagged
            lines.append(f"    _tags(w, {ns.bind(plan)}, obj, {version})")
        if len(lines) == 1:
            lines.append("    pass")
        exec("\n".join(lines) + "\n", ns.values)
        writer: Callable[[Writer, Any], None] = ns.values["write"]
        return writer

    @staticmethod
    def _write_tagged(w: Writer, plan: _Plan, obj: Any, version: int) -> None:
        tagged = []
        for tag, f in sorted(plan.tagged.items()):
            item = KStruct._value(f, obj)
            if item is not None and item != f.default:
                sub = Writer()
                f.type.write(sub, item, version, True, _in(versions(f.nullable), version))
                tagged.append((tag, sub.getvalue()))
        w.uvarint(len(tagged))
        for tag, data in tagged:
            w.uvarint(tag)
            w.uvarint(len(data))
            w.raw(data)

    @staticmethod
    def _value(f: Field, obj: Any) -> Any:
        if not f.mapped:
            return f.default
        value = obj.get(f.name, f.default) if isinstance(obj, dict) else getattr(obj, f.name)
        return f.from_native(value) if f.from_native else value

    def min_size(self, version: int, flexible: bool) -> int:
        return self.plan(version, flexible).min_size
