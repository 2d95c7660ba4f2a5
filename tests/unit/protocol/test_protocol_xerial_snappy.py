"""Snappy batches in snappy-java's xerial framing, as kafka-python (and Java producers)
write them, decompress like raw snappy ones, under the same size bound; a cut or lying
block length is refused (CorruptRecordError), never read past."""

from __future__ import annotations

import pytest
from kafka.codec import snappy_encode

from protocol.errors import CorruptRecordError
from protocol.records.batch_format import Compression
from protocol.records.compression import decompress

DATA = b"0123456789abcdef" * 2048


def xerial(data: bytes) -> bytes:
    return bytes(snappy_encode(data, xerial_compatible=True, xerial_blocksize=4096))


def test_xerial_framed_snappy_decompresses() -> None:
    framed = xerial(DATA)
    assert framed.startswith(b"\x82SNAPPY\x00")
    assert decompress(Compression.SNAPPY, framed) == DATA


def test_xerial_framed_snappy_keeps_the_size_bound() -> None:
    with pytest.raises(CorruptRecordError, match="more than 10000 bytes"):
        decompress(Compression.SNAPPY, xerial(DATA), limit=10_000)


@pytest.mark.parametrize("cut", [1, 3, 17])
def test_a_cut_xerial_block_is_refused(cut: int) -> None:
    with pytest.raises(CorruptRecordError):
        decompress(Compression.SNAPPY, xerial(DATA)[:-cut])


def test_a_lying_xerial_block_length_is_refused() -> None:
    framed = bytearray(xerial(DATA))
    framed[16:20] = (2**31 - 1).to_bytes(4, "big")
    with pytest.raises(CorruptRecordError, match="overruns"):
        decompress(Compression.SNAPPY, bytes(framed))
