"""Pass-through: every S3 request the cache does not serve goes to the origin.

Tiered-storage plugins use one endpoint for everything: they upload segments
with multipart uploads, delete them on retention and list them. Those requests
are streamed to the origin and the answers streamed back, never buffering a
whole body (DeleteObjects bodies, small by S3's own limit, are the exception:
their keys are needed to invalidate the cache).

The client's signature is for the sidecar's host and cannot be replayed, so the
request is re-signed (SigV4) with the sidecar's own credentials, keeping the
client's payload hash: the origin still verifies the body against the hash the
client computed (sidecar.s3.operations.plan_payload says how each payload mode is
forwarded). A signed aws-chunked body reaches the origin decoded, so its chunk
signatures are checked here instead, against the ChunkSigner of the verified
request; decoded bytes past the signed x-amz-decoded-content-length are refused
as they arrive, and the last declared byte is held back until the whole chain
holds, so the origin never stores a body that is over-long or whose chain
fails. Writes and deletes invalidate the cached blocks and the remembered HEAD
of their keys once the origin accepted them, or may have (a 5xx, a request sent
and never answered), so an object written through the sidecar reads back
through it at once; a write of what every GET repeats as headers (tags,
retention, legal hold, restore) drops the remembered HEAD alone.

The origin's answer reaches the client with the sidecar's request ids, those
its access log line records (an error document's RequestId and HostId too);
the origin's own pair is in the sidecar's log line of an error answer, which
carries the sidecar's request id. An answer whose body cannot be finished
(the origin failed or stalled, the client took nothing for client_timeout) is
cut off and counted as the data port counts a cached read's.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import aiohttp
from aiobotocore.session import get_session
from aiohttp import HttpVersion11, hdrs, web
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from multidict import CIMultiDict
from yarl import URL

from sidecar.config import OriginConfig
from sidecar.errors import OriginUnavailable, Overloaded
from sidecar.s3.addressing import query_pairs
from sidecar.s3.aws_chunked import AwsChunkedDecoder, ChunkedFormatError, Rechunker, SignatureChain
from sidecar.s3.client_sends import ClientGone, ClientStalled, sending_to_client
from sidecar.s3.errors import ORIGIN_ID_HEADERS, error_code_of, id_headers, origin_ids, with_ids
from sidecar.s3.operations import (
    MAX_DELETE_BODY,
    Invalidates,
    Operation,
    deleted_keys,
    outbound_path,
    outbound_query,
)
from sidecar.s3.payload import (
    BadPayload,
    DeclaredLength,
    Payload,
    PayloadMode,
    outbound_headers,
    outbound_payload,
    plan_payload,
    response_headers,
)
from sidecar.s3.sigv4 import ChunkSigner, SignatureRejected
from sidecar.telemetry.access_log import BODY_BYTES

log = logging.getLogger(__name__)

_CHUNK = 256 * 1024
# Chunk size of re-framed (unsigned-trailer) uploads: S3's minimum is 8 KiB;
# 64 KiB keeps the framing overhead under 0.02%.
REFRAME_CHUNK = 64 * 1024
# aiohttp must not add headers the signature does not cover and S3 would store
# (a default Content-Type), nor compress or decompress bodies it only relays.
_SKIP_AUTO_HEADERS = ("Content-Type", "Accept", "Accept-Encoding", "User-Agent")
# An origin's error document is read whole, up to this, to give it the
# sidecar's ids: S3's are well under 2 KiB. A larger or encoded one, or one of
# unknown length, goes on as it came (its headers still carry the sidecar's ids).
MAX_ERROR_BODY = 64 * 1024


class _ClientHashSigner(S3SigV4Auth):  # type: ignore[misc]
    """SigV4 for S3 with the payload hash given, not computed from a body
    (the body is a stream the signer never sees)."""

    def __init__(self, credentials: Any, region: str, payload_hash: str) -> None:
        super().__init__(credentials, "s3", region)
        self._payload_hash = payload_hash

    def payload(self, request: Any) -> str:
        return self._payload_hash


@dataclass(frozen=True)
class PassThroughLimits:
    """How long and how many: what one client or one slow upload may hold."""

    acquire_timeout_s: float = 5.0  # wait for one of the origin connections
    timeout_s: float = 15 * 60.0  # one request, upload and answer included
    per_client: int = 16  # requests in flight from one client address


@dataclass
class _BodyFailure:
    """Why reading the client's body failed, if it did (seen after the upload)."""

    error: BadPayload | SignatureRejected | None = None


class _ClientLeft(Exception):
    """The client hung up before its answer's headers could go out (aiohttp
    raises the same ClientConnectionResetError for it as for the origin)."""


# Told why an answer whose headers went out ended short of its length: one of
# sidecar.telemetry.metrics.CUTOFF_REASONS, or None for a client that hung up
# itself (no cut-off).
EndedShort = Callable[[str | None], None]


# Whether the 100 (Continue) a client asked for went out ("sent"), or an answer
# came first and none will ("withheld").
_CONTINUE: web.RequestKey[str] = web.RequestKey("sidecar_continue", str)


def _expects_continue(request: web.Request) -> bool:
    return request.version == HttpVersion11 and \
        request.headers.get(hdrs.EXPECT, "").lower() == "100-continue"


async def send_continue(request: web.Request) -> None:
    """The 100 (Continue) a client that sent `Expect: 100-continue` waits for
    before its body (RFC 9110 section 10.1.1), now that the body is wanted: the
    request was checked, let through and its origin request begun (the data
    port's expect handler sends none earlier)."""
    if _expects_continue(request) and _CONTINUE not in request:
        request[_CONTINUE] = "sent"
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # not part of the answer's own bytes


def withhold_continue(request: web.Request, response: web.StreamResponse) -> None:
    """Before an answer's headers go out: a client still waiting for its 100
    gets none, and the connection closes after the answer (RFC 9110 section
    10.1.1): the client may send the body anyway or not at all, so the next
    bytes on it could be either."""
    if _expects_continue(request) and _CONTINUE not in request:
        request[_CONTINUE] = "withheld"
        if request.body_exists and not response.prepared:
            response.force_close()


class PassThrough:
    # Where the data port leaves a verified request's ChunkSigner for forward().
    CHUNK_SIGNER: ClassVar[web.RequestKey[ChunkSigner]] = web.RequestKey(
        "sidecar_chunk_signer", ChunkSigner
    )

    def __init__(
        self,
        config: OriginConfig,
        invalidate: Callable[[str, str], object],
        client_timeout_s: float = 30.0,
        limits: PassThroughLimits | None = None,
        forget_head: Callable[[str, str], object] | None = None,
    ) -> None:
        self._config = config
        self._invalidate = invalidate  # a key's blocks and remembered HEAD
        self._forget_head = forget_head  # its remembered HEAD alone
        self._client_timeout = client_timeout_s
        self._limits = limits or PassThroughLimits()
        # The origin connections pass-through requests may hold, and how many
        # each client address holds now.
        self._slots = asyncio.Semaphore(config.max_connections)
        self._per_client: Counter[str] = Counter()
        self._base = (config.endpoint or f"https://s3.{config.region}.amazonaws.com").rstrip("/")
        self._session: aiohttp.ClientSession | None = None
        self._credentials: Any = None

    @property
    def client_timeout_s(self) -> float:
        return self._client_timeout

    @client_timeout_s.setter
    def client_timeout_s(self, seconds: float) -> None:
        """A new client_timeout (a configuration reload): every wait for a
        client from now on, of requests under way too, takes it."""
        self._client_timeout = seconds

    async def start(self) -> None:
        # The same credential chain as the origin's aiobotocore client (env vars,
        # profiles, instance roles), refreshed by botocore when they expire.
        # None: an anonymous origin; requests then go unsigned.
        self._credentials = await get_session().get_credentials()
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self._config.max_connections),
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=self._config.connect_timeout_s,
                sock_read=self._config.read_timeout_s,
            ),
            auto_decompress=False,
            skip_auto_headers=_SKIP_AUTO_HEADERS,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def forward(
        self, request: web.Request, operation: Operation, bucket: str, key: str,
        chunk_signer: ChunkSigner | None = None, *, ids: tuple[str, str],
        ended_short: EndedShort | None = None,
    ) -> web.StreamResponse:
        """Send the request to the origin and stream its answer back, with
        `ids` (the request's x-amz-request-id and x-amz-id-2) for the origin's.

        An answer whose headers went out and whose body cannot be finished has
        its connection aborted, and `ended_short` is told why (its status
        says nothing of it).

        With `chunk_signer` (the verified request's), a signed aws-chunked body
        must chain to it. Raises BadPayload (a 400) for a body S3 would refuse,
        SignatureRejected (a 403) for a chunk signature that does not hold,
        OriginUnavailable (a 503) when the origin cannot be reached before an
        answer started, and Overloaded (503 SlowDown) when the client already
        has `per_client` requests in flight or no origin connection comes free
        within `acquire_timeout_s`.
        """
        client = request.remote or ""
        if self._per_client[client] >= self._limits.per_client:
            raise Overloaded(f"{client} has {self._limits.per_client} pass-through "
                             "requests in flight")
        self._per_client[client] += 1
        try:
            try:
                await asyncio.wait_for(self._slots.acquire(), self._limits.acquire_timeout_s)
            except TimeoutError:
                raise Overloaded("no origin connection came free for a pass-through "
                                 f"within {self._limits.acquire_timeout_s:g}s") from None
            try:
                return await self._forward(request, operation, bucket, key, chunk_signer, ids,
                                           ended_short)
            finally:
                self._slots.release()
        finally:
            self._per_client[client] -= 1
            if not self._per_client[client]:
                del self._per_client[client]

    async def _forward(
        self, request: web.Request, operation: Operation, bucket: str, key: str,
        chunk_signer: ChunkSigner | None, ids: tuple[str, str],
        ended_short: EndedShort | None,
    ) -> web.StreamResponse:
        assert self._session is not None, "start() first"
        payload = plan_payload(request.headers, REFRAME_CHUNK)
        chain = None
        if chunk_signer is not None and payload.signed_streaming is not None:
            chain = SignatureChain.of(chunk_signer, payload.signed_streaming)
        query = query_pairs(request.raw_path.partition("?")[2])
        path = outbound_path(bucket, key)
        encoded_query = outbound_query(query)
        url = self._base + path + (f"?{encoded_query}" if encoded_query else "")
        headers = await self._signed(
            request.method, url, outbound_headers(request.headers.items(), payload), payload
        )
        keys = [key] if operation.invalidates is Invalidates.KEY else []
        heads = [key] if operation.invalidates is Invalidates.HEAD else []
        failure = _BodyFailure()
        body: bytes | AsyncIterator[bytes] | None
        if operation.invalidates is Invalidates.DELETED_KEYS:
            body = await self._small_body(request, payload, chain)
            # The keys are in the XML, wherever the body goes framed.
            keys = deleted_keys(outbound_payload(body, payload))
        elif request.body_exists:
            body = self._stream_body(request, payload, chain, failure)
        else:
            body = None
        started = asyncio.get_running_loop().time()
        try:
            async with self._session.request(
                request.method, URL(url, encoded=True), headers=headers, data=body,
                allow_redirects=False,
                # Upload and answer together: a client trickling its body a byte
                # under client_timeout at a time holds the connection no longer.
                timeout=aiohttp.ClientTimeout(
                    total=self._limits.timeout_s, sock_connect=self._config.connect_timeout_s,
                    sock_read=self._config.read_timeout_s),
            ) as upstream:
                if 200 <= upstream.status < 300 or upstream.status >= 500:
                    # Applied, or perhaps (an error after the write, an answer
                    # a gateway lost): the cache must not outlive it either way.
                    self._forget(bucket, keys, heads)
                return await self._relay(request, upstream, ids,
                                         f"{operation.name} s3://{bucket}/{key}", ended_short,
                                         started)
        except (BadPayload, SignatureRejected):
            raise
        except _ClientLeft as left:
            # The data port counts it as a client that left (499), not as an
            # origin that failed (503).
            raise ConnectionResetError("the client left before its answer") from left
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            if failure.error is not None:
                raise failure.error from exc
            if not isinstance(exc, (aiohttp.ClientConnectorError,
                                    aiohttp.ConnectionTimeoutError)):
                # Sent, the whole body perhaps, and no answer: the origin may
                # have applied it. (No connection at all: it did not.)
                self._forget(bucket, keys, heads)
            if self._past_its_bound(exc, started):
                raise BadPayload(
                    f"The request took longer than {self._limits.timeout_s:g}s "
                    "(passthrough_timeout).", "RequestTimeout") from None
            raise OriginUnavailable(
                f"{operation.name} {bucket}/{key}: origin unreachable: {exc!r}"
            ) from exc

    def _past_its_bound(self, exc: BaseException, started: float) -> bool:
        """Whether `exc` is the request's own bound (passthrough_timeout, from
        `started` on the loop's clock) running out, not an origin's timeout."""
        return isinstance(exc, TimeoutError) and \
            asyncio.get_running_loop().time() - started >= self._limits.timeout_s

    def _forget(self, bucket: str, keys: list[str], heads: list[str]) -> None:
        """Invalidate what the cache holds of `keys`, and the remembered HEAD of
        `heads`, once per request."""
        for each in keys:
            self._invalidate(bucket, each)
        for each in heads:
            if self._forget_head is not None:
                self._forget_head(bucket, each)
        keys.clear()
        heads.clear()

    async def _signed(
        self, method: str, url: str, headers: list[tuple[str, str]], payload: Payload
    ) -> CIMultiDict[str]:
        if self._credentials is None:
            return CIMultiDict(headers)
        frozen = await self._credentials.get_frozen_credentials()
        signing = AWSRequest(method=method, url=url, data=b"")
        for name, value in headers:
            signing.headers[name] = value  # appends: repeated fields stay repeated
        _ClientHashSigner(frozen, self._config.region, payload.sha256).add_auth(signing)
        return CIMultiDict(signing.headers.items())

    async def _relay(
        self, request: web.Request, upstream: aiohttp.ClientResponse, ids: tuple[str, str],
        what: str, ended_short: EndedShort | None, started: float,
    ) -> web.StreamResponse:
        headers = CIMultiDict((name, value) for name, value in
                              response_headers(upstream.headers.items())
                              if name.lower() not in ORIGIN_ID_HEADERS)
        headers.update(id_headers(*ids))
        body = None
        if _is_error(upstream.status) and request.method != "HEAD":
            body = await _small_error_body(upstream)
            if body is not None:
                body = with_ids(body, *ids)
                headers[hdrs.CONTENT_LENGTH] = str(len(body))
        _log_origin_ids(upstream, body, what)
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason,
                                      headers=headers)
        withhold_continue(request, response)  # an origin's answer before the body
        try:
            await response.prepare(request)
        except ConnectionError as exc:
            raise _ClientLeft() from exc
        if request.method == "HEAD":
            return response
        chunks = _once(body) if body is not None else upstream.content.iter_chunked(_CHUNK)
        reason: str | None
        try:
            async for chunk in chunks:
                await self._send(response, chunk)
                request[BODY_BYTES] = request.get(BODY_BYTES, 0) + len(chunk)
            await self._send(response, None)
            return response
        except ClientGone:
            # A hang-up mid-body is the client's own doing: no cut-off, not logged.
            reason = None
        except ClientStalled:
            log.warning("cutting off a client that took no bytes of its answer in %.0fs: %s",
                        self._client_timeout, what)
            reason = "client_timeout"
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            # The origin's body failed or stalled past read_timeout, or the
            # request ran past passthrough_timeout, its own bound, which a slow
            # client holds up as much as a slow origin (the client's own
            # failures are the two above).
            if self._past_its_bound(exc, started):
                log.warning("cutting off a pass-through answer that ran past "
                            "passthrough_timeout (%gs): %s", self._limits.timeout_s, what)
                reason = "passthrough_timeout"
            else:
                log.warning("aborting a pass-through answer mid-stream, the origin failed: "
                            "%s: %r", what, exc)
                reason = "origin"
        except Exception:
            # After the headers: the data port must not write a second
            # response into this body, so it ends here too.
            log.exception("aborting a pass-through answer mid-stream: %s", what)
            reason = "error"
        # Headers (and a Content-Length) are gone: cut the connection rather
        # than let the client take a short body for a whole one.
        if request.transport is not None:
            request.transport.abort()
        if ended_short is not None:
            ended_short(reason)
        return response

    async def _send(self, response: web.StreamResponse, chunk: bytes | None) -> None:
        """One chunk of the body to the client (None: its end), told apart
        from a failure of the origin's side."""
        with sending_to_client():
            if chunk is None:
                await asyncio.wait_for(response.write_eof(), self._client_timeout)
            else:
                await asyncio.wait_for(response.write(chunk), self._client_timeout)

    async def _read(self, request: web.Request) -> bytes:
        try:
            # A client that sends nothing for client_timeout gives up its slot.
            return await asyncio.wait_for(request.content.readany(), self._client_timeout)
        except TimeoutError:
            raise BadPayload("Your socket connection to the server was not read from or "
                             "written to within the timeout period.", "RequestTimeout") from None
        except Exception as exc:  # the client hung up or broke its framing
            raise BadPayload(f"The request body ended early: {exc!r}", "IncompleteBody") from exc

    async def _stream_body(
        self, request: web.Request, payload: Payload, chain: SignatureChain | None,
        failure: _BodyFailure,
    ) -> AsyncIterator[bytes]:
        try:
            async for piece in self._decoded(request, payload, chain):
                yield piece
        except (BadPayload, SignatureRejected) as exc:
            # aiohttp reports it as a failed upload; forward() raises this instead.
            failure.error = exc
            raise

    async def _decoded(
        self, request: web.Request, payload: Payload, chain: SignatureChain | None
    ) -> AsyncIterator[bytes]:
        """The body as it goes to the origin, piece by piece as the client sends it."""
        await send_continue(request)
        if payload.mode is PayloadMode.AS_IS:
            while chunk := await self._read(request):
                yield chunk
            return
        decoder = AwsChunkedDecoder(chain)
        rechunker = Rechunker(REFRAME_CHUNK) if payload.mode is PayloadMode.REFRAME else None
        # Decoded bytes past the signed x-amz-decoded-content-length are refused
        # as they arrive, and the last declared one (re-framed: with the final
        # chunk and trailer) is held back until the framing has ended well and
        # every chunk signature held: the origin must not receive all
        # Content-Length bytes (and store the object) from a body that turns
        # out to be cut short, over-long, malformed or forged.
        gate = DeclaredLength(payload.decoded_length)
        try:
            while chunk := await self._read(request):
                for piece in decoder.feed(chunk):
                    admitted = gate.admit(piece)
                    if rechunker is None:
                        if admitted:
                            yield bytes(admitted)
                        continue
                    for framed in rechunker.feed(admitted):
                        yield framed
        except ChunkedFormatError as exc:
            raise BadPayload(str(exc), "IncompleteBody") from exc
        if not decoder.done:
            raise BadPayload("the aws-chunked body ended early", "IncompleteBody")
        last = gate.release()
        if rechunker is not None:
            trailers = [(n, v) for n, v in decoder.trailers if n == payload.trailer]
            yield b"".join(rechunker.feed(last)) + rechunker.finish(trailers)
        elif last:
            yield last

    async def _small_body(
        self, request: web.Request, payload: Payload, chain: SignatureChain | None
    ) -> bytes:
        """A DeleteObjects body as it goes to the origin, read whole (bounded) so
        its keys are known."""
        collected = bytearray()
        async for piece in self._decoded(request, payload, chain):
            collected += piece
            if len(collected) > MAX_DELETE_BODY:
                raise BadPayload("Your request was too big.", "MaxMessageLengthExceeded")
        return bytes(collected)


def _is_error(status: int) -> bool:
    """An answer S3 sends an Error document with: 4xx, 5xx, and its redirects
    (301 PermanentRedirect, 307 TemporaryRedirect); a 304 has no body."""
    return status >= 300 and status != 304


async def _small_error_body(upstream: aiohttp.ClientResponse) -> bytes | None:
    """The origin's error body, read whole, if it is small, unencoded and of a
    known length; None (nothing read) for any other."""
    encoding = upstream.headers.get(hdrs.CONTENT_ENCODING, "identity").strip().lower()
    length = upstream.content_length
    if encoding != "identity" or length is None or length > MAX_ERROR_BODY:
        return None
    return await upstream.read()


async def _once(body: bytes) -> AsyncIterator[bytes]:
    yield body


def _log_origin_ids(upstream: aiohttp.ClientResponse, body: bytes | None, what: str) -> None:
    """The origin's ids of its answer, for whoever takes a failure up with the
    object store: on the sidecar's log line (which names the sidecar's request
    id, the one the client got) when the origin answered an error, at DEBUG
    for any other answer."""
    request_id, host_id = origin_ids(upstream.headers.items())
    status = upstream.status
    if status >= 500:
        level = logging.WARNING
    elif _is_error(status):
        level = logging.INFO
    else:
        level = logging.DEBUG
    if not log.isEnabledFor(level):
        return
    code = error_code_of(body) if body is not None else ""
    log.log(level, "the origin answered %d%s to %s (its x-amz-request-id %s, x-amz-id-2 %s)",
            status, f" {code}" if code else "", what, request_id or "-", host_id or "-",
            extra={"origin_request_id": request_id, "origin_host_id": host_id})
