"""Bucket names the sidecar takes: S3's rules, the legacy ones of us-east-1 included."""

from __future__ import annotations

import pytest

from sidecar.bucket_names import (
    MAX_CACHED_BUCKET_CHARS,
    bucket_name_problem,
    uncached_bucket_problem,
)
from sidecar.cache.slot_format import MAX_BUCKET_BYTES
from sidecar.config.parsing import parse_bucket_list, parse_s3_location
from sidecar.errors import ConfigError
from sidecar.s3.addressing import validate_object_address
from sidecar.s3.errors import S3Error

LEGACY = ["Kafka_Tiered", "KAFKA-LOGS", "tiered_storage.prod", "a_b", "x" * 255, "-ab", "ab-"]
TODAY = ["kafka-tiered", "abc", "my.bucket.example", "a" * 63, "123"]
NEVER = ["", "ab", "x" * 256, "a..b", "bad!bucket", "with space", "sl/ash", "é-bucket",
         "tab\tname", ".."]


@pytest.mark.parametrize("name", TODAY + LEGACY)
def test_names_of_existing_buckets_are_taken(name: str) -> None:
    assert bucket_name_problem(name) is None
    validate_object_address(name, "topic-0/00000000000000000000.log")
    assert parse_bucket_list(name) == (name,)
    location = parse_s3_location(f"s3://{name}/sidecar-access")
    assert location is not None and location.bucket == name


@pytest.mark.parametrize("name", NEVER)
def test_what_no_bucket_can_be_named_is_refused(name: str) -> None:
    assert bucket_name_problem(name) is not None
    with pytest.raises(S3Error) as raised:
        validate_object_address(name, "key")
    assert (raised.value.status, raised.value.code) == (400, "InvalidBucketName")


@pytest.mark.parametrize("name", ["bad!bucket", "a..b", "x" * 300])
def test_a_configured_name_no_bucket_can_have_is_named_in_the_error(name: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_bucket_list(f"kafka-tiered,{name}")
    assert str(raised.value).startswith(repr(name[:70]) + " is not an S3 bucket name (")
    assert len(str(raised.value)) < 200


def test_only_names_past_a_cache_slot_are_uncached() -> None:
    assert MAX_CACHED_BUCKET_CHARS == MAX_BUCKET_BYTES
    assert uncached_bucket_problem("K" * MAX_CACHED_BUCKET_CHARS) is None
    problem = uncached_bucket_problem("K" * 64)
    assert problem is not None and "64 characters" in problem and "at most 63" in problem
