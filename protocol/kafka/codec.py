"""Apache Kafka's wire protocol as a codec: a request payload in, the request header
and the native request out; a native response in, the frame's buffers out.

    request header v1   api_key INT16, api_version INT16, correlation_id INT32,
                        client_id NULLABLE_STRING
    request header v2   v1, then TAGGED_FIELDS (flexible request versions)
    response header v0  correlation_id INT32
    response header v1  v0, then TAGGED_FIELDS (flexible versions, except ApiVersions)

Unlike the native protocol, Kafka's response header has no error code: each response
carries its errors in its body. A request this codec cannot serve is answered as Kafka
answers it: an ApiVersions request of a version it does not know gets an ApiVersions
v0 answer with UNSUPPORTED_VERSION and the served ranges (clients downgrade from it);
anything else it cannot decode or serve closes the connection (`KafkaRefusal`).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from protocol.errors import DecodeError
from protocol.errors import ErrorCode
from protocol.framing import RequestHeader
from protocol.kafka.apis import API_VERSIONS
from protocol.kafka.apis import KAFKA_APIS
from protocol.kafka.apis import KafkaApi
from protocol.kafka.primitives import Reader
from protocol.kafka.primitives import Writer
from protocol.messages import ApiVersionRange
from protocol.messages import ApiVersionsResponse
from protocol.messages import Message

_FRAME_LENGTH = struct.Struct(">i")

Buffer = bytes | bytearray | memoryview


class KafkaRequest(NamedTuple):
    header: RequestHeader
    body: Message


class KafkaRefusal(NamedTuple):
    """A request that cannot be served. `answer` is what to send for it (None: close
    the connection after logging `message`, as a Kafka broker does)."""

    header: RequestHeader | None
    error: ErrorCode
    message: str
    answer: Message | None


def served_versions() -> list[ApiVersionRange]:
    return [
        ApiVersionRange(api_key=key, min_version=api.min_version, max_version=api.max_version)
        for key, api in sorted(KAFKA_APIS.items())
    ]


def decode_request(payload: bytes | bytearray | memoryview) -> KafkaRequest | KafkaRefusal:
    """One request frame's payload. Raises DecodeError when not even its header reads."""
    r = Reader(payload)
    api_key, version, correlation_id = r.int16(), r.int16(), r.int32()
    client_id = r.string(compact=False, nullable=True)  # never compact, even in v2
    header = RequestHeader(api_key, version, correlation_id, client_id)
    api = KAFKA_APIS.get(api_key)
    if api is None:
        return KafkaRefusal(header, ErrorCode.UNSUPPORTED_VERSION, f"API key {api_key}", None)
    if not api.min_version <= version <= api.max_version:
        why = (
            f"{api.key.name} version {version} is not served ({api.min_version}..{api.max_version})"
        )
        answer = None
        if api is API_VERSIONS:
            answer = ApiVersionsResponse(
                error_code=int(ErrorCode.UNSUPPORTED_VERSION), api_keys=served_versions()
            )
        return KafkaRefusal(header, ErrorCode.UNSUPPORTED_VERSION, why, answer)
    flexible = api.flexible(version)
    try:
        if flexible:
            _skip_tagged(r)
        body = api.request.read(r, version, flexible)
        if r.remaining:
            raise DecodeError(f"{r.remaining} bytes left over after the request")
    except DecodeError as exc:
        why = f"cannot decode {api.key.name} v{version}: {exc}"
        return KafkaRefusal(header, ErrorCode.INVALID_REQUEST, why, None)
    return KafkaRequest(header, body)


def _skip_tagged(r: Reader) -> None:
    for _ in range(r.uvarint()):
        r.uvarint()
        r.raw(r.uvarint(), "tagged field")


def encode_response(header: RequestHeader, body: Message) -> list[Buffer]:
    """The frame answering `header` with `body` at the request's version (an
    ApiVersions refusal at v0), as buffers; record sets are not copied."""
    api = KAFKA_APIS[header.api_key]
    version = header.api_version
    if api is API_VERSIONS and not api.min_version <= version <= api.max_version:
        version = 0
    return encode_frame(api, version, header.correlation_id, body)


def encode_frame(api: KafkaApi, version: int, correlation_id: int, body: Message) -> list[Buffer]:
    w = Writer()
    w.int32(0)  # the frame length, filled in below
    w.int32(correlation_id)
    if api.response_header_flexible(version):
        w.uvarint(0)
    api.response.write(w, body, version, api.flexible(version))
    parts = w.parts()
    first = parts[0]
    assert isinstance(first, bytearray), "the frame starts in the writer's own buffer"
    _FRAME_LENGTH.pack_into(first, 0, w.size - 4)
    return parts


def encode_request(
    api: KafkaApi, version: int, correlation_id: int, client_id: str | None, body: Message
) -> bytes:
    """A request frame (for tests and tools that speak Kafka to a broker)."""
    w = Writer()
    w.int32(0)
    w.int16(int(api.key))
    w.int16(version)
    w.int32(correlation_id)
    w.string(client_id, compact=False, nullable=True)
    flexible = api.flexible(version)
    if flexible:
        w.uvarint(0)
    api.request.write(w, body, version, flexible)
    data = bytearray(w.getvalue())
    _FRAME_LENGTH.pack_into(data, 0, len(data) - 4)
    return bytes(data)


def decode_response(
    api: KafkaApi, version: int, payload: bytes | memoryview
) -> tuple[int, Message]:
    """(correlation id, native response) of a response payload (tests and tools)."""
    r = Reader(payload)
    correlation_id = r.int32()
    if api.response_header_flexible(version):
        _skip_tagged(r)
    flexible = api.flexible(version)
    body = api.response.read(r, version, flexible)
    if r.remaining:
        raise DecodeError(f"{r.remaining} bytes left over after the response")
    return correlation_id, body
