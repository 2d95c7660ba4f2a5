"""Hypothesis strategies shared by the protocol tests.

`struct_strategy(cls)` walks a msgspec Struct with `msgspec.inspect` and draws
instances with every field either left at its default or set to any value of its
type, so a new field or a new message is covered without touching the tests. A
field type the walker does not know fails loudly instead of being skipped.
"""

from __future__ import annotations

import functools

import msgspec
import msgspec.inspect as mi
from hypothesis import strategies as st

from protocol import record_batch
from protocol.framing import frame

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1

# Sentinels and boundaries are where bugs live; mix them with the whole int64 range.
_SPECIAL_INTS = st.sampled_from([-2, -1, 0, 1, 2, INT32_MIN, INT32_MAX, INT64_MIN, INT64_MAX])
wire_ints = st.one_of(_SPECIAL_INTS, st.integers(-3, 1000), st.integers(INT64_MIN, INT64_MAX))
small_text = st.text(max_size=12)
small_bytes = st.binary(max_size=64)


def _bounded_ints(t: mi.IntType) -> st.SearchStrategy[int]:
    lo = INT64_MIN if t.ge is None else t.ge
    if t.gt is not None:
        lo = t.gt + 1
    hi = INT64_MAX if t.le is None else t.le
    if t.lt is not None:
        hi = t.lt - 1
    return st.integers(lo, hi)


def for_type(t: mi.Type) -> st.SearchStrategy:
    if isinstance(t, mi.IntType):
        if any(b is not None for b in (t.gt, t.ge, t.lt, t.le, t.multiple_of)):
            return _bounded_ints(t)
        return wire_ints
    if isinstance(t, mi.StrType):
        return st.text(min_size=t.min_length or 0, max_size=max(t.min_length or 0, 12))
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.FloatType):  # NaN never equals itself: a round trip cannot show it
        return st.floats(allow_nan=False)
    if isinstance(t, mi.BytesType | mi.MemoryViewType):
        return small_bytes
    if isinstance(t, mi.NoneType):
        return st.none()
    if isinstance(t, mi.ListType):
        return st.lists(for_type(t.item_type), max_size=3)
    if isinstance(t, mi.DictType):
        return st.dictionaries(for_type(t.key_type), for_type(t.value_type), max_size=3)
    if isinstance(t, mi.UnionType):
        return st.one_of([for_type(member) for member in t.types])
    if isinstance(t, mi.StructType):
        return struct_strategy(t.cls)
    raise TypeError(f"no strategy for msgspec type {t!r}: teach protocol_strategies about it")


@functools.cache
def struct_strategy(cls: type[msgspec.Struct]) -> st.SearchStrategy:
    """Instances of `cls`; optional fields are sometimes left at their default."""
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType), cls
    required = {f.name: for_type(f.type) for f in info.fields if f.required}
    optional = {f.name: for_type(f.type) for f in info.fields if not f.required}
    return st.fixed_dictionaries(required, optional=optional).map(lambda kw: cls(**kw))


def struct_types_reachable(cls: type[msgspec.Struct]) -> set[type]:
    """Every Struct type reachable from `cls` through its fields."""
    out: set[type] = set()

    def walk(t: mi.Type) -> None:
        if isinstance(t, mi.StructType):
            if t.cls in out:
                return
            out.add(t.cls)
            for f in t.fields:
                walk(f.type)
        elif isinstance(t, mi.ListType):
            walk(t.item_type)
        elif isinstance(t, mi.DictType):
            walk(t.key_type)
            walk(t.value_type)
        elif isinstance(t, mi.UnionType):
            for member in t.types:
                walk(member)

    walk(mi.type_info(cls))
    return out


# ---------------------------------------------------------------- msgpack-shaped junk

msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(INT64_MIN, 2**64 - 1)
    | st.floats(allow_nan=True)
    | small_text
    | small_bytes,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.one_of(small_text, st.integers(-5, 5)), inner, max_size=4)
    ),
    max_leaves=12,
)


# ---------------------------------------------------------------- record batches

record_headers = st.lists(st.tuples(small_text, st.none() | small_bytes), max_size=3)
# Epoch milliseconds up to the year 2109, plus Kafka's -1 "no timestamp".
timestamps = st.one_of(st.just(-1), st.integers(0, 2**42))
records = st.tuples(
    st.none() | small_bytes,  # key
    st.none() | small_bytes,  # value
    record_headers,
    timestamps,
)


@st.composite
def batches(draw, *, compression=None) -> bytes:
    if compression is None:
        compression = draw(st.sampled_from(list(record_batch.Compression)))
    items = draw(st.lists(records, min_size=1, max_size=5))
    return record_batch.encode_batch(
        items,
        base_offset=draw(st.integers(0, 2**40)),
        compression=compression,
        partition_leader_epoch=draw(st.integers(-1, INT32_MAX)),
    )


# ---------------------------------------------------------------- mutations


@st.composite
def mutated(draw, data: bytes) -> bytes:
    """`data` damaged in a few typical ways: bit flips, truncation, int32 fields set to
    huge or negative values, inserted or deleted bytes."""
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["flip", "truncate", "int32", "insert", "delete"]))
        if kind == "flip" and buf:
            i = draw(st.integers(0, len(buf) - 1))
            buf[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del buf[draw(st.integers(0, len(buf))) :]
        elif kind == "int32" and len(buf) >= 4:
            i = draw(st.integers(0, len(buf) - 4))
            value = draw(st.sampled_from([0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 0, 1, 0x40000000]))
            buf[i : i + 4] = value.to_bytes(4, "big")
        elif kind == "insert":
            i = draw(st.integers(0, len(buf)))
            buf[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete" and buf:
            i = draw(st.integers(0, len(buf) - 1))
            del buf[i : i + draw(st.integers(1, 8))]
    return bytes(buf)


def reframe(payload: bytes) -> bytes:
    """A frame whose length prefix is right, so the payload decoder gets to see it."""
    return frame(payload)
