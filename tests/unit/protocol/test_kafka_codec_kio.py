"""The Kafka codec against a second, independent oracle: kio 0.6.5's protocol classes
(generated from Apache Kafka's own message definitions; a test dependency only).

For every API and version served that kio knows (Kafka 4 dropped a few old versions:
Produce 0-2 are covered by the kafka-python oracle alone), requests and responses:

1. the declaration here lists exactly Kafka's fields at that version, in Kafka's order,
   with Kafka's types and tags (field by field against kio's class);
2. a kio message with a distinct value in every field, written by kio, decodes here and
   encodes back to the very same bytes, so every value landed in a native attribute and
   came back in its place. Fields the native messages do not carry are filled with what
   this codec writes for them, the only values it can give back.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
from collections.abc import Iterator
from typing import Any

import pytest
from kio.index import UnknownEntity
from kio.index import load_request_schema
from kio.index import load_response_schema
from kio.schema.errors import ErrorCode as KioErrorCode
from kio.schema.request_header.v1.header import RequestHeader as KioRequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as KioRequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as KioResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as KioResponseHeaderV1
from kio.serial import entity_reader
from kio.serial import entity_writer
from kio.serial._introspect import EntityField
from kio.serial._introspect import EntityTupleField
from kio.serial._introspect import PrimitiveTupleField
from kio.serial._introspect import classify_field
from kio.serial._introspect import is_optional

from protocol.connection import DecodedRequest
from protocol.errors import ErrorCode
from protocol.framing import RequestHeader
from protocol.kafka.api_spec import KafkaApi
from protocol.kafka.apis import KAFKA_APIS
from protocol.kafka.codec import decode_request
from protocol.kafka.codec import decode_response
from protocol.kafka.codec import encode_request
from protocol.kafka.codec import encode_response
from protocol.kafka.schema import BOOL
from protocol.kafka.schema import BYTES
from protocol.kafka.schema import FLOAT64
from protocol.kafka.schema import INT8
from protocol.kafka.schema import INT16
from protocol.kafka.schema import INT32
from protocol.kafka.schema import INT64
from protocol.kafka.schema import STRING
from protocol.kafka.schema import Array
from protocol.kafka.schema import Field
from protocol.kafka.schema import KStruct
from protocol.kafka.schema import WireType

CORRELATION_ID = 11
CLIENT_ID = "kio-oracle"

# Kafka's type names (kio's `kafka_type`) each wire type here may stand for.
KAFKA_TYPES: dict[int, set[str]] = {
    id(INT8): {"int8"},
    id(INT16): {"int16", "error_code"},
    id(INT32): {"int32", "timedelta_i32"},
    id(INT64): {"int64", "timedelta_i64", "datetime_i64"},
    id(STRING): {"string"},
    id(BOOL): {"bool"},
    id(BYTES): {"bytes", "records"},
    id(FLOAT64): {"float64"},
}

# Where a native attribute is named otherwise than Kafka's field today:
# (Kafka's message, native) -> Kafka's name.
RENAMED: dict[tuple[str, str], str] = {
    ("ProduceRequest", "topics"): "topic_data",
    ("ProduceResponse", "topics"): "responses",
    ("TopicProduceData", "partitions"): "partition_data",
    ("TopicProduceResponse", "partitions"): "partition_responses",
    # KIP-848 renamed it; the value is the classic protocol's generation here
    ("OffsetCommitRequest", "generation_id"): "generation_id_or_member_epoch",
    ("AclCreation", "pattern_type"): "resource_pattern_type",
    # An ACL filter (DescribeAcls, DeleteAcls) natively is an AclFilterSpec, whose
    # fields Kafka suffixes with "_filter" (not operation and permission type).
    **{
        (message, native): f"{native}_filter"
        for message in ("DescribeAclsRequest", "DeleteAclsFilter")
        for native in ("resource_type", "resource_name", "pattern_type", "principal", "host")
    },
}

# Tagged fields of Kafka's that this codec does not declare: a reader skips them, as
# Kafka's do, and a writer need not send them.
UNDECLARED_TAGS: dict[str, set[int]] = {
    "ApiVersionsResponse": {0, 2, 3},  # supported and finalized features, ZK migration
    "PartitionData": {2},  # Fetch's snapshot id: KRaft's followers only
}

# Nullable fields whose null is read as something else here, on purpose: the "nulls"
# samples leave a value in them. (Kafka's message, field) -> why.
NULL_READ_OTHERWISE: dict[tuple[str, str], str] = {
    ("PartitionProduceData", "records"): "a null record set is an empty one natively",
    ("PartitionData", "records"): "never sent null: kafka-python crashes on null records",
    ("CreatableTopicConfig", "value"): "a null config value asks for the default: not set",
}


def kafka_name(message: str, native: str) -> str:
    """kio names a duration or time field without its unit ("throttle_time")."""
    return RENAMED.get((message, native), native.removesuffix("_ms"))


# Error codes both enums know, for error_code fields.
SHARED_ERRORS = [e.value for e in ErrorCode if e.value in {k.value for k in KioErrorCode}]


def served_versions() -> Iterator[tuple[KafkaApi, int, str]]:
    for api in KAFKA_APIS.values():
        for version in range(api.min_version, api.max_version + 1):
            for side in ("request", "response"):
                try:
                    kio_class(api, version, side)
                except UnknownEntity:
                    continue  # removed in Kafka 4 (KIP-896): the kafka-python oracle's
                yield api, version, side


def kio_class(api: KafkaApi, version: int, side: str) -> type:
    load = load_request_schema if side == "request" else load_response_schema
    return load(int(api.key), version)


def our_struct(api: KafkaApi, side: str) -> KStruct:
    return api.request if side == "request" else api.response


CASES = list(served_versions())
CASE_IDS = [f"{api.key.name}-v{version}-{side}" for api, version, side in CASES]

# Served versions kio (Kafka 4) no longer knows, checked by the kafka-python oracle alone.
REMOVED_IN_KAFKA_4 = {("PRODUCE", 0), ("PRODUCE", 1), ("PRODUCE", 2)}


def test_every_served_version_meets_kio() -> None:
    """A served API or version that kio does not know would silently go unchecked."""
    checked = {(api.key.name, version) for api, version, _ in CASES}
    served = {
        (api.key.name, version)
        for api in KAFKA_APIS.values()
        for version in range(api.min_version, api.max_version + 1)
    }
    assert served - checked == REMOVED_IN_KAFKA_4


# ------------------------------------------------------------------ walking both declarations


def paired_fields(
    ours: KStruct, theirs: type, version: int, flexible: bool
) -> Iterator[tuple[Field, dataclasses.Field[Any]]]:
    """Our fields at `version` beside kio's, regular ones in order, tagged ones by tag;
    asserts both declare the same fields."""
    plan = ours.plan(version, flexible)
    kio_fields = dataclasses.fields(theirs)
    kio_regular = [f for f in kio_fields if "tag" not in f.metadata]
    kio_tagged = {f.metadata["tag"]: f for f in kio_fields if "tag" in f.metadata}
    where = f"{theirs.__qualname__} v{version}"
    ours_names = [kafka_name(theirs.__name__, f.name) for f, _ in plan.regular]
    assert ours_names == [k.name for k in kio_regular], (
        f"{where}: fields {ours_names}, Kafka's {[k.name for k in kio_regular]}"
    )
    undeclared = UNDECLARED_TAGS.get(theirs.__name__, set())
    assert sorted(plan.tagged) == sorted(set(kio_tagged) - undeclared), (
        f"{where}: tags {sorted(plan.tagged)}, Kafka's {sorted(kio_tagged)}"
    )
    for (field, nullable), kio_field in zip(plan.regular, kio_regular, strict=True):
        # kio reads a datetime's -1 as None: a value, not a null on the wire
        if kio_field.metadata.get("kafka_type") != "datetime_i64":
            assert nullable == is_optional(kio_field), f"{where}.{field.name}: nullable {nullable}"
        yield field, kio_field
    for tag, field in plan.tagged.items():
        yield field, kio_tagged[tag]


def assert_same_type(wire: WireType, kio_field: dataclasses.Field[Any], where: str) -> None:
    kind = classify_field(kio_field)
    if isinstance(wire, Array):
        assert isinstance(kind, EntityTupleField | PrimitiveTupleField), f"{where}: not an array"
        wire = wire.item
        if isinstance(kind, PrimitiveTupleField):
            assert kio_field.metadata["kafka_type"] in KAFKA_TYPES[id(wire)], where
        return
    if isinstance(wire, KStruct):
        assert isinstance(kind, EntityField), f"{where}: not a struct"
        return
    assert kio_field.metadata["kafka_type"] in KAFKA_TYPES[id(wire)], (
        f"{where}: {kio_field.metadata['kafka_type']}"
    )


class Values:
    """Distinct values, one per field, in the types kio's classes take."""

    def __init__(self) -> None:
        self.n = 0

    def next(self) -> int:
        self.n += 1
        return self.n

    def of(self, kafka_type: str, kio_type: Any) -> Any:
        n = self.next()
        match kafka_type:
            case "int8" | "int16" | "int32" | "int64":
                return kio_type(n)
            case "error_code":
                return KioErrorCode(SHARED_ERRORS[n % len(SHARED_ERRORS)])
            case "timedelta_i32" | "timedelta_i64":
                return kio_type.parse(datetime.timedelta(milliseconds=n))
            case "datetime_i64":
                return datetime.datetime.fromtimestamp(1_700_000_000 + n, datetime.UTC)
            case "string":
                return f"s{n}"
            case "bool":
                return n % 2 == 0
            case "float64":
                return kio_type(n + 0.25)
            case "bytes" | "records":
                return f"bytes-{n}".encode()
        raise AssertionError(f"no value for {kafka_type}")


def sample(
    ours: KStruct, theirs: type, version: int, flexible: bool, values: Values, nulls: bool
) -> Any:
    """A kio message of class `theirs`: a distinct value in every mapped field (None in
    nullable ones when `nulls`), our written default in the others."""
    kwargs: dict[str, Any] = {}
    for field, kio_field in paired_fields(ours, theirs, version, flexible):
        where = f"{theirs.__qualname__}.{kio_field.name} v{version}"
        assert_same_type(field.type, kio_field, where)
        null_here = nulls and (theirs.__name__, kio_field.name) not in NULL_READ_OTHERWISE
        kwargs[kio_field.name] = one_value(field, kio_field, version, flexible, values, null_here)
    return theirs(**kwargs)


def one_value(
    field: Field,
    kio_field: dataclasses.Field[Any],
    version: int,
    flexible: bool,
    values: Values,
    nulls: bool,
) -> Any:
    kind = classify_field(kio_field)
    optional = is_optional(kio_field)
    if not field.mapped:
        return unmapped_value(field, kio_field)
    if nulls and optional:
        return None
    if isinstance(kind, EntityTupleField):
        assert isinstance(field.type, Array) and isinstance(field.type.item, KStruct)
        return tuple(
            sample(field.type.item, kind.type_, version, flexible, values, nulls) for _ in range(2)
        )
    if isinstance(kind, EntityField):
        assert isinstance(field.type, KStruct)
        return sample(field.type, kind.type_, version, flexible, values, nulls)
    kio_type = kind.type_
    if isinstance(kind, PrimitiveTupleField):
        kafka_type = kio_field.metadata["kafka_type"]
        return tuple(values.of(kafka_type, kio_type) for _ in range(2))
    return values.of(kio_field.metadata["kafka_type"], kio_type)


def unmapped_value(field: Field, kio_field: dataclasses.Field[Any]) -> Any:
    kind = classify_field(kio_field)
    if field.default is None:
        if is_optional(kio_field):
            return None
        return () if kind.is_array else ""
    if kind.is_array:
        assert not field.default, f"{field.name}: only an empty array is written as default"
        return ()
    kafka_type = kio_field.metadata.get("kafka_type")
    if kafka_type == "error_code":
        return KioErrorCode(field.default)
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return kind.type_.parse(datetime.timedelta(milliseconds=field.default))
    return kind.type_(field.default) if kafka_type != "bool" else field.default


# ------------------------------------------------------------------ the frames


def kio_bytes(entity_class: type, entity: Any) -> bytes:
    buffer = io.BytesIO()
    entity_writer(entity_class)(buffer, entity)
    return buffer.getvalue()


def kio_request(api: KafkaApi, version: int, entity: Any) -> bytes:
    header_class = KioRequestHeaderV2 if api.flexible(version) else KioRequestHeaderV1
    header = header_class(
        request_api_key=int(api.key),
        request_api_version=version,
        correlation_id=CORRELATION_ID,
        client_id=CLIENT_ID,
    )
    return kio_bytes(header_class, header) + kio_bytes(type(entity), entity)


def kio_response(api: KafkaApi, version: int, entity: Any) -> bytes:
    flexible_header = api.response_header_flexible(version)
    header_class = KioResponseHeaderV1 if flexible_header else KioResponseHeaderV0
    header = header_class(correlation_id=CORRELATION_ID)
    return kio_bytes(header_class, header) + kio_bytes(type(entity), entity)


@pytest.mark.parametrize("nulls", [False, True], ids=["values", "nulls"])
@pytest.mark.parametrize(("api", "version", "side"), CASES, ids=CASE_IDS)
def test_kio_message_decodes_and_encodes_back_byte_for_byte(
    api: KafkaApi, version: int, side: str, nulls: bool
) -> None:
    theirs = kio_class(api, version, side)
    entity = sample(our_struct(api, side), theirs, version, api.flexible(version), Values(), nulls)
    if side == "request":
        payload = kio_request(api, version, entity)
        got = decode_request(payload)
        assert isinstance(got, DecodedRequest), got
        assert got.header == RequestHeader(int(api.key), version, CORRELATION_ID, CLIENT_ID)
        ours = encode_request(api, version, CORRELATION_ID, CLIENT_ID, got.body)[4:]
    else:
        payload = kio_response(api, version, entity)
        correlation_id, body = decode_response(api, version, payload)
        assert correlation_id == CORRELATION_ID
        header = RequestHeader(int(api.key), version, CORRELATION_ID, CLIENT_ID)
        ours = b"".join(encode_response(header, body))[4:]
    assert ours == payload, differences(entity, read_back(api, version, side, ours))


def read_back(api: KafkaApi, version: int, side: str, payload: bytes) -> Any:
    """kio's reading of a payload encoded here (for the failure message)."""
    if side == "request":
        header_class = KioRequestHeaderV2 if api.flexible(version) else KioRequestHeaderV1
    else:
        flexible_header = api.response_header_flexible(version)
        header_class = KioResponseHeaderV1 if flexible_header else KioResponseHeaderV0
    _, header_size = entity_reader(header_class)(payload, 0)
    entity_class = kio_class(api, version, side)
    return entity_reader(entity_class)(payload, header_size)[0]


def differences(sent: Any, back: Any, path: str = "") -> list[str]:
    if dataclasses.is_dataclass(sent) and dataclasses.is_dataclass(back):
        return [
            d
            for f in dataclasses.fields(sent)
            for d in differences(getattr(sent, f.name), getattr(back, f.name), f"{path}.{f.name}")
        ]
    if isinstance(sent, tuple) and isinstance(back, tuple) and len(sent) == len(back):
        pairs = enumerate(zip(sent, back, strict=True))
        return [d for i, (a, b) in pairs for d in differences(a, b, f"{path}[{i}]")]
    return [] if sent == back else [f"{path}: sent {sent!r}, given back {back!r}"]


# ------------------------------------------------------------------ the consumer protocol

CONSUMER_PROTOCOL = [
    (kind, version, nulls)
    for kind in ("subscription", "assignment")
    for version in range(4)
    for nulls in (False, True)
]


@pytest.mark.parametrize(("kind", "version", "nulls"), CONSUMER_PROTOCOL)
def test_consumer_protocol_against_kio(kind: str, version: int, nulls: bool) -> None:
    """Subscriptions and assignments (what members of any client exchange through the
    coordinator) as Kafka's ConsumerProtocol classes write them, version prefix first."""
    from kio.schema.consumer_protocol_assignment import v0 as a0
    from kio.schema.consumer_protocol_assignment import v1 as a1
    from kio.schema.consumer_protocol_assignment import v2 as a2
    from kio.schema.consumer_protocol_assignment import v3 as a3
    from kio.schema.consumer_protocol_subscription import v0 as s0
    from kio.schema.consumer_protocol_subscription import v1 as s1
    from kio.schema.consumer_protocol_subscription import v2 as s2
    from kio.schema.consumer_protocol_subscription import v3 as s3

    from protocol.kafka import consumer_protocol as cp

    if kind == "subscription":
        theirs: type = [s0, s1, s2, s3][version].ConsumerProtocolSubscription
        ours, decode, encode = cp.SUBSCRIPTION, cp.decode_subscription, cp.encode_subscription
    else:
        theirs = [a0, a1, a2, a3][version].ConsumerProtocolAssignment
        ours, decode, encode = cp.ASSIGNMENT, cp.decode_assignment, cp.encode_assignment
    entity = sample(ours, theirs, version, False, Values(), nulls)
    data = version.to_bytes(2, "big") + kio_bytes(theirs, entity)
    assert encode(decode(data), version) == data  # type: ignore[operator]


def test_a_newer_consumer_protocol_version_is_read_as_the_newest_known() -> None:
    from protocol.kafka.consumer_protocol import Subscription
    from protocol.kafka.consumer_protocol import decode_subscription
    from protocol.kafka.consumer_protocol import encode_subscription

    v3 = encode_subscription(Subscription(topics=["t"], generation_id=4, rack_id="r"), 3)
    newer = b"\x00\x07" + v3[2:] + b"\x00\x00\x00\x2a"  # v7: one more INT32 at the end
    got = decode_subscription(newer)
    assert (got.topics, got.generation_id, got.rack_id) == (["t"], 4, "r")
