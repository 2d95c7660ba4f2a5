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

Per (struct, version) the fields present are worked out once and cached (`_Plan`).
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
    """One wire type: how a value is read and written, and its smallest encoding."""

    def read(self, r: Reader, version: int, flexible: bool, nullable: bool) -> Any:
        raise NotImplementedError

    def write(self, w: Writer, value: Any, version: int, flexible: bool, nullable: bool) -> None:
        raise NotImplementedError

    def min_size(self, version: int, flexible: bool) -> int:
        raise NotImplementedError


@dataclass(frozen=True)
class _Fixed(WireType):
    packing: struct.Struct
    what: str

    def read(self, r: Reader, version: int, flexible: bool, nullable: bool) -> Any:
        return r.fixed(self.packing, self.what)

    def write(self, w: Writer, value: Any, version: int, flexible: bool, nullable: bool) -> None:
        w.fixed(self.packing, value)

    def min_size(self, version: int, flexible: bool) -> int:
        return self.packing.size


@dataclass(frozen=True)
class _Bool(WireType):
    def read(self, r: Reader, version: int, flexible: bool, nullable: bool) -> Any:
        return r.boolean()

    def write(self, w: Writer, value: Any, version: int, flexible: bool, nullable: bool) -> None:
        w.boolean(value)

    def min_size(self, version: int, flexible: bool) -> int:
        return 1


@dataclass(frozen=True)
class _Sized(WireType):
    """STRING (an INT16 length) or BYTES / RECORDS (an INT32 length; a record set is
    kept as a view of the payload, not copied); compact in flexible versions."""

    kind: str  # the Reader/Writer method: "string" or "bytes_"
    length_size: int

    def read(self, r: Reader, version: int, flexible: bool, nullable: bool) -> Any:
        return getattr(r, self.kind)(compact=flexible, nullable=nullable)

    def write(self, w: Writer, value: Any, version: int, flexible: bool, nullable: bool) -> None:
        getattr(w, self.kind)(value, compact=flexible, nullable=nullable)

    def min_size(self, version: int, flexible: bool) -> int:
        return 1 if flexible else self.length_size


INT8 = _Fixed(I8, "INT8")
INT16 = _Fixed(I16, "INT16")
INT32 = _Fixed(I32, "INT32")
INT64 = _Fixed(I64, "INT64")
BOOL = _Bool()
STRING = _Sized("string", 2)
BYTES = _Sized("bytes_", 4)
RECORDS = _Sized("bytes_", 4)


@dataclass(frozen=True)
class Array(WireType):
    item: WireType

    def read(self, r: Reader, version: int, flexible: bool, nullable: bool) -> Any:
        item = self.item
        n = r.array_length(compact=flexible, min_item_size=item.min_size(version, flexible))
        if n < 0:
            if nullable:
                return None
            raise DecodeError("null ARRAY where a value is required")
        return [item.read(r, version, flexible, False) for _ in range(n)]

    def write(self, w: Writer, value: Any, version: int, flexible: bool, nullable: bool) -> None:
        if value is None and not nullable:
            value = []  # what a client gets instead of a null it cannot read
        w.array_length(None if value is None else len(value), compact=flexible)
        for item in value or ():
            self.item.write(w, item, version, flexible, False)

    def min_size(self, version: int, flexible: bool) -> int:
        return 1 if flexible else 4


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
        if not self.mapped and self.default is None and isinstance(self.type, _Fixed | _Bool):
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

    def plan(self, version: int, flexible: bool) -> _Plan:
        key = (version, flexible)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = _Plan(self.fields, version, flexible)
        return plan

    def read(self, r: Reader, version: int, flexible: bool, nullable: bool = False) -> Any:
        plan = self.plan(version, flexible)
        values: dict[str, Any] = {}
        for f, can_be_null in plan.regular:
            value = f.type.read(r, version, flexible, can_be_null)
            if f.mapped:
                values[f.name] = f.to_native(value) if f.to_native else value
        if flexible:
            self._read_tagged(r, plan, version, values)
        if self.native is None:
            return values
        try:
            return self.native(**values)
        except (TypeError, ValueError) as exc:  # a value the native class refuses
            raise DecodeError(f"{self.native.__name__}: {exc}") from None

    @staticmethod
    def _read_tagged(r: Reader, plan: _Plan, version: int, values: dict[str, Any]) -> None:
        previous = -1
        for _ in range(r.uvarint()):
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
        plan = self.plan(version, flexible)
        for f, can_be_null in plan.regular:
            f.type.write(w, self._value(f, value), version, flexible, can_be_null)
        if flexible:
            tagged = []
            for tag, f in sorted(plan.tagged.items()):
                item = self._value(f, value)
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
