"""Fuzzing the aws-chunked decoder (sidecar.s3.aws_chunked), unsigned and signed.

No input crashes it: any bytes, cut into any pieces, give payload bytes or a
ChunkedFormatError (SignatureRejected with a chain). None gets past it
wrongly: a signed body that decodes to its end without an error decodes to
exactly the bytes that were signed, whatever was changed in it, and how a body
is cut into pieces never changes what it decodes to.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.s3.aws_chunked import AwsChunkedDecoder, ChunkedFormatError, SignatureChain
from sidecar.s3.sigv4 import ChunkSigner, SignatureRejected
from tests.support.fuzz_corpus import binary_seeds
from tests.support.signed_chunks import chunked_body, crc32_trailer, key_of

SEEDS = binary_seeds("aws_chunked")
# The signer the signed seeds were made with (tests/fuzz/corpus/aws_chunked).
KEY = key_of("fuzz-secret", "20261127", "us-east-1")
TIMESTAMP, SCOPE, SEED = "20261127T000000Z", "20261127/us-east-1/s3/aws4_request", "ab" * 32
PAYLOAD = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"


def chain(trailer: bool) -> SignatureChain:
    return SignatureChain.of(ChunkSigner(KEY, TIMESTAMP, SCOPE, SEED),
                             PAYLOAD + ("-TRAILER" if trailer else ""))


def decode(body: bytes, cuts: list[int], signed: SignatureChain | None = None
           ) -> tuple[bytes, AwsChunkedDecoder]:
    """Feed `body` cut at `cuts`; the payload and the decoder. Raises only what
    the decoder documents: anything else fails the test."""
    decoder = AwsChunkedDecoder(chain=signed)
    out = bytearray()
    points = sorted({cut % (len(body) + 1) for cut in cuts} | {0, len(body)})
    for start, end in itertools.pairwise(points):
        for piece in decoder.feed(body[start:end]):
            out += piece
    assert decoder.decoded_bytes == len(out)
    return bytes(out), decoder


def decodes_or_refuses(body: bytes, cuts: list[int], signed: SignatureChain | None = None
                       ) -> tuple[bytes, AwsChunkedDecoder] | None:
    try:
        return decode(body, cuts, signed)
    except (ChunkedFormatError, SignatureRejected):
        return None


@pytest.mark.parametrize("body", SEEDS, ids=[str(i) for i in range(len(SEEDS))])
def test_aws_chunked_corpus(body: bytes) -> None:
    whole = decodes_or_refuses(body, [])
    for cuts in ([1], list(range(0, len(body), 7)), list(range(len(body)))):
        cut = decodes_or_refuses(body, cuts)
        assert (cut is None) == (whole is None)
        if cut is not None and whole is not None:
            assert cut[0] == whole[0]
    for trailer in (False, True):
        decodes_or_refuses(body, [3], chain(trailer))


def mutations(seeds: list[bytes]) -> st.SearchStrategy[bytes]:
    def mutate(seed: bytes, edits: list[tuple[int, int, bytes]]) -> bytes:
        body = seed
        for at, drop, piece in edits:
            at %= len(body) + 1
            body = body[:at] + piece + body[at + drop:]
        return body
    pieces = st.sampled_from([b"\r\n", b"\n", b";", b"=", b"0", b"f" * 17, b"chunk-signature=",
                              b"x-amz-trailer-signature:", b"\x00", b"A", b"1_0"]) \
        | st.binary(max_size=4)
    return st.builds(mutate, st.sampled_from(seeds),
                     st.lists(st.tuples(st.integers(0, 4096), st.integers(0, 3), pieces),
                              min_size=1, max_size=3))


@given(st.one_of(mutations(SEEDS), st.binary(max_size=512)), st.lists(st.integers(0, 4096)))
def test_aws_chunked_decoder_takes_any_bytes(body: bytes, cuts: list[int]) -> None:
    decodes_or_refuses(body, cuts)
    decodes_or_refuses(body, cuts, chain(False))


@given(st.binary(max_size=2000), st.integers(1, 700), st.booleans(),
       st.lists(st.integers(0, 4096)), st.lists(st.integers(0, 4096)))
def test_a_valid_body_decodes_to_its_data_however_it_is_cut(
    data: bytes, chunk: int, trailer: bool, cuts: list[int], other_cuts: list[int],
) -> None:
    trailer_line = crc32_trailer(data) if trailer else None
    body = chunked_body(data, chunk, KEY, TIMESTAMP, SCOPE, SEED, trailer_line)
    for signed in (False, True):
        # A chain is the state of one body's signatures: a fresh one each decode.
        decoded, decoder = decode(body, cuts, chain(trailer) if signed else None)
        assert decoded == data and decoder.done
        assert decode(body, other_cuts, chain(trailer) if signed else None)[0] == data
        if trailer_line is not None:
            assert (trailer_line[0], trailer_line[1]) in decoder.trailers


@given(st.binary(min_size=1, max_size=600), st.integers(1, 200), st.booleans(), st.data())
def test_a_changed_signed_body_never_decodes_to_other_bytes(
    data: bytes, chunk: int, trailer: bool, draw: st.DataObject,
) -> None:
    trailer_line = crc32_trailer(data) if trailer else None
    body = chunked_body(data, chunk, KEY, TIMESTAMP, SCOPE, SEED, trailer_line)
    changed = draw.draw(mutations([body]))
    result = decodes_or_refuses(changed, draw.draw(st.lists(st.integers(0, 4096))),
                                chain(trailer))
    if result is not None and result[1].done:
        decoded, decoder = result
        assert decoded == data
        if trailer_line is not None:
            assert decoder.trailers[0] == (trailer_line[0], trailer_line[1])
