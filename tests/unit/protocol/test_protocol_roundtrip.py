"""Every request and response Struct in API_SPECS survives the real path
ClientConnection -> ServerConnection -> ClientConnection unchanged, and so does
every metadata record type inside FetchMetadataResponse."""

from __future__ import annotations

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from protocol_strategies import struct_strategy
from protocol_strategies import struct_types_reachable

from protocol import metadata_records as mr
from protocol.api import ApiKey
from protocol.connection import ClientConnection
from protocol.connection import Request
from protocol.connection import Response
from protocol.connection import ServerConnection
from protocol.connection import decode_body
from protocol.connection import encode_body
from protocol.errors import ErrorCode
from protocol.framing import RequestHeader
from protocol.messages import API_BY_REQUEST_TYPE
from protocol.messages import API_SPECS
from protocol.messages import ApiSpec
from protocol.messages import FetchMetadataResponse
from protocol.messages import MetadataEntry
from protocol.messages import ProduceRequest

SPECS = sorted(API_SPECS.values(), key=lambda s: int(s.key))
METADATA_RECORD_TYPES = [
    mr.RegisterBrokerRecord,
    mr.FenceBrokerRecord,
    mr.UnfenceBrokerRecord,
    mr.TopicRecord,
    mr.RemoveTopicRecord,
    mr.PartitionRecord,
    mr.ProducerIdsRecord,
    mr.LeaderChangeRecord,
    mr.ScramCredentialRecord,
    mr.RemoveScramCredentialRecord,
    mr.AccessControlEntryRecord,
    mr.RemoveAccessControlEntryRecord,
    mr.ClientQuotaRecord,
]
ROUND_TRIP = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
client_ids = st.none() | st.text(max_size=20)


def exchange(
    request_body: msgspec.Struct, response_body: msgspec.Struct, client_id: str | None
) -> None:
    """One request and its response through both state machines."""
    spec = API_BY_REQUEST_TYPE[type(request_body)]
    client = ClientConnection(client_id)
    server = ServerConnection()

    correlation_id, wire = client.send_request(request_body)
    assert client.in_flight == 1
    server.receive_data(wire)
    event = server.next_event()
    assert isinstance(event, Request), event
    assert event.header == RequestHeader(int(spec.key), spec.max_version, correlation_id, client_id)
    assert type(event.body) is spec.request
    assert event.body == request_body
    assert server.next_event() is None
    assert server.in_flight == 1

    out = server.send_response(event, response_body)
    assert server.in_flight == 0
    responses = client.receive_data(out)
    assert responses == [Response(correlation_id, response_body, ErrorCode.NONE, "")]
    assert type(responses[0].body) is spec.response
    assert client.in_flight == 0


def test_every_api_key_has_a_spec_and_specs_are_consistent() -> None:
    assert set(API_SPECS) == set(ApiKey)
    for key, spec in API_SPECS.items():
        assert spec.key == key
        assert 0 <= spec.min_version <= spec.max_version
        assert API_BY_REQUEST_TYPE[spec.request] is spec
    requests = [s.request for s in SPECS]
    responses = [s.response for s in SPECS]
    assert len(set(requests)) == len(requests)
    assert len(set(responses)) == len(responses)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.key.name)
@ROUND_TRIP
@given(data=st.data(), client_id=client_ids)
def test_round_trip_through_connections(spec: ApiSpec, data: st.DataObject, client_id) -> None:
    request_body = data.draw(struct_strategy(spec.request), label="request")
    response_body = data.draw(struct_strategy(spec.response), label="response")
    exchange(request_body, response_body, client_id)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.key.name)
def test_round_trip_with_only_required_fields(spec: ApiSpec) -> None:
    """An older peer that sends only what it must still decodes to the defaults."""
    for kind in (spec.request, spec.response):
        info = mi.type_info(kind)
        minimal = {f.encode_name: _minimal_value(f.type) for f in info.fields if f.required}
        decoded = decode_body(kind, msgspec.msgpack.encode(minimal))
        for f in info.fields:
            if not f.required:
                expected = f.default if f.default is not msgspec.NODEFAULT else f.default_factory()
                assert getattr(decoded, f.name) == expected


def _minimal_value(t: mi.Type):
    if isinstance(t, mi.IntType):
        return 0
    if isinstance(t, mi.StrType):
        return ""
    if isinstance(t, mi.BytesType):
        return b""
    if isinstance(t, mi.ListType):
        return []
    if isinstance(t, mi.UnionType):
        return _minimal_value(t.types[0])
    if isinstance(t, mi.StructType):
        return {
            f.encode_name: _minimal_value(f.type)
            for f in t.fields
            if f.required or f.name == t.tag_field
        } | ({t.tag_field: t.tag} if t.tag_field else {})
    raise TypeError(t)


def test_unknown_fields_are_ignored() -> None:
    """A newer peer's extra fields must not break an older reader."""
    body = msgspec.msgpack.encode(
        {"topics": [], "acks": 1, "a_field_from_the_future": {"x": [1, 2, 3]}}
    )
    assert decode_body(ProduceRequest, body) == ProduceRequest(topics=[], acks=1)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.key.name)
def test_epoch_fields_default_to_the_sentinel_or_are_required(spec: ApiSpec) -> None:
    """DESIGN 4: every epoch field accepts -1, which skips its check. A defaulted
    epoch must default to exactly that sentinel."""
    for kind in (spec.request, spec.response):
        for struct_type in struct_types_reachable(kind):
            for f in mi.type_info(struct_type).fields:
                is_int = isinstance(f.type, mi.IntType)
                if is_int and f.name.endswith("epoch") and not f.required:
                    assert f.default == -1, (struct_type.__name__, f.name)


def test_strategies_reach_every_struct() -> None:
    """The strategy builder knows every field type used by every message (building a
    strategy walks every field and raises TypeError on a type it does not know)."""
    for spec in SPECS:
        for kind in (spec.request, spec.response):
            for struct_type in struct_types_reachable(kind):
                assert struct_strategy(struct_type) is not None


# ---------------------------------------------------------------- metadata records


@pytest.mark.parametrize("record_type", METADATA_RECORD_TYPES, ids=lambda t: t.__name__)
@ROUND_TRIP
@given(data=st.data())
def test_metadata_record_round_trip(record_type: type, data: st.DataObject) -> None:
    """FetchMetadataResponse with entries of each record type (tagged union)."""
    records = data.draw(st.lists(struct_strategy(record_type), min_size=1, max_size=4))
    others = data.draw(
        st.lists(st.sampled_from(METADATA_RECORD_TYPES).flatmap(struct_strategy), max_size=4)
    )
    entries = [MetadataEntry(offset=i, record=r) for i, r in enumerate(records + others)]
    response = FetchMetadataResponse(
        cluster_id="c", entries=entries, next_offset=len(entries), high_watermark=len(entries)
    )
    request = data.draw(struct_strategy(API_SPECS[ApiKey.FETCH_METADATA].request))
    exchange(request, response, "broker-1")
    decoded = decode_body(FetchMetadataResponse, encode_body(response))
    assert [type(e.record) for e in decoded.entries] == [type(r) for r in records + others]


def test_metadata_record_tags_are_distinct_and_on_the_wire() -> None:
    tags = {mi.type_info(t).tag for t in METADATA_RECORD_TYPES}
    assert len(tags) == len(METADATA_RECORD_TYPES)
    entry = MetadataEntry(offset=5, record=mr.FenceBrokerRecord(broker_id=1, broker_epoch=3))
    raw = msgspec.msgpack.decode(encode_body(entry))
    # The controller quorum's epoch (issue 17) and the change mark (KIP-868) are left
    # out at their defaults (-1: none given; false: the change's last entry).
    assert raw == {
        "offset": 5,
        "record": {"type": "fence_broker", "broker_id": 1, "broker_epoch": 3},
    }
    entry = MetadataEntry(offset=5, record=entry.record, epoch=2, change_continues=True)
    raw = msgspec.msgpack.decode(encode_body(entry))
    assert (raw["epoch"], raw["change_continues"]) == (2, True)


def test_metadata_record_type_union_matches_the_list() -> None:
    union = mi.type_info(mr.MetadataRecord)
    assert isinstance(union, mi.UnionType)
    assert {t.cls for t in union.types} == set(METADATA_RECORD_TYPES)


def test_scram_credential_records_on_the_wire() -> None:
    """The metadata log's format for users (issue 18): fixed field names and tags, the
    keys as raw bytes; a newer version must read these."""
    record = mr.ScramCredentialRecord(
        name="alice", mechanism=1, iterations=4096, salt=b"s", stored_key=b"k", server_key=b"v"
    )
    raw = msgspec.msgpack.decode(encode_body(MetadataEntry(offset=7, record=record, epoch=2)))
    assert raw == {
        "offset": 7,
        "record": {
            "type": "scram_credential",
            "name": "alice",
            "mechanism": 1,
            "iterations": 4096,
            "salt": b"s",
            "stored_key": b"k",
            "server_key": b"v",
        },
        "epoch": 2,
    }
    removal = MetadataEntry(offset=8, record=mr.RemoveScramCredentialRecord(name="a", mechanism=2))
    assert msgspec.msgpack.decode(encode_body(removal))["record"] == {
        "type": "remove_scram_credential",
        "name": "a",
        "mechanism": 2,
    }


def test_access_control_entry_records_on_the_wire() -> None:
    """The metadata log's format for ACLs (issue 18): Kafka's codes as integers, fixed
    field names and tags; a newer version must read these."""
    record = mr.AccessControlEntryRecord(
        id="acl-1",
        resource_type=2,
        resource_name="orders",
        pattern_type=4,
        principal="User:alice",
        host="*",
        operation=3,
        permission_type=3,
    )
    raw = msgspec.msgpack.decode(encode_body(MetadataEntry(offset=9, record=record, epoch=1)))
    assert raw == {
        "offset": 9,
        "record": {
            "type": "access_control_entry",
            "id": "acl-1",
            "resource_type": 2,
            "resource_name": "orders",
            "pattern_type": 4,
            "principal": "User:alice",
            "host": "*",
            "operation": 3,
            "permission_type": 3,
        },
        "epoch": 1,
    }
    removal = MetadataEntry(offset=10, record=mr.RemoveAccessControlEntryRecord(id="acl-1"))
    assert msgspec.msgpack.decode(encode_body(removal))["record"] == {
        "type": "remove_access_control_entry",
        "id": "acl-1",
    }


def test_client_quota_records_on_the_wire() -> None:
    """The metadata log's format for quotas (issue 18): fixed field names and tag, a
    default entity's name as nil; a newer version must read these."""
    record = mr.ClientQuotaRecord(
        entity=[
            mr.QuotaEntityData(entity_type="user", entity_name="alice"),
            mr.QuotaEntityData(entity_type="client-id"),
        ],
        key="producer_byte_rate",
        value=1024.0,
    )
    raw = msgspec.msgpack.decode(encode_body(MetadataEntry(offset=9, record=record, epoch=3)))
    assert raw == {
        "offset": 9,
        "record": {
            "type": "client_quota",
            "entity": [
                {"entity_type": "user", "entity_name": "alice"},
                {"entity_type": "client-id", "entity_name": None},
            ],
            "key": "producer_byte_rate",
            "value": 1024.0,
            "remove": False,
        },
        "epoch": 3,
    }
    removal = mr.ClientQuotaRecord(
        entity=[mr.QuotaEntityData(entity_type="client-id", entity_name="c")],
        key="request_percentage",
        remove=True,
    )
    assert msgspec.msgpack.decode(encode_body(MetadataEntry(offset=10, record=removal)))[
        "record"
    ] == {
        "type": "client_quota",
        "entity": [{"entity_type": "client-id", "entity_name": "c"}],
        "key": "request_percentage",
        "value": 0.0,
        "remove": True,
    }
