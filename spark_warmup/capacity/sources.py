"""Where the access logs are: files, directories, globs, or s3://bucket/prefix.

The driver expands the paths into splits (a file's byte ranges, an object);
executors read the lines of a split (files from their own disk, which a
cluster shares, objects with boto3). A split that cannot be read yields one
`Unreadable` marker instead of failing the job.
"""

from __future__ import annotations

import glob
import itertools
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

from spark_warmup.capacity.trace import Malformed

SPLIT_BYTES = 64 * 1024 * 1024  # a task's share of a large log file
# A line the sidecar writes is a few hundred bytes (a key is at most 1 KiB): a
# longer one is no log line (a file of NULs after a crash, a core dump in the
# log directory), and is counted without being held whole, however long.
MAX_LINE_BYTES = 1024 * 1024
LONG_LINE = Malformed(f"line longer than {MAX_LINE_BYTES} bytes")
_READ_BYTES = 64 * 1024
# A gzip member's first bytes (RFC 1952 section 2.3.1): logrotate's `compress`
# leaves such files next to the live log. Only plain JSON lines are read; a
# compressed file is named as unreadable rather than counted as thousands of
# lines that are not JSON.
GZIP_MAGIC = b"\x1f\x8b"
COMPRESSED = "gzip-compressed: only plain JSON lines are read (gunzip it first)"


@dataclass(frozen=True)
class Split:
    """Bytes [start, end) of `path` (a local file), or the whole object s3://bucket/key."""

    path: str
    start: int = 0
    end: int = -1  # -1: to the end
    bucket: str | None = None

    @property
    def name(self) -> str:
        return f"s3://{self.bucket}/{self.path}" if self.bucket else self.path


@dataclass(frozen=True)
class Unreadable:
    source: str
    reason: str


def expand(paths: Sequence[str], s3: Any | None = None,
           split_bytes: int = SPLIT_BYTES) -> tuple[list[Split], list[Unreadable]]:
    """The splits of every PATH, and the PATHs that name nothing readable."""
    splits: list[Split] = []
    missing: list[Unreadable] = []
    # A file or object named by two PATHs (a directory and a glob inside it, a
    # prefix and a longer one) is read once: read twice, every figure of its
    # node would count twice.
    seen: set[str] = set()
    for path in paths:
        if path.startswith("s3://"):
            found = _objects(path, s3)
            if isinstance(found, Unreadable):
                missing.append(found)
                continue
            for split in found:
                if split.name not in seen:
                    seen.add(split.name)
                    splits.append(split)
            continue
        files = sorted(_files(path))
        if not files:
            missing.append(Unreadable(path, "no such file, directory or match"))
        for file in files:
            if os.path.realpath(file) in seen:
                continue
            seen.add(os.path.realpath(file))
            try:
                size = os.path.getsize(file)
            except OSError as exc:
                missing.append(Unreadable(file, exc.strerror or str(exc)))
                continue
            splits.extend(Split(file, start, min(size, start + split_bytes))
                          for start in range(0, max(size, 1), split_bytes))
    return splits, missing


def matches_nothing(path: str) -> bool:
    """Whether a local PATH (not s3://) names no file: checked on the driver before
    Spark starts, where an object store's listing is left to the executors."""
    return not path.startswith("s3://") and not _files(path)


def _files(path: str) -> list[str]:
    """The files PATH names: itself, every file under a directory, and both for
    what a glob matches (`/logs/broker-*` matching one directory per node)."""
    if os.path.isdir(path):
        return _under(path)
    if os.path.isfile(path):
        return [path]
    found: dict[str, None] = {}  # `**` matches a directory and the files under it
    for match in glob.glob(path, recursive=True):
        files = _under(match) if os.path.isdir(match) else [match] \
            if os.path.isfile(match) else []
        found.update(dict.fromkeys(os.path.normpath(file) for file in files))
    return list(found)


def _under(directory: str) -> list[str]:
    """The regular files under `directory`: a named pipe among them (a log
    piped to a collector) would block its reader for as long as no one writes."""
    return [path for root, _, names in os.walk(directory) for name in names
            if not name.startswith(".") and os.path.isfile(path := os.path.join(root, name))]


def _objects(url: str, s3: Any | None) -> list[Split] | Unreadable:
    bucket, _, prefix = url[len("s3://"):].partition("/")
    if not bucket:
        return Unreadable(url, "no bucket in the s3:// URL")
    try:
        client = s3 if s3 is not None else s3_client()
        keys: list[Split] = []
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                     Prefix=prefix):
            keys.extend(Split(item["Key"], bucket=bucket) for item in page.get("Contents", ()))
    except Exception as exc:  # botocore's errors, a refused connection: named, not fatal
        return Unreadable(url, f"cannot list: {exc}")
    if not keys:
        return Unreadable(url, "no object under this prefix")
    return keys


def s3_client() -> Any:
    """A boto3 client from the environment (AWS_* variables, AWS_ENDPOINT_URL)."""
    import boto3

    return boto3.client("s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None)


def read_split(split: Split) -> Iterator[str | Unreadable | Malformed]:
    """The lines of one split (a line belongs to the split it starts in); a line
    longer than MAX_LINE_BYTES is LONG_LINE, never held whole."""
    try:
        if split.bucket is not None:
            body = s3_client().get_object(Bucket=split.bucket, Key=split.path)["Body"]
            yield from object_lines(split.name, body.iter_chunks(_READ_BYTES))
            return
        with open(split.path, "rb") as file:
            if file.read(len(GZIP_MAGIC)) == GZIP_MAGIC:
                if not split.start:  # said once, by the file's first split
                    yield Unreadable(split.name, COMPRESSED)
                return
            file.seek(0)
            position = split.start
            if split.start:
                file.seek(split.start - 1)
                # The end of a line the previous split reads.
                position = split.start - 1 + _read_line(file)[1]
            while split.end < 0 or position < split.end:
                line, length = _read_line(file)
                if not length:
                    break
                position += length
                yield line if isinstance(line, Malformed) else line.decode("utf-8", "replace")
    except Exception as exc:
        yield Unreadable(split.name, str(exc))


def object_lines(name: str, chunks: Iterable[bytes]) -> Iterator[str | Unreadable | Malformed]:
    """The lines of an object read in `chunks` (read_split's, for one named `name`)."""
    pieces = iter(chunks)
    first = next(pieces, b"")
    if first.startswith(GZIP_MAGIC):
        yield Unreadable(name, COMPRESSED)
        return
    for raw in split_lines(itertools.chain([first], pieces)):
        yield raw if isinstance(raw, Malformed) else raw.decode("utf-8", "replace")


def _read_line(file: BinaryIO) -> tuple[bytes | Malformed, int]:
    """The next line of `file` and the bytes it took (0: the end): past
    MAX_LINE_BYTES, LONG_LINE, the rest of it skipped a piece at a time."""
    raw = file.readline(MAX_LINE_BYTES + 1)
    if len(raw) <= MAX_LINE_BYTES or raw.endswith(b"\n"):
        return raw, len(raw)
    length = len(raw)
    while raw and not raw.endswith(b"\n"):
        raw = file.readline(_READ_BYTES)
        length += len(raw)
    return LONG_LINE, length


def split_lines(chunks: Iterable[bytes]) -> Iterator[bytes | Malformed]:
    """The lines of a stream read in `chunks` (each with its newline, the last
    perhaps without); past MAX_LINE_BYTES, LONG_LINE."""
    pending = bytearray()
    too_long = False
    for chunk in chunks:
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            if too_long or len(pending) + end + 1 - start > MAX_LINE_BYTES + 1:
                yield LONG_LINE
            else:
                yield bytes(pending) + chunk[start:end + 1]
            pending.clear()
            too_long, start = False, end + 1
        if not too_long:
            pending += chunk[start:]
            if len(pending) > MAX_LINE_BYTES:
                too_long = True
                pending.clear()
    if too_long:
        yield LONG_LINE
    elif pending:
        yield bytes(pending)
