"""Apache Kafka's wire protocol as a codec: a request payload in, the request header
and the native request out; a native response in, the frame's buffers out.

    request header v1   api_key INT16, api_version INT16, correlation_id INT32,
                        client_id NULLABLE_STRING
    request header v2   v1, then TAGGED_FIELDS (flexible request versions)
    response header v0  correlation_id INT32
    response header v1  v0, then TAGGED_FIELDS (flexible versions, except ApiVersions)

Unlike the native protocol, Kafka's response header has no error code: each response
carries its errors in its body. A request this codec cannot serve is answered as Kafka
answers it (`KafkaCodec.encode_error`): an ApiVersions request of a version it does
not know gets an ApiVersions v0 answer with UNSUPPORTED_VERSION and the served ranges
(clients downgrade from it); anything else it cannot decode or serve closes the
connection.
"""

from __future__ import annotations

import struct

from protocol.api import ApiKey
from protocol.connection import Buffer
from protocol.connection import DecodedRequest
from protocol.connection import Refusal
from protocol.connection import Serves
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
_HEAD = struct.Struct(">ii")
_FLEXIBLE_HEAD = struct.Struct(">iiB")
# api key, api version, correlation id, client id length (the client id is a
# NULLABLE_STRING in every header version, never compact)
_HEADER = struct.Struct(">hhih")


def served_versions(serves: Serves | None = None) -> list[ApiVersionRange]:
    """The Kafka APIs and versions this codec speaks, of those `serves` allows."""
    return [
        ApiVersionRange(api_key=key, min_version=api.min_version, max_version=api.max_version)
        for key, api in sorted(KAFKA_APIS.items())
        if serves is None or serves(key) or key == ApiKey.API_VERSIONS
    ]


def decode_request(payload: bytes | bytearray | memoryview) -> DecodedRequest | Refusal:
    """One request frame's payload. Raises DecodeError when not even its header reads."""
    if len(payload) < _HEADER.size:
        raise DecodeError(f"truncated request header: {len(payload)} bytes")
    api_key, version, correlation_id, n = _HEADER.unpack_from(payload)
    body_at = _HEADER.size + max(n, 0)
    if n < -1 or body_at > len(payload):
        raise DecodeError(f"request header: client id length {n} in {len(payload)} bytes")
    try:
        client_id = None if n == -1 else str(payload[_HEADER.size : body_at], "utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError(f"request header: the client id is not UTF-8: {exc}") from None
    header = RequestHeader(api_key, version, correlation_id, client_id)
    api = KAFKA_APIS.get(api_key)
    if api is None:
        return Refusal(header, ErrorCode.UNSUPPORTED_VERSION, f"API key {api_key} is not served")
    if not api.min_version <= version <= api.max_version:
        return Refusal(
            header,
            ErrorCode.UNSUPPORTED_VERSION,
            f"{api.key.name} version {version} is not served "
            f"({api.min_version}..{api.max_version})",
        )
    flexible = api.flexible(version)
    r = Reader(payload, body_at)
    try:
        if flexible:
            _skip_tagged(r)
        # Bytes left after the body are ignored, as Kafka's brokers ignore them:
        # librdkafka 2.16's all-topics Metadata v9 request carries 3 (its array count
        # placeholder), and a broker that refused them would lock librdkafka out.
        body = api.request.read(r, version, flexible)
    except DecodeError as exc:
        why = f"cannot decode {api.key.name} v{version}: {exc}"
        return Refusal(header, ErrorCode.INVALID_REQUEST, why)
    return DecodedRequest(header, body)


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
    # The frame length (filled in below), the correlation id and, in header v1, an
    # empty tagged-field section.
    if api.response_header_flexible(version):
        w.raw(_FLEXIBLE_HEAD.pack(0, correlation_id, 0))
    else:
        w.raw(_HEAD.pack(0, correlation_id))
    api.response.writer(version, api.flexible(version))(w, body)
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


class KafkaCodec:
    """Apache Kafka's protocol behind protocol.connection's WireCodec interface, for a
    Kafka listener: what the process serves natively and this codec can speak."""

    name = "kafka"

    def decode_request(self, payload: bytes, serves: Serves | None) -> DecodedRequest | Refusal:
        got = decode_request(payload)
        if (
            isinstance(got, DecodedRequest)
            and serves is not None
            and not serves(got.header.api_key)
        ):
            return Refusal(got.header, ErrorCode.UNSUPPORTED_VERSION, "API not served here")
        return got

    def encode_response(self, header: RequestHeader, body: Message) -> list[Buffer]:
        if header.api_key == ApiKey.API_VERSIONS:
            # The process's handler lists the APIs it serves natively; on this listener
            # the versions are the ones this codec speaks.
            assert isinstance(body, ApiVersionsResponse)
            natively = {k.api_key for k in body.api_keys}
            body = ApiVersionsResponse(
                error_code=body.error_code, api_keys=served_versions(natively.__contains__)
            )
        return encode_response(header, body)

    def encode_error(
        self, header: RequestHeader, error: ErrorCode, message: str, serves: Serves | None
    ) -> list[Buffer] | None:
        if header.api_key == ApiKey.API_VERSIONS and error == ErrorCode.UNSUPPORTED_VERSION:
            # How a client learns the versions to downgrade to (an ApiVersions v0 answer).
            answer = ApiVersionsResponse(error_code=int(error), api_keys=served_versions(serves))
            return encode_frame(API_VERSIONS, 0, header.correlation_id, answer)
        return None  # Kafka has no whole-request error: the connection is closed

    def raw_sasl_tokens_after(self, header: RequestHeader) -> bool:
        # v0 (KIP-43): raw token frames follow; v1 (KIP-152): SaslAuthenticate requests.
        return header.api_key == ApiKey.SASL_HANDSHAKE and header.api_version == 0


KAFKA = KafkaCodec()
