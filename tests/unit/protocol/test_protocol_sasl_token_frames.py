"""Raw SASL token frames, sans-I/O (protocol/connection.py): after Kafka's SaslHandshake
v0 (KIP-43) each frame is a SaslToken, not a request, until the server ends the raw
exchange; answers are a length prefix and the token, in request order; the frame bound
holds for tokens as for every frame. Only the Kafka codec's v0 handshake turns it on."""

from __future__ import annotations

import struct

import pytest

from protocol.api import ApiKey
from protocol.connection import NATIVE
from protocol.connection import Request
from protocol.connection import SaslToken
from protocol.connection import ServerConnection
from protocol.errors import DecodeError
from protocol.framing import RequestHeader
from protocol.kafka.apis import METADATA
from protocol.kafka.apis import SASL_HANDSHAKE
from protocol.kafka.codec import KAFKA
from protocol.kafka.codec import encode_request
from protocol.messages import MetadataRequest
from protocol.messages import SaslHandshakeRequest
from protocol.messages import SaslHandshakeResponse

LENGTH = struct.Struct(">i")


def raw(token: bytes) -> bytes:
    return LENGTH.pack(len(token)) + token


def handshake_v0() -> bytes:
    return encode_request(SASL_HANDSHAKE, 0, 1, "c", SaslHandshakeRequest(mechanism="PLAIN"))


def test_after_a_v0_handshake_frames_are_raw_tokens_until_the_exchange_ends() -> None:
    conn = ServerConnection(codec=KAFKA)
    metadata = encode_request(METADATA, 1, 3, "c", MetadataRequest(topics=None))
    # The client pipelines: handshake, token, then its first request.
    conn.receive_data(handshake_v0() + raw(b"\0alice\0pw") + metadata)
    handshake = conn.next_event()
    assert isinstance(handshake, Request)
    assert KAFKA.raw_sasl_tokens_after(handshake.header)
    conn.raw_sasl_tokens = True  # the server: the handshake succeeded
    token = conn.next_event()
    assert token == SaslToken(1, b"\0alice\0pw")
    # Answered in request order: the token's raw answer waits behind the handshake's.
    assert conn.send_sasl_token_parts(token, b"ok") == []
    answer = b"".join(conn.send_response_parts(handshake, SaslHandshakeResponse()))
    assert answer.endswith(raw(b"ok"))
    conn.raw_sasl_tokens = False  # the server: authenticated
    request = conn.next_event()
    assert isinstance(request, Request) and isinstance(request.body, MetadataRequest)


def test_a_raw_token_beyond_the_frame_bound_is_refused_unread() -> None:
    conn = ServerConnection(codec=KAFKA, max_frame_size=1024)
    conn.raw_sasl_tokens = True
    conn.receive_data(LENGTH.pack(1025) + b"n,,")
    with pytest.raises(DecodeError):
        conn.next_event()
    conn = ServerConnection(codec=KAFKA)
    conn.raw_sasl_tokens = True
    conn.receive_data(LENGTH.pack(100) + b"n,,")  # a length that lies: wait for the rest
    assert conn.next_event() is None


def test_only_a_kafka_v0_handshake_is_followed_by_raw_tokens() -> None:
    def header(key: ApiKey, version: int) -> RequestHeader:
        return RequestHeader(int(key), version, 1, "c")

    assert KAFKA.raw_sasl_tokens_after(header(ApiKey.SASL_HANDSHAKE, 0))
    assert not KAFKA.raw_sasl_tokens_after(header(ApiKey.SASL_HANDSHAKE, 1))
    assert not KAFKA.raw_sasl_tokens_after(header(ApiKey.SASL_AUTHENTICATE, 0))
    # The native SaslHandshake is version 0 too, and always followed by SaslAuthenticate.
    assert not NATIVE.raw_sasl_tokens_after(header(ApiKey.SASL_HANDSHAKE, 0))
