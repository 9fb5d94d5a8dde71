"""Data port: the S3 REST API (path-style). Object GET and HEAD are served
through the cache; every other operation is passed through to the origin
(sidecar.s3.passthrough, classified by sidecar.s3.operations).

A request is first checked and classified (sidecar.s3.preconditions.decide_read)
and only then answered. Errors are S3 XML bodies with S3's codes and statuses so
that SDKs retry and report them as they would for S3 itself; a HEAD error has no
body, as S3 sends none.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import secrets
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from datetime import UTC, datetime

from aiohttp import HttpVersion11, hdrs, web

from sidecar.bucket_names import uncached_bucket_problem
from sidecar.engine import Engine, Piece, Source, TierSlice, piece_length
from sidecar.errors import (
    DownloadsPaused,
    FetchStopped,
    OriginError,
    OriginObjectChanged,
    Overloaded,
)
from sidecar.http_fields import undecodable_field
from sidecar.model import ObjectInfo
from sidecar.origin.client import Origin
from sidecar.s3.access import AccessPolicy, Caller, admin_header_of
from sidecar.s3.addressing import split_path, validate_object_address
from sidecar.s3.auth import Authenticator
from sidecar.s3.client_sends import ClientGone, ClientStalled, sending_to_client
from sidecar.s3.errors import (
    S3Error,
    error_body,
    error_for,
    id_headers,
    invalid_range,
    paused,
    slow_down,
    stopping,
)
from sidecar.s3.held_send import offer_held
from sidecar.s3.operations import OTHER_OPERATION, Operation, classify, unclassified_name
from sidecar.s3.passthrough import PassThrough, withhold_continue
from sidecar.s3.payload import BadPayload, connection_named
from sidecar.s3.preconditions import (
    ReadDecision,
    ReadOutcome,
    RequestHeaders,
    decide_read,
    http_date,
)
from sidecar.s3.replies import AiohttpReply, Reply
from sidecar.s3.sigv4 import Reason, SignatureRejected
from sidecar.tally import ReadTally
from sidecar.telemetry.access_log import BODY_BYTES, AccessLog, ReadFacts, entry
from sidecar.telemetry.logs import CURRENT_REQUEST
from sidecar.telemetry.metrics import Metrics
from sidecar.telemetry.refused import mark_handled

log = logging.getLogger(__name__)

# nginx's status for a request whose client closed the connection before the
# answer: only ever seen in metrics and the access log, never sent.
CLIENT_CLOSED_REQUEST = 499
# Bytes an open-ended response may run ahead of what its client has read: it
# keeps an abandoned `bytes=pos-` read from pulling more blocks and read heads
# honest. Bounded ranges keep the kernel's default: the client asked for all of
# it, and a small buffer would split each write into many wake-ups.
SEND_BUFFER_BYTES = 128 * 1024
# The codes S3 refuses a signature with (S3 API Reference, "Error responses");
# SDKs act on them: the Java SDK and botocore correct their clock and retry on
# RequestTimeTooSkewed (and, with a server Date far from theirs, on
# SignatureDoesNotMatch), so a broker whose clock drifted recovers as it would
# against S3. Everything else (unsigned, malformed, expired) is AccessDenied.
_REFUSAL_CODES = {
    Reason.BAD_SIGNATURE: "SignatureDoesNotMatch",
    Reason.UNKNOWN_KEY: "InvalidAccessKeyId",
    Reason.SKEWED: "RequestTimeTooSkewed",
}
# The object's headers a 304 repeats (RFC 9110 section 15.4.5).
_KEPT_ON_304 = frozenset({"cache-control", "expires"})
# The request header that asks for the object's checksums, and its one value.
CHECKSUM_MODE = "x-amz-checksum-mode"
CHECKSUM_MODE_ENABLED = "ENABLED"


async def _continue_later(request: web.Request) -> None:
    """aiohttp's own handler answers `Expect: 100-continue` at once, before the
    request is authenticated, classified or let through: the client then sends
    its body (a 5 GiB PUT) for a refusal. The 100 goes out when the body is
    first read (sidecar.s3.passthrough), so a refusal comes instead (RFC 9110
    section 10.1.1). Any other expectation is refused, as aiohttp refuses it."""
    expect = request.headers.get(hdrs.EXPECT, "")
    if request.version == HttpVersion11 and expect.lower() != "100-continue":
        raise web.HTTPExpectationFailed(text=f"Unknown Expect: {expect}")


# The response whose headers a request's handler began to send (set as aiohttp
# prepares it): what a cancelled handler's status was, if any went out.
_PREPARED: web.RequestKey[web.StreamResponse] = web.RequestKey(
    "sidecar_prepared", web.StreamResponse)


def new_host_id() -> str:
    """An x-amz-id-2 (an error body's HostId): opaque, as S3's is, base64 of
    random bytes, one per request like x-amz-request-id."""
    return base64.b64encode(secrets.token_bytes(48)).decode("ascii")


def abort(transport: asyncio.Transport | None) -> None:
    """Cut the connection of an answer whose headers (and Content-Length) are
    gone, rather than let the client take a short body for a whole one."""
    if transport is not None:
        transport.abort()


def object_headers(info: ObjectInfo, ids: tuple[str, str]) -> dict[str, str]:
    """The headers of every answer about the object (S3 sends them on each)."""
    return {
        "ETag": info.etag,
        "Last-Modified": http_date(info.last_modified),
        "Accept-Ranges": "bytes",
        **id_headers(*ids),
    }


def read_conditions(headers: Mapping[str, str]) -> RequestHeaders:
    """A read's Range and preconditions, from its request's headers."""
    return RequestHeaders(
        range=headers.get("Range"),
        if_match=headers.get("If-Match"),
        if_none_match=headers.get("If-None-Match"),
        if_modified_since=headers.get("If-Modified-Since"),
        if_unmodified_since=headers.get("If-Unmodified-Since"),
        if_range=headers.get("If-Range"),
    )


@dataclass(frozen=True)
class BodyAnswer:
    """A 200 or 206 with a body: its status and headers, its bytes [start, end]
    of the object, and whether they are read as the client reads (lazy)."""

    status: int
    headers: dict[str, str]
    start: int
    end: int
    lazy: bool

    @property
    def length(self) -> int:
        return self.end - self.start + 1


@dataclass(frozen=True)
class PlainPlan:
    """A request the plain-range path answers: its operation's name, the object's
    remembered HEAD, the answer, and its x-amz-request-id."""

    operation: str
    info: ObjectInfo
    answer: BodyAnswer
    request_id: str


class DataPort:
    def __init__(
        self,
        engine: Engine,
        origin: Origin,
        metrics: Metrics,
        max_requests: int = 256,
        client_timeout_s: float = 30.0,
        access_log: AccessLog | None = None,
        auth: Authenticator | None = None,
        passthrough: PassThrough | None = None,
        access: AccessPolicy | None = None,
    ) -> None:
        self._auth = auth
        self._access = access or AccessPolicy()
        self._passthrough = passthrough
        self._engine = engine
        self._origin = origin
        self._metrics = metrics
        self._max_requests = max_requests
        self._client_timeout = client_timeout_s
        self._active = 0
        self._access_log = access_log
        # Whether the handler's answers close their connections: set where
        # the plain-range path (sidecar.s3.plain_ranges) fronts the port.
        self.close_handled = False

    def configure(self, max_requests: int, client_timeout_s: float, auth: Authenticator,
                  access: AccessPolicy | None = None) -> None:
        """Admission, who may sign and what they may do, as a configuration
        reload changes them: for the requests that arrive from now on."""
        self._max_requests = max_requests
        self._client_timeout = client_timeout_s
        self._auth = auth
        self._access = access or AccessPolicy()

    def app(self) -> web.Application:
        application = web.Application()
        # Every path, line breaks included: S3 keys may hold CR and LF, and the
        # router's "." stops at a decoded LF (a plain-text 404 from aiohttp,
        # with no S3 error, no metric and no access log line).
        application.router.add_route("*", r"/{tail:[\s\S]*}", self.handle,
                                     expect_handler=_continue_later)
        application.on_response_prepare.append(self._note_prepared)
        return application

    async def _note_prepared(self, request: web.Request, response: web.StreamResponse) -> None:
        request[_PREPARED] = response
        if self.close_handled:
            # Connection: close (RFC 9112 section 9.6), so that a client that
            # pools its connections (the AWS SDK under Aiven's plugin) sends
            # its next request on a new one, which starts on the plain-range
            # path: a connection handed to this handler stays with it. The
            # header too: aiohttp has written its Connection field by now.
            response.force_close()
            response.headers[hdrs.CONNECTION] = "close"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        mark_handled(request)  # counted below, not as refused by aiohttp
        request_id = secrets.token_hex(8).upper()
        host_id = new_host_id()
        started = time.monotonic()
        op = unclassified_name(request.method)  # until classified
        resource = request.raw_path.partition("?")[0]
        cache_label = "none"
        facts = ReadFacts()  # what the access log says of the object read, if any
        cancelled: asyncio.CancelledError | None = None
        self._active += 1
        # Every log line of this request, and of the fetches it starts, names it.
        context = CURRENT_REQUEST.set(request_id)
        try:
            unreadable = undecodable_field(request.headers.items())
            if unreadable is not None:
                raise S3Error(400, "InvalidArgument", f"Header {unreadable} is not valid UTF-8.")
            # First, for every method: nothing is parsed or forwarded for a stranger.
            caller = self._authenticate(request)
            if self._active > self._max_requests:
                raise slow_down()
            bucket, key, query = split_path(request.raw_path)
            operation = classify(request.method, bucket, key, query, request.headers)
            op = operation.name
            if operation.name == OTHER_OPERATION:
                # Not an S3 operation (PATCH, TRACE, a bare POST to a key...): S3
                # answers 405, and the origin is never asked.
                raise S3Error(405, "MethodNotAllowed",
                              "The specified method is not allowed against this resource.")
            if caller.anonymous:
                self._refuse_anonymous_writes(operation, query)
            if bucket:
                validate_object_address(bucket, key)
            copy_sources = request.headers.getall("x-amz-copy-source", [])
            if len(copy_sources) > 1:
                # Only one is checked below; an origin might copy from another.
                raise S3Error(400, "InvalidArgument",
                              "The x-amz-copy-source header may be sent once.")
            # Before the origin is asked: what this caller may do here at all.
            refusal = self._access.refusal(caller, operation.name, bucket,
                                           next(iter(copy_sources), None),
                                           admin_header_of(request.headers.items()))
            if refusal is not None:
                self._metrics.access_denied.labels(operation.name).inc()
                raise S3Error(403, "AccessDenied", refusal)
            if not operation.cached:
                response = await self._pass_through(request, operation, bucket, key,
                                                    (request_id, host_id), facts)
            else:
                if (too_long := uncached_bucket_problem(bucket)) is not None:
                    # A legacy name past what a cache slot records: said as it
                    # is, not as a bucket that does not exist or is not valid.
                    raise S3Error(400, "InvalidBucketName",
                                  f"The sidecar cannot cache this bucket's objects ({too_long}).")
                response, cache_label = await self._read(request, bucket, key,
                                                         (request_id, host_id), facts)
        except Overloaded:
            response = self._error_response(request, slow_down(), resource, (request_id, host_id))
        except DownloadsPaused:
            response = self._error_response(request, paused(), resource, (request_id, host_id))
        except S3Error as exc:
            response = self._error_response(request, exc, resource, (request_id, host_id))
        except ConnectionError:
            # The client left before its answer went out (aiohttp raises this
            # from prepare()): nothing to send, and nothing wrong here.
            self._metrics.client_disconnects.inc()
            response = web.Response(status=CLIENT_CLOSED_REQUEST)
        except asyncio.CancelledError as exc:
            # aiohttp cancels a handler still running past its shutdown timeout
            # as the sidecar stops (its runner does not cancel on a hang-up):
            # counted and logged like any request before the cancellation goes on.
            cancelled = exc
            response = self._stopped(request, facts)
        except Exception:
            log.exception("request %s %s failed", request_id, resource,
                          extra={"resource": resource})
            response = self._error_response(
                request,
                S3Error(500, "InternalError",
                        "We encountered an internal error. Please try again."),
                resource, (request_id, host_id),
            )
        finally:
            self._active -= 1
            # aiohttp answers the requests of a keep-alive connection in one task.
            CURRENT_REQUEST.reset(context)
        withhold_continue(request, response)  # answered without reading the body
        self._record(op, response.status, cache_label, started, request_id, request.method,
                     request.raw_path, request.headers.get("Range"),
                     request.get(BODY_BYTES, 0), facts)
        if cancelled is not None:
            raise cancelled
        return response

    def _record(self, op: str, status: int, cache_label: str, started: float,
                request_id: str, method: str, raw_path: str, range_header: str | None,
                body_bytes: int, facts: ReadFacts) -> None:
        """A request answered: its metrics and its access log line."""
        elapsed = time.monotonic() - started
        self._metrics.requests.labels(op, str(status)).inc()
        self._metrics.request_duration.labels(op, cache_label).observe(elapsed)
        if self._access_log is not None:
            self._access_log.write(entry(
                now=time.time(), request_id=request_id, method=method,
                raw_path=raw_path, range_header=range_header,
                status=status, body_bytes=body_bytes,
                cache=cache_label, duration_s=elapsed, node=self._access_log.node,
                read=facts,
            ))

    def plain_plan(self, raw_path: str, headers: Mapping[str, str],
                  fields: Sequence[tuple[str, str]]) -> PlainPlan | None:
        """What a `GET` with a satisfiable Range of an object whose HEAD is
        remembered, which the handler would let through, is answered with, for
        the plain-range path (sidecar.s3.plain_ranges) to send; None for every
        other request, which the handler answers (`handle`). Nothing is
        counted, asked or logged here: a request that gets None goes to the
        handler as it came."""
        if self._active >= self._max_requests:
            return None
        try:
            verified = None if self._auth is None else self._auth.check("GET", raw_path, fields)
            bucket, key, query = split_path(raw_path)
            operation = classify("GET", bucket, key, query, headers)
            if not operation.cached or not bucket:
                return None  # a listing, a pass-through: the handler's
            validate_object_address(bucket, key)
        except (SignatureRejected, S3Error, ValueError):
            return None  # the handler says why (UnicodeError is a ValueError)
        if self._auth is None:
            caller = Caller("")  # no authentication at all (`_authenticate`)
        elif verified is None:
            caller = Caller(None)
            if not self._auth.anonymous_may(operation.name):
                return None
        else:
            caller = Caller(verified.access_key)
        if any(name.startswith("response-") for name in query) \
                or uncached_bucket_problem(bucket) is not None \
                or self._access.refusal(caller, operation.name, bucket,
                                        None, admin_header_of(fields)) is not None:
            return None
        info = self._origin.remembered_head(bucket, key)
        if info is None:
            return None
        decision = decide_read(read_conditions(headers), size=info.size, etag=info.etag,
                               last_modified=info.last_modified, now=datetime.now(UTC))
        if decision.outcome is not ReadOutcome.PARTIAL:
            return None
        ids = (secrets.token_hex(8).upper(), new_host_id())
        return PlainPlan(operation.name, info, self.body_answer(headers, info, decision, ids),
                        ids[0])

    async def answer_plain(self, plan: PlainPlan, reply: Reply, raw_path: str,
                          range_header: str, body_bytes: Callable[[], int]) -> bool:
        """Stream `plan`'s answer into `reply`, counted and logged as `handle`
        counts and logs a request; False when nothing went out and the request
        is the handler's to answer afresh (a failure before the first byte,
        whose S3 error the handler knows how to say)."""
        started = time.monotonic()
        info, answer = plan.info, plan.answer
        facts = ReadFacts(etag=info.etag, object_size=info.size, first_byte=answer.start,
                          last_byte=answer.end, tally=ReadTally())
        cancelled: asyncio.CancelledError | None = None
        status, cache_label = answer.status, "none"
        self._active += 1
        context = CURRENT_REQUEST.set(plan.request_id)
        try:
            cache_label = await self.stream(reply, info, answer, facts)
        except asyncio.CancelledError as exc:
            # The sidecar stopping, past its drain (as `_stopped` records it).
            cancelled = exc
            if reply.prepared:
                self.cut_off(reply.transport, facts, "stopped")
            else:
                status = stopping().status
                abort(reply.transport)
        except ConnectionResetError:
            if reply.prepared:
                raise
            # The client left before its answer went out (handle's 499).
            self._metrics.client_disconnects.inc()
            status = CLIENT_CLOSED_REQUEST
            abort(reply.transport)
        except Exception:
            if reply.prepared:
                raise
            return False
        finally:
            self._active -= 1
            CURRENT_REQUEST.reset(context)
        self._metrics.plain_range_requests.inc()
        self._record(plan.operation, status, cache_label, started, plan.request_id, "GET",
                     raw_path, range_header, body_bytes(), facts)
        if cancelled is not None:
            raise cancelled
        return True

    def _stopped(self, request: web.Request, facts: ReadFacts) -> web.StreamResponse:
        """What a request cancelled as the sidecar stops is recorded as: the
        status it went out with, cut off (`stopped`); else the 503 a stop
        answers before any byte (nothing is sent: the connection closes)."""
        sent: web.StreamResponse | None = request.get(_PREPARED)
        if sent is not None and sent.prepared:
            self.cut_off(request.transport, facts, "stopped")
            return sent
        return web.Response(status=stopping().status)

    def _authenticate(self, request: web.Request) -> Caller:
        """Check the request's signature: who sent it (anonymous: no key)."""
        if self._auth is None:
            return Caller("")  # no authentication at all: an unscoped caller
        try:
            verified = self._auth.check(
                request.method, request.raw_path, list(request.headers.items())
            )
        except SignatureRejected as exc:
            self._metrics.auth_failures.labels(exc.reason.value).inc()
            raise S3Error(403, _REFUSAL_CODES.get(exc.reason, "AccessDenied"),
                          exc.message) from None
        if verified is None:
            return Caller(None)
        # RFC 9110 section 7.6.1: a proxy drops the fields Connection names, and
        # the sidecar re-signs without them; a signed one (an encryption or
        # object-lock header, a precondition) would silently not reach the origin.
        dropped = sorted(connection_named(request.headers.items()) & verified.signed_headers)
        if dropped:
            raise S3Error(400, "InvalidArgument",
                          f"The Connection header names the signed header {dropped[0]}.")
        # A signed aws-chunked body must chain to this signature (checked as the
        # pass-through decodes it).
        request[PassThrough.CHUNK_SIGNER] = verified.chunk_signer
        return Caller(verified.access_key)

    def _refuse_anonymous_writes(self, operation: Operation, query: Mapping[str, str]) -> None:
        """Next to access keys, anonymous requests only read: everything the cache
        does not serve goes to the origin with the sidecar's own credentials.
        Nor may they override the answer's headers, which S3 refuses to an
        unsigned GET (GetObject API reference: response-* parameters)."""
        if self._auth is None:
            return
        if not self._auth.anonymous_may(operation.name):
            self._metrics.auth_failures.labels(Reason.UNSIGNED.value).inc()
            raise S3Error(403, "AccessDenied",
                          "Anonymous requests may only read here; sign this one.")
        if any(name.startswith("response-") for name in query):
            raise S3Error(400, "InvalidRequest", "Request specific response headers "
                          "cannot be used for anonymous GET requests.")

    async def _pass_through(
        self, request: web.Request, operation: Operation, bucket: str, key: str,
        ids: tuple[str, str], facts: ReadFacts,
    ) -> web.StreamResponse:
        """Everything but a plain object GET/HEAD: the origin answers (sidecar.s3.passthrough)."""
        if self._passthrough is None:
            raise S3Error(501, "NotImplemented", "Only object GET and HEAD are served here.")

        def ended_short(reason: str | None) -> None:
            # Its connection is aborted already; counted as a cached read's is.
            if reason is None:
                self._metrics.client_disconnects.inc()
            else:
                self._count_cut_off(facts, reason)

        try:
            return await self._passthrough.forward(
                request, operation, bucket, key, request.get(PassThrough.CHUNK_SIGNER), ids=ids,
                ended_short=ended_short,
            )
        except BadPayload as exc:
            raise S3Error(400, exc.code, str(exc)) from exc
        except SignatureRejected as exc:
            # A chunk of a signed aws-chunked body that does not chain: S3's answer.
            self._metrics.auth_failures.labels(exc.reason.value).inc()
            raise S3Error(403, "SignatureDoesNotMatch", exc.message) from None
        except OriginError as exc:
            raise error_for(exc, bucket=bucket, key=key) from exc

    async def _read(
        self, request: web.Request, bucket: str, key: str, ids: tuple[str, str],
        facts: ReadFacts,
    ) -> tuple[web.StreamResponse, str]:
        """HEAD (remembered) then answer; once more if the object changed meanwhile.

        A GET of the origin carries the remembered ETag in If-Match; a 412 means
        the object was rewritten (the origin has forgotten the old HEAD by
        then). Nothing was sent yet, so the request is answered afresh from the
        new version: its size, ETag and preconditions, never bytes of both.
        """
        for attempt in (1, 2):
            try:
                info = await self._origin.head(bucket, key)
                return await self._answer(request, info, ids, facts)
            except OriginObjectChanged as exc:
                if attempt == 2:
                    raise error_for(exc, bucket=bucket, key=key) from exc
                log.info("s3://%s/%s changed at the origin; reading the new version",
                         bucket, key)
            except OriginError as exc:
                raise error_for(exc, bucket=bucket, key=key) from exc
        raise AssertionError("unreachable")

    async def _answer(
        self, request: web.Request, info: ObjectInfo, ids: tuple[str, str], facts: ReadFacts,
    ) -> tuple[web.StreamResponse, str]:
        headers = request.headers
        facts.etag, facts.object_size = info.etag, info.size
        decision = decide_read(read_conditions(headers), size=info.size, etag=info.etag,
                               last_modified=info.last_modified, now=datetime.now(UTC))
        if decision.outcome is ReadOutcome.NOT_MODIFIED:
            # RFC 9110 section 15.4.5: a 304 carries the Cache-Control and
            # Expires a 200 would, so a cache revalidating the object keeps its
            # freshness as the object's metadata sets it.
            common = object_headers(info, ids)
            common.update((name, value) for name, value in info.headers
                          if name.lower() in _KEPT_ON_304)
            return web.Response(status=304, headers=common), "none"
        if decision.outcome is ReadOutcome.PRECONDITION_FAILED:
            raise S3Error(412, "PreconditionFailed",
                          "At least one of the pre-conditions you specified did not hold",
                          details=(("Condition", decision.condition or ""),))
        if decision.outcome is ReadOutcome.NOT_SATISFIABLE:
            raise invalid_range(headers.get("Range", ""), info.size)
        answer = self.body_answer(headers, info, decision, ids)
        reply = AiohttpReply(request, answer.status, answer.headers, answer.length)
        if answer.length:
            facts.first_byte, facts.last_byte = answer.start, answer.end
        if request.method == "HEAD" or not answer.length:
            await reply.prepare()
            return reply.response, "none"
        facts.tally = ReadTally()
        return reply.response, await self.stream(reply, info, answer, facts)

    def body_answer(self, headers: Mapping[str, str], info: ObjectInfo, decision: ReadDecision,
                    ids: tuple[str, str]) -> BodyAnswer:
        """The status and headers of a 200 or 206 that `decision` (PARTIAL or
        WHOLE) makes of the object, and the bytes its body holds."""
        common = object_headers(info, ids)
        if decision.outcome is ReadOutcome.PARTIAL:
            assert decision.range is not None
            start, end, status = decision.range.start, decision.range.end, 206
            common["Content-Range"] = decision.range.content_range(info.size)
        else:
            start, end, status = 0, info.size - 1, 200
        common["Content-Type"] = info.content_type or "binary/octet-stream"
        common.update(info.headers)  # user metadata, encodings, version: as S3 repeats them
        if status == 200 and headers.get(CHECKSUM_MODE) == CHECKSUM_MODE_ENABLED:
            # The whole object's checksums, as S3 answers a GET or HEAD that
            # asks for them (GetObject and HeadObject references, ChecksumMode):
            # never on a 206, whose bytes they do not describe.
            common.update(info.checksums)
        # Whether the first byte comes without waiting for the origin: lets a
        # client (`sidecar replay`) report hit rates per fetch.
        common["x-sidecar-cache"] = "hit" if self._engine.will_hit(info, start) else "miss"
        # An open-ended range or a whole-object GET is read as the client reads.
        lazy = status == 200 or headers.get("Range", "").rstrip().endswith("-")
        return BodyAnswer(status, common, start, end, lazy)

    async def stream(self, reply: Reply, info: ObjectInfo, answer: BodyAnswer,
                     facts: ReadFacts) -> str:
        """The answer's body from the engine into `reply` (its headers go out
        with the first piece): the cache label of the access log. Raises what
        failed before the headers went out; after, the connection is cut."""
        sources: set[Source] = set()
        transport = reply.transport
        if answer.lazy and transport is not None:
            transport.set_write_buffer_limits(high=SEND_BUFFER_BYTES // 2)
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        try:
            async with aclosing(self._engine.stream(info, answer.start, answer.end,
                                                    lazy=answer.lazy,
                                                    tally=facts.tally)) as pieces:
                async for piece, source in pieces:
                    try:
                        with sending_to_client():
                            if not reply.prepared:
                                await reply.prepare()
                            await self._send(reply, piece, answer.lazy)
                    finally:
                        if isinstance(piece, TierSlice):
                            piece.release()  # sent or not: its region may be refilled
                    sources.add(source)
                    self._metrics.served_bytes.labels(source.value).inc(piece_length(piece))
                    reply.count(piece_length(piece))
        except ClientGone as gone:
            # The client went away (what it read was counted).
            if not reply.prepared:
                # handle() records 499; no headers promising a body go out.
                raise ConnectionResetError("the client left before its answer") from gone
            # A hang-up mid-body is how a Kafka fetch ends: counted, never logged.
            self._metrics.client_disconnects.inc()
            abort(reply.transport)
        except ClientStalled:
            # Only a piece's sending has the timer, and that is after the headers.
            log.warning("cutting off a client that took no piece of its answer in %.0fs: s3://%s/%s",
                        self._client_timeout, info.bucket, info.key)
            self.cut_off(reply.transport, facts, "client_timeout")
        except FetchStopped as exc:
            # The fetch of a block the answer needs was stopped (the engine
            # closing): neither the client's doing nor the origin's.
            if not reply.prepared:
                raise stopping() from exc
            log.warning("aborting s3://%s/%s mid-stream: %s", info.bucket, info.key, exc)
            self.cut_off(reply.transport, facts, "stopped")
        except (Overloaded, DownloadsPaused) as exc:
            if not reply.prepared:
                raise
            self.cut_off(reply.transport, facts,
                         "overloaded" if isinstance(exc, Overloaded) else "paused")
        except OriginError as exc:
            if not reply.prepared:
                if isinstance(exc, OriginObjectChanged):
                    raise  # _read tries once more, with the object's new HEAD
                raise error_for(exc, bucket=info.bucket, key=info.key) from exc
            log.warning("aborting s3://%s/%s mid-stream: %s", info.bucket, info.key, exc)
            self.cut_off(reply.transport, facts, "origin")
        except Exception as exc:
            # Anything else, a TimeoutError or ConnectionError of the engine's
            # own among it (the client's are ClientStalled and ClientGone).
            if not reply.prepared:
                if isinstance(exc, ConnectionError):
                    # Not for handle() to take as a client that left (499).
                    raise RuntimeError(f"the engine failed: {exc!r}") from exc
                raise  # handle() answers 500 InternalError
            # Anything else after the headers: handle() must not write a second
            # response into this body.
            log.exception("aborting s3://%s/%s mid-stream", info.bucket, info.key)
            self.cut_off(reply.transport, facts, "error")
        if Source.CACHE in sources and Source.ORIGIN in sources:
            return "partial"
        return "hit" if sources == {Source.CACHE} else "miss"

    async def _send(self, reply: Reply, piece: Piece, lazy: bool) -> None:
        """One piece to the client; a client that takes none of it within
        client_timeout is cut off (its connection and the piece are let go).

        A piece of the memory tier goes out with sendfile: what the socket
        takes at once (``offer_held``), then the rest (``Reply.send_held``).

        An open-ended read goes out SEND_BUFFER_BYTES at a time: what the socket
        does not take at once is copied into the transport's buffer, and a whole
        chunk held there per response is memory spent on bytes a Kafka fetch
        mostly never reads. One timer covers the whole piece, not one a write
        (bench/ANALYSIS.md has what each way cost)."""
        sent = 0
        if isinstance(piece, TierSlice):
            # What the socket takes at once needs no timer and no wait.
            sent = offer_held(reply.transport, piece)
            if sent == piece.count:
                return
        async with asyncio.timeout(self._client_timeout):
            if isinstance(piece, TierSlice):
                await reply.send_held(piece, sent)
                return
            if not lazy:
                await reply.write(piece)
                return
            view = memoryview(piece)
            for at in range(0, len(view), SEND_BUFFER_BYTES):
                await reply.write(view[at:at + SEND_BUFFER_BYTES])

    def cut_off(self, transport: asyncio.Transport | None, facts: ReadFacts,
                reason: str) -> None:
        """End an answer whose status already went out, short of its length:
        counted, and named in its access log line, since its status (200 or
        206, in sidecar_requests_total too) says nothing of it."""
        self._count_cut_off(facts, reason)
        abort(transport)

    def _count_cut_off(self, facts: ReadFacts, reason: str) -> None:
        facts.cut_off = reason
        self._metrics.client_cutoffs.labels(reason).inc()

    def _error_response(
        self, request: web.Request, error: S3Error, resource: str, ids: tuple[str, str],
    ) -> web.Response:
        headers = {**id_headers(*ids), **dict(error.headers)}
        if request.method == "HEAD":
            return web.Response(status=error.status, headers=headers)
        return web.Response(
            status=error.status, body=error_body(error, resource, *ids), headers=headers,
            content_type="application/xml",
        )
