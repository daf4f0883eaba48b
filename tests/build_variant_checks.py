"""Run only against a build made without some libraries (PYSTREAM_WITHOUT),
by tests/test_build_options.py: what such a build does differently."""

import os
import random
import zlib

import pyarrow as pa
import pytest

import pystream
from pystream._core import crc32, decode, encode_publish
from pystream.producer import codec as checked_codec

from .conftest import BUILT_WITHOUT
from .golden import amqp_data, chunk, deliver, sub_batch
from .test_core_errors import COMPRESS

CODEC_NUMBERS = {"snappy": 2, "lz4": 3, "zstd": 4}
MISSING = sorted(BUILT_WITHOUT & set(CODEC_NUMBERS))

pytestmark = pytest.mark.skipif(not BUILT_WITHOUT,
                                reason="checks a build made without libraries")


def test_build_info_says_what_the_build_lacks():
    info = pystream.build_info()
    assert set(info.codecs) == {"none", "gzip", *CODEC_NUMBERS} - BUILT_WITHOUT
    assert ("zlib crc32" in info.crc) == ("isal" in BUILT_WITHOUT)
    assert ("ISA-L" in info.crc) == ("isal" not in BUILT_WITHOUT)
    assert os.environ["PYSTREAM_TEST_WITHOUT"]


@pytest.mark.parametrize("n", [0, 1, 15, 16, 63, 64, 127, 128, 129, 511, 512,
                               513, 4095, 4096, 65537, (1 << 20) + 3])
def test_crc32_is_zlibs_at_every_length(n):
    data = random.Random(n).randbytes(n)
    start = random.Random(-n).getrandbits(32)
    assert crc32(data) == zlib.crc32(data)
    assert crc32(data, start) == zlib.crc32(data, start)


def test_a_corrupt_chunk_is_still_caught():
    wire = bytearray(deliver(chunk([sub_batch([amqp_data(b"x" * 100)] * 10, 1)])))
    assert decode(bytes(wire)).num_rows == 10
    wire[-1] ^= 0x01
    with pytest.raises(pystream.CorruptChunk, match="CRC"):
        decode(bytes(wire))


@pytest.mark.parametrize("name", MISSING)
def test_a_sub_batch_in_a_missing_codec_is_a_typed_error(name):
    plain = [amqp_data(b"record %d" % i) for i in range(5)]
    before = deliver(chunk([sub_batch(plain, 0)]))
    wire = before + deliver(chunk([sub_batch(plain, CODEC_NUMBERS[name],
                                             COMPRESS[CODEC_NUMBERS[name]])],
                                  first_offset=5))
    assert decode(before).num_rows == 5
    with pytest.raises(pystream.CodecUnavailable,
                       match=rf"^{name} sub-batch: .*without {name} .*lib{name}"):
        decode(wire)


@pytest.mark.parametrize("name", MISSING)
def test_publishing_in_a_missing_codec_is_refused_before_sending(name):
    with pytest.raises(pystream.CodecUnavailable, match=rf"{name}.*lib{name}"):
        checked_codec(name)
    with pytest.raises(pystream.CodecUnavailable, match=name):
        encode_publish(0, 0, pa.array([b"a"]), compression=name)
