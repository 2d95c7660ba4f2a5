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
from protocol.kafka.primitives import F64
from protocol.kafka.primitives import I8
from protocol.kafka.primitives import I16
from protocol.kafka.primitives import I32
from protocol.kafka.primitives import I64
from protocol.kafka.primitives import Reader
from protocol.kafka.primitives import Writer
from protocol.kafka.primitives import read_uvarint
from protocol.kafka.primitives import write_uvarint

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
#
# Generated code reads from locals `d` (the payload: bytes, or a memoryview of bytes),
# `mv` (a memoryview of it, for record sets) and `p` (the offset), and writes into the
# local bytearray `buf` (the Writer's current buffer, `w`). A fixed-size read past the
# end raises struct.error or IndexError: the generated function turns both into one
# DecodeError, so a fixed-size read costs no bounds check of its own. Lengths and
# counts are checked before they are used.


class _Emit:
    """The source lines of one generated function and the values they name."""

    def __init__(self, version: int, flexible: bool) -> None:
        self.version = version
        self.flexible = flexible
        self.lines: list[str] = []
        self.values: dict[str, Any] = {
            "DecodeError": DecodeError,
            "_read_uvarint": read_uvarint,
            "_write_uvarint": write_uvarint,
            "_bad_length": _bad_length,
            "_lying_count": _lying_count,
            "_parted": _parted,
        }
        self._names = 0

    def bind(self, value: Any) -> str:
        name = f"_g{len(self.values)}"
        self.values[name] = value
        return name

    def name(self, prefix: str) -> str:
        self._names += 1
        return f"{prefix}{self._names}"

    def add(self, indent: str, *lines: str) -> None:
        self.lines += [indent + line for line in lines]

    def read_uvarint(self, indent: str, target: str) -> None:
        self.add(
            indent,
            f"{target} = d[p]",
            "p += 1",
            f"if {target} >= 0x80:  # more than one byte: rare",
            f"    {target}, p = _read_uvarint(d, p - 1)",
        )

    def read_length(self, indent: str, target: str, packing: struct.Struct) -> None:
        """A length or count into `target` (-1: null): compact (UNSIGNED_VARINT n+1) in
        flexible versions, else `packing` (INT16 or INT32)."""
        if self.flexible:
            self.read_uvarint(indent, target)
            self.add(indent, f"{target} -= 1")
        else:
            bound = self.bind(packing)
            self.add(indent, f"{target}, = {bound}.unpack_from(d, p)", f"p += {packing.size}")

    def write_length(self, indent: str, n: str, packing: struct.Struct) -> None:
        """Length or count `n`: an expression of an int, or "None" for a null."""
        if self.flexible:
            self.add(
                indent,
                f"_n = {0 if n == 'None' else f'{n} + 1'}",
                "if _n < 0x80:",
                "    buf.append(_n)",
                "else:",
                "    _write_uvarint(buf, _n)",
            )
        else:
            self.add(indent, f"buf += {self.bind(packing)}.pack({-1 if n == 'None' else n})")

    def compile(self, name: str) -> Callable[..., Any]:
        exec("\n".join(self.lines) + "\n", self.values)
        function: Callable[..., Any] = self.values[name]
        return function


def _bad_length(what: str, n: int, nullable: bool, left: int) -> None:
    """Raise the DecodeError a length `n` that cannot be read deserves."""
    if n == -1:
        if not nullable:
            raise DecodeError(f"{what} length -1 (null where a value is required)")
        return
    if n < -1:
        raise DecodeError(f"{what} length {n}")
    raise DecodeError(f"truncated {what}: {n} bytes needed, {left} left")


def _lying_count(n: int, left: int) -> DecodeError:
    return DecodeError(
        f"ARRAY count {n} cannot fit in the {left} bytes left (truncated, or the count lies)"
    )


def _parted(w: Writer, buf: bytearray, data: bytes | bytearray | memoryview) -> bytearray:
    """A big record set becomes a part of its own (not copied); writing goes on in a
    new buffer, returned."""
    w._parts.append(buf)
    w._parts.append(data)
    w._size += len(buf) + len(data)
    w._buf = bytearray()
    return w._buf


class WireType:
    """One wire type: the Python source that reads and writes a value of it (emitted
    into each struct's generated reader and writer), and its smallest encoding."""

    def read(self, r: Reader, version: int, flexible: bool, nullable: bool) -> Any:
        return _one_value(self, version, flexible, nullable)[0](r)

    def write(self, w: Writer, value: Any, version: int, flexible: bool, nullable: bool) -> None:
        _one_value(self, version, flexible, nullable)[1](w, value)

    def min_size(self, version: int, flexible: bool) -> int:
        raise NotImplementedError

    def emit_read(self, e: _Emit, indent: str, target: str, nullable: bool) -> None:
        """Lines reading one value into local `target`."""
        raise NotImplementedError

    def emit_write(self, e: _Emit, indent: str, value: str, nullable: bool) -> None:
        """Lines writing the value of expression `value`."""
        raise NotImplementedError


@dataclass(frozen=True)
class _Fixed(WireType):
    packing: struct.Struct
    what: str

    def min_size(self, version: int, flexible: bool) -> int:
        return self.packing.size

    def emit_read(self, e: _Emit, indent: str, target: str, nullable: bool) -> None:
        packing = e.bind(self.packing)
        e.add(indent, f"{target}, = {packing}.unpack_from(d, p)", f"p += {self.packing.size}")

    def emit_write(self, e: _Emit, indent: str, value: str, nullable: bool) -> None:
        e.add(indent, f"buf += {e.bind(self.packing)}.pack({value})")


@dataclass(frozen=True)
class _Bool(WireType):
    def min_size(self, version: int, flexible: bool) -> int:
        return 1

    def emit_read(self, e: _Emit, indent: str, target: str, nullable: bool) -> None:
        e.add(
            indent,
            f"{target} = d[p]",
            "p += 1",
            f"if {target} > 1:",
            f"    raise DecodeError(f'BOOLEAN must be 0 or 1, got {{{target}}}')",
            f"{target} = {target} == 1",
        )

    def emit_write(self, e: _Emit, indent: str, value: str, nullable: bool) -> None:
        e.add(indent, f"buf.append(1 if {value} else 0)")


@dataclass(frozen=True)
class _Sized(WireType):
    """STRING (an INT16 length, UTF-8) and BYTES / RECORDS (an INT32 length; kept as a
    view of the payload, not copied; a big one written as a part of its own), lengths
    compact in flexible versions."""

    text: bool

    def min_size(self, version: int, flexible: bool) -> int:
        return 1 if flexible else (2 if self.text else 4)

    def emit_read(self, e: _Emit, indent: str, target: str, nullable: bool) -> None:
        n = e.name("_n")
        e.read_length(indent, n, self._packing)
        value = f"str(d[p:p + {n}], 'utf-8')" if self.text else f"mv[p:p + {n}]"
        e.add(
            indent,
            f"if {n} < 0 or {n} > len(d) - p:",
            f"    _bad_length({self._what!r}, {n}, {nullable}, len(d) - p)",
            f"    {target} = None",
            "else:",
            f"    {target} = {value}",
            f"    p += {n}",
        )

    def emit_write(self, e: _Emit, indent: str, value: str, nullable: bool) -> None:
        v = e.name("_v")
        e.add(indent, f"{v} = {value}", f"if {v} is None:")
        if nullable:
            e.write_length(indent + "    ", "None", self._packing)
        else:
            e.add(indent, f"    raise ValueError('null {self._what} where a value is required')")
        e.add(indent, "else:")
        inner = indent + "    "
        if self.text:
            e.add(inner, f"{v} = {v}.encode()")
        e.write_length(inner, f"len({v})", self._packing)
        if self.text:
            e.add(inner, f"buf += {v}")
        else:
            e.add(
                inner,
                f"if len({v}) >= {Writer.SCATTER_MIN_BYTES}:",
                f"    buf = _parted(w, buf, {v})",
                "else:",
                f"    buf += {v}",
            )

    @property
    def _what(self) -> str:
        return "STRING" if self.text else "BYTES"

    @property
    def _packing(self) -> struct.Struct:
        return I16 if self.text else I32


INT8 = _Fixed(I8, "INT8")
INT16 = _Fixed(I16, "INT16")
INT32 = _Fixed(I32, "INT32")
INT64 = _Fixed(I64, "INT64")
FLOAT64 = _Fixed(F64, "FLOAT64")
BOOL = _Bool()
STRING = _Sized(text=True)
BYTES = _Sized(text=False)
RECORDS = BYTES


@dataclass(frozen=True)
class Array(WireType):
    item: WireType

    def min_size(self, version: int, flexible: bool) -> int:
        return 1 if flexible else 4

    def emit_read(self, e: _Emit, indent: str, target: str, nullable: bool) -> None:
        n, item = e.name("_n"), e.name("_i")
        size = max(self.item.min_size(e.version, e.flexible), 1)
        e.read_length(indent, n, I32)
        e.add(
            indent,
            f"if {n} < 0:",
            f"    _bad_length('ARRAY', {n}, {nullable}, len(d) - p)",
            f"    {target} = None",
            f"elif {n} * {size} > len(d) - p:",
            f"    raise _lying_count({n}, len(d) - p)",
            "else:",
            f"    {target} = []",
            f"    for _ in range({n}):",
        )
        self.item.emit_read(e, indent + "        ", item, False)
        e.add(indent, f"        {target}.append({item})")

    def emit_write(self, e: _Emit, indent: str, value: str, nullable: bool) -> None:
        v, item = e.name("_v"), e.name("_i")
        e.add(indent, f"{v} = {value}")
        if nullable:
            e.add(indent, f"if {v} is None:")
            e.write_length(indent + "    ", "None", I32)
            e.add(indent, "else:")
            e.write_length(indent + "    ", f"len({v})", I32)
            e.add(indent, f"for {item} in {v} or ():")
        else:
            e.add(indent, f"if {v} is None:", f"    {v} = ()  # what a client can read")
            e.write_length(indent, f"len({v})", I32)
            e.add(indent, f"for {item} in {v}:")
        self.item.emit_write(e, indent + "    ", item, False)


_ONE_VALUE: dict[tuple[int, int, bool, bool], tuple[Callable[..., Any], Callable[..., None]]] = {}


def _one_value(
    wire: WireType, version: int, flexible: bool, nullable: bool
) -> tuple[Callable[[Reader], Any], Callable[[Writer, Any], None]]:
    """A reader and a writer of one value of `wire` (cached: the declared types live as
    long as the process), for tagged fields."""
    key = (id(wire), version, flexible, nullable)
    pair = _ONE_VALUE.get(key)
    if pair is None:
        e = _Emit(version, flexible)
        _emit_reader(e, "read", lambda indent: wire.emit_read(e, indent, "value", nullable))
        e.add("", "def write(w, value):", "    buf = w._buf")
        wire.emit_write(e, "    ", "value", nullable)
        e.compile("read")
        pair = _ONE_VALUE[key] = (e.values["read"], e.values["write"])
    return pair


def _emit_reader(e: _Emit, name: str, body: Callable[[str], None], what: str = "") -> None:
    """A function `name(r)` reading one value from Reader `r` with `body`: a read past
    the end, bad UTF-8 or a value the native class refuses is a DecodeError."""
    e.add(
        "",
        f"def {name}(r):",
        "    d = r._data",
        "    mv = memoryview(d)",
        "    p = r.pos",
        "    try:",
    )
    body("        ")
    e.add(
        "",
        "    except (_struct_error, IndexError):",
        "        raise DecodeError(f'truncated: a read at offset {p} of {len(d)}') from None",
        "    except UnicodeDecodeError as exc:",
        "        raise DecodeError(f'STRING is not UTF-8: {exc}') from None",
        "    except (TypeError, ValueError) as exc:",
        f"        raise DecodeError({what!r} + str(exc)) from None",
        "    r.pos = p",
        "    return value",
    )
    e.values["_struct_error"] = struct.error


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

    def write(
        self, w: Writer, value: Any, version: int, flexible: bool, nullable: bool = False
    ) -> None:
        self.writer(version, flexible)(w, value)

    def reader(self, version: int, flexible: bool) -> Callable[[Reader], Any]:
        """This struct's reader at a version: Python source generated from the plan
        (one straight line of reads, nested structs and arrays inlined, no call per
        field) and compiled once."""
        key = (version, flexible)
        reader = self._readers.get(key)
        if reader is None:
            e = _Emit(version, flexible)
            refused = f"{getattr(self.native, '__name__', 'struct')}: "
            _emit_reader(
                e, "read", lambda indent: self.emit_read(e, indent, "value", False), refused
            )
            reader = self._readers[key] = e.compile("read")
        return reader

    def writer(self, version: int, flexible: bool) -> Callable[[Writer, Any], None]:
        """This struct's writer at a version, generated and compiled as `reader` is."""
        key = (version, flexible)
        writer = self._writers.get(key)
        if writer is None:
            e = _Emit(version, flexible)
            e.add("", "def write(w, value):", "    buf = w._buf")
            self.emit_write(e, "    ", "value", False)
            writer = self._writers[key] = e.compile("write")
        return writer

    def emit_read(self, e: _Emit, indent: str, target: str, nullable: bool) -> None:
        plan = self.plan(e.version, e.flexible)
        names: list[tuple[str, str]] = []
        run: list[tuple[str, _Fixed]] = []  # consecutive fixed-size fields

        def flush_run() -> None:
            if not run:
                return
            packing = struct.Struct(">" + "".join(t.packing.format[1:] for _, t in run))
            targets = ", ".join(var for var, _ in run)
            e.add(indent, f"{targets}, = {e.bind(packing)}.unpack_from(d, p)")
            e.add(indent, f"p += {packing.size}")
            run.clear()

        for f, can_be_null in plan.regular:
            var = e.name("_f")
            if f.mapped:
                names.append((f.name, var))
            if isinstance(f.type, _Fixed):
                run.append((var, f.type))
            else:
                flush_run()
                f.type.emit_read(e, indent, var, can_be_null)
            if f.mapped and f.to_native is not None:
                flush_run()
                e.add(indent, f"{var} = {e.bind(f.to_native)}({var})")
        flush_run()
        build = e.bind(self.native) if self.native is not None else "dict"
        keywords = ", ".join(f"{name}={var}" for name, var in names)
        if not e.flexible:
            e.add(indent, f"{target} = {build}({keywords})")
            return
        # Tagged fields: a count, nearly always 0 (then nothing more to read).
        tags = e.name("_t")
        e.read_uvarint(indent, tags)
        e.add(
            indent,
            f"if not {tags}:",
            f"    {target} = {build}({keywords})",
            "else:",
            f"    _values = {{{', '.join(f'{name!r}: {var}' for name, var in names)}}}",
            "    r.pos = p",
            f"    {e.bind(KStruct._read_tagged)}(r, {e.bind(plan)}, {e.version}, _values, {tags})",
            "    p = r.pos",
            f"    {target} = {build}(**_values)",
        )

    def emit_write(self, e: _Emit, indent: str, value: str, nullable: bool) -> None:
        plan = self.plan(e.version, e.flexible)
        obj = e.name("_o")
        e.add(indent, f"{obj} = {value}")
        run: list[str] = []  # consecutive fixed-size values

        def flush_run(packing: list[struct.Struct]) -> None:
            if run:
                joined = struct.Struct(">" + "".join(s.format[1:] for s in packing))
                e.add(indent, f"buf += {e.bind(joined)}.pack({', '.join(run)})")
                run.clear()
                packing.clear()

        packings: list[struct.Struct] = []
        for f, can_be_null in plan.regular:
            if not f.mapped:
                source = e.bind(f.default)
            elif self.native is None:
                source = f"{obj}.get({f.name!r}, {e.bind(f.default)})"
            else:
                source = f"{obj}.{f.name}"
            if f.mapped and f.from_native is not None:
                source = f"{e.bind(f.from_native)}({source})"
            if isinstance(f.type, _Fixed):
                run.append(source)
                packings.append(f.type.packing)
                continue
            flush_run(packings)
            f.type.emit_write(e, indent, source, can_be_null)
        flush_run(packings)
        if e.flexible:
            if plan.tagged:
                e.add(
                    indent,
                    f"{e.bind(KStruct._write_tagged)}(w, {e.bind(plan)}, {obj}, {e.version})",
                    "buf = w._buf",
                )
            else:
                e.add(indent, "buf.append(0)  # no tagged fields")

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
