"""The benchmark data set: genuine Kafka segments on disk, laid out path-style.

Objects live at ``{root}/{bucket}/{key}`` so that an nginx ``root {root};``
serves ``GET /{bucket}/{key}`` exactly as an S3 endpoint would (path-style).
The segments are the same ones the demo writes (``generate_topic_segments``):
record batches v2 with valid CRCs, in the Aiven tiered-storage key layout.

A data set directory is complete when its ``manifest.json`` names the spec it
was built for and every object it lists is on disk with its size; anything
else is rebuilt from scratch. The manifest is written last, so an interrupted
build is never taken for a complete one.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote
from xml.sax.saxutils import escape

from sidecar.tools.kafka_segments import generate_topic_segments

BUCKET = "tiered"
TOPIC = "orders"
MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
S3_XMLNS = "http://s3.amazonaws.com/doc/2006-03-01/"
MiB = 1024 * 1024


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    partitions: int
    segments_per_partition: int
    segment_bytes: int
    value_size: int = 8192
    seed: int = 405
    topic: str = TOPIC
    bucket: str = BUCKET

    @property
    def nominal_bytes(self) -> int:
        return self.partitions * self.segments_per_partition * self.segment_bytes


#: `make bench`: 4 partitions x 4 segments x 64 MiB = 1 GiB.
FULL = DatasetSpec("full", partitions=4, segments_per_partition=4, segment_bytes=64 * MiB)
#: `python -m bench --quick`: 4 partitions x 2 segments x 32 MiB = 256 MiB.
QUICK = DatasetSpec("quick", partitions=4, segments_per_partition=2, segment_bytes=32 * MiB)


@dataclass(frozen=True)
class StoredObject:
    key: str
    size: int
    partition: int
    start_offset: int
    end_offset: int


@dataclass(frozen=True)
class Dataset:
    root: Path
    spec: DatasetSpec
    topic_id: str
    objects: tuple[StoredObject, ...]

    @property
    def total_bytes(self) -> int:
        return sum(item.size for item in self.objects)

    def path(self, key: str) -> Path:
        return self.root / self.spec.bucket / key

    def partition_bytes(self, partition: int) -> int:
        return sum(item.size for item in self.objects if item.partition == partition)


def _load_complete(directory: Path, spec: DatasetSpec) -> Dataset | None:
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if manifest.get("version") != MANIFEST_VERSION or manifest.get("spec") != asdict(spec):
        return None
    if not manifest.get("complete"):
        return None
    objects = tuple(StoredObject(**item) for item in manifest["objects"])
    dataset = Dataset(directory, spec, manifest["topic_id"], objects)
    for item in objects:
        try:
            if dataset.path(item.key).stat().st_size != item.size:
                return None
        except OSError:
            return None
    return dataset


def ensure_dataset(spec: DatasetSpec, base: Path) -> tuple[Dataset, bool]:
    """The data set of `spec` under `base/spec.name`, built if not already complete.

    Returns the data set and whether it had to be built.
    """
    directory = base / spec.name
    existing = _load_complete(directory, spec)
    if existing is not None:
        return existing, False
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    objects: list[StoredObject] = []
    topic_id = ""
    for segment in generate_topic_segments(
        topic=spec.topic, partitions=spec.partitions,
        segments_per_partition=spec.segments_per_partition,
        segment_bytes=spec.segment_bytes, value_size=spec.value_size, seed=spec.seed,
    ):
        path = directory / spec.bucket / segment.key
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        partial.write_bytes(segment.data)
        partial.rename(path)
        topic_id = segment.key.split("/", 1)[0][len(spec.topic) + 1:]
        objects.append(StoredObject(
            key=segment.key, size=len(segment.data), partition=segment.partition,
            start_offset=segment.start_offset, end_offset=segment.end_offset,
        ))
    manifest = {
        "version": MANIFEST_VERSION, "spec": asdict(spec), "complete": True,
        "topic_id": topic_id, "objects": [asdict(item) for item in objects],
    }
    tmp = directory / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1))
    tmp.rename(directory / MANIFEST)
    return Dataset(directory, spec, topic_id, tuple(objects)), True


# --- ListObjectsV2 -----------------------------------------------------------------


def nginx_etag(mtime: float, size: int) -> str:
    """The ETag nginx's static module sends: `"<mtime hex>-<size hex>"`
    (ngx_http_set_etag), so a listing agrees with HEAD and GET."""
    return f'"{int(mtime):x}-{size:x}"'


def listing_prefixes(dataset: Dataset) -> list[str]:
    """Every prefix a replay client, the sidecar or the Spark warm-up job may
    list: the bucket, the topic, the topic directory and each partition
    directory (each also with `delimiter=/`)."""
    topic_dir = f"{dataset.spec.topic}-{dataset.topic_id}/"
    partitions = sorted({item.partition for item in dataset.objects})
    return [
        "", dataset.spec.topic, f"{dataset.spec.topic}-", topic_dir,
        *(f"{topic_dir}{partition}/" for partition in partitions),
    ]


def encoded_forms(prefix: str) -> list[str]:
    """How `prefix` can appear raw in a query string (`$arg_prefix` in nginx is
    not decoded): botocore percent-encodes everything but `-_.~`; other clients
    leave `/` alone. (nginx `map` matches strings case-insensitively, so `%2f`
    needs no entry of its own.)"""
    forms = [quote(prefix, safe="-_.~"), quote(prefix, safe="-_.~/")]
    return list(dict.fromkeys(forms))


def list_objects_v2_xml(dataset: Dataset, prefix: str, delimiter: str | None = None,
                        start_after: str = "") -> str:
    """A ListObjectsV2 result (one page) for `prefix`, as S3 writes it.

    With a `delimiter`, keys with the delimiter after the prefix are rolled up
    into `CommonPrefixes` (what the Spark warm-up job asks to find a topic's
    directories), the others listed as `Contents`. With `start_after`, only
    the keys that sort after it (what the sidecar asks to find a partition's
    next segment).
    """
    rows = []
    common: set[str] = set()
    for item in sorted(dataset.objects, key=lambda entry: entry.key):
        if not item.key.startswith(prefix) or item.key <= start_after:
            continue
        rest = item.key[len(prefix):]
        if delimiter and delimiter in rest:
            common.add(prefix + rest[: rest.index(delimiter) + len(delimiter)])
            continue
        stat = dataset.path(item.key).stat()
        modified = datetime.fromtimestamp(int(stat.st_mtime), UTC)
        etag = escape(nginx_etag(stat.st_mtime, stat.st_size), {'"': "&quot;"})
        rows.append(
            "<Contents>"
            f"<Key>{escape(item.key)}</Key>"
            f"<LastModified>{modified.strftime('%Y-%m-%dT%H:%M:%S.000Z')}</LastModified>"
            f"<ETag>{etag}</ETag>"
            f"<Size>{stat.st_size}</Size>"
            "<StorageClass>STANDARD</StorageClass>"
            "</Contents>"
        )
    prefixes = "".join(
        f"<CommonPrefixes><Prefix>{escape(name)}</Prefix></CommonPrefixes>"
        for name in sorted(common)
    )
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<ListBucketResult xmlns="{S3_XMLNS}">'
        f"<Name>{escape(dataset.spec.bucket)}</Name>"
        f"<Prefix>{escape(prefix)}</Prefix>"
        + (f"<Delimiter>{escape(delimiter)}</Delimiter>" if delimiter else "")
        + (f"<StartAfter>{escape(start_after)}</StartAfter>" if start_after else "")
        + f"<KeyCount>{len(rows) + len(common)}</KeyCount>"
        "<MaxKeys>1000</MaxKeys>"
        "<IsTruncated>false</IsTruncated>"
        f"{''.join(rows)}{prefixes}"
        "</ListBucketResult>\n"
    )


def list_buckets_xml(bucket: str) -> str:
    """A minimal ListAllMyBucketsResult: the sidecar's start-up check calls ListBuckets."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<ListAllMyBucketsResult xmlns="{S3_XMLNS}">'
        "<Owner><ID>bench</ID><DisplayName>bench</DisplayName></Owner>"
        f"<Buckets><Bucket><Name>{escape(bucket)}</Name>"
        "<CreationDate>2026-01-01T00:00:00.000Z</CreationDate></Bucket></Buckets>"
        "</ListAllMyBucketsResult>\n"
    )


def delimited_listing_name(name: str) -> str:
    """The file of the `delimiter=/` listing of the prefix whose plain listing is `name`."""
    return name.removesuffix(".xml") + "-slash.xml"


# Joins the raw `prefix` and `start-after` of a listing written for both.
AFTER_SEPARATOR = "|"


def write_listings(dataset: Dataset, directory: Path) -> dict[str, str]:
    """Write one XML file per listable prefix into `directory`.

    Returns {raw query value of `prefix` as a client may send it: file name}.
    Beside each `list-N.xml` goes `list-N-slash.xml`, the same prefix listed
    with `delimiter=/` (`delimited_listing_name`). A partition's prefix is also
    listed after each of its keys (`list-N-after-M.xml`), under
    "PREFIX|START_AFTER" (both raw; `AFTER_SEPARATOR`, which both encode).
    """
    directory.mkdir(parents=True, exist_ok=True)
    by_raw: dict[str, str] = {}
    partitions = {f"{dataset.spec.topic}-{dataset.topic_id}/{item.partition}/"
                  for item in dataset.objects}
    for index, prefix in enumerate(listing_prefixes(dataset)):
        name = f"list-{index}.xml"
        (directory / name).write_text(list_objects_v2_xml(dataset, prefix))
        (directory / delimited_listing_name(name)).write_text(
            list_objects_v2_xml(dataset, prefix, "/"))
        for raw in encoded_forms(prefix):
            by_raw.setdefault(raw, name)
        if prefix not in partitions:
            continue
        keys = sorted(item.key for item in dataset.objects if item.key.startswith(prefix))
        for number, after in enumerate(keys):
            after_name = f"list-{index}-after-{number}.xml"
            (directory / after_name).write_text(
                list_objects_v2_xml(dataset, prefix, start_after=after))
            for raw in encoded_forms(prefix):
                for raw_after in encoded_forms(after):
                    by_raw.setdefault(f"{raw}{AFTER_SEPARATOR}{raw_after}", after_name)
    (directory / "buckets.xml").write_text(list_buckets_xml(dataset.spec.bucket))
    return by_raw


def write_range_targets(dataset: Dataset, path: Path, range_bytes: int,
                        path_of: Callable[[str, str], str] | None = None) -> int:
    """The objects for the wrk range script, one `"/bucket/key" size` line each
    (`path_of(bucket, key)` for another path, e.g. a presigned one).

    Returns the number of whole aligned ranges across all objects.
    """
    bucket = dataset.spec.bucket
    lines = [f"{path_of(bucket, item.key) if path_of else f'/{bucket}/{item.key}'} {item.size}"
             for item in dataset.objects]
    path.write_text("\n".join(lines) + "\n")
    return sum(item.size // range_bytes for item in dataset.objects)


def fs_free_bytes(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize
