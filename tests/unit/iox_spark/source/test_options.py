"""Options of the `iox` data source: every one checked, none ignored, the store they name."""
from __future__ import annotations

import pickle

import pytest

from iox_spark.catalog.object_store import LocalObjectStore, S3ObjectStore
from iox_spark.source.errors import AssignerNotAvailable, InvalidOption
from iox_spark.source.options import KNOWN_OPTIONS, ReadOptions, parse_options

BASE = {"object_store": "/data/objects", "database": "db", "table": "cpu"}


def test_the_required_options_make_a_read_of_the_newest_revision():
    o = parse_options(BASE)
    assert o == ReadOptions(object_store="/data/objects", database="db", table="cpu")
    assert o.revision is None
    assert parse_options({**BASE, "revision": " 12 "}).revision == 12


def test_names_are_case_insensitive():
    assert parse_options({"OBJECT_STORE": "/x", "Database": "db", "tAble": "cpu"}).object_store == "/x"


@pytest.mark.parametrize("missing", ["object_store", "database", "table"])
def test_a_missing_or_empty_required_option_names_itself(missing):
    with pytest.raises(InvalidOption, match=f"'{missing}': required") as e:
        parse_options({k: v for k, v in BASE.items() if k != missing})
    assert e.value.option == missing
    with pytest.raises(InvalidOption, match=missing):
        parse_options({**BASE, missing: "  "})


def test_an_unknown_option_is_refused_listing_the_known_ones():
    with pytest.raises(InvalidOption, match="unknown option; the options are object_store") as e:
        parse_options({**BASE, "path": "/elsewhere"})
    assert e.value.option == "path"
    assert "assigner" in KNOWN_OPTIONS


@pytest.mark.parametrize("bad", ["-1", "1.5", "x", "", "²"])
def test_a_revision_must_be_a_non_negative_integer(bad):
    with pytest.raises(InvalidOption, match="revision"):
        parse_options({**BASE, "revision": bad})


def test_the_assigner_option_is_refused_and_names_the_unpersisted_option():
    with pytest.raises(AssignerNotAvailable, match="the assigner serves no reads.*'unpersisted', 'true'") as e:
        parse_options({**BASE, "assigner": "host:9000"})
    assert e.value.assigner == "host:9000"


def test_unpersisted_is_a_boolean_of_now_with_an_optional_token():
    assert parse_options(BASE).unpersisted is False
    o = parse_options({**BASE, "unpersisted": "TRUE", "token": "s3cr3t"})
    assert o.unpersisted is True and o.token == "s3cr3t" and "s3cr3t" not in repr(o)
    with pytest.raises(InvalidOption, match="must be true or false"):
        parse_options({**BASE, "unpersisted": "yes"})
    with pytest.raises(InvalidOption, match="cannot go with a revision"):
        parse_options({**BASE, "unpersisted": "true", "revision": "3"})


def test_a_directory_store_takes_no_s3_option():
    assert parse_options(BASE).store() == LocalObjectStore("/data/objects")
    assert parse_options({**BASE, "object_store": "file:///data/objects"}).store() == LocalObjectStore("/data/objects")
    with pytest.raises(InvalidOption, match="s3_region.*is for an s3:// object store"):
        parse_options({**BASE, "s3_region": "eu-west-1"}).store()
    with pytest.raises(InvalidOption, match="unsupported scheme"):
        parse_options({**BASE, "object_store": "gs://bucket"}).store()


def test_s3_settings_come_from_the_options_else_the_drivers_environment(monkeypatch):
    for var in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "env-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "env-secret")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://env:9000")
    s3 = {**BASE, "object_store": "s3://bucket/pre/fix"}
    cfg = parse_options(s3).store().config
    assert (cfg.bucket, cfg.prefix, cfg.endpoint_url, cfg.region) == ("bucket", "pre/fix", "http://env:9000", "us-east-1")
    assert (cfg.access_key_id, cfg.secret_access_key) == ("env-key", "env-secret")
    store = parse_options({**s3, "s3_endpoint": "http://opt:9000", "s3_region": "eu-west-1",
                           "s3_access_key_id": "k", "s3_secret_access_key": "s"}).store()
    cfg = store.config
    assert (cfg.endpoint_url, cfg.region, cfg.access_key_id, cfg.secret_access_key) == \
        ("http://opt:9000", "eu-west-1", "k", "s")
    # executors get it pickled, settings included, and read with pyarrow's S3 file system
    again = pickle.loads(pickle.dumps(store))
    assert isinstance(again, S3ObjectStore) and again.config == cfg
    fs, base = again.arrow_fs()
    assert type(fs).__name__ == "S3FileSystem" and base == "bucket/pre/fix"
    assert fs.region == "eu-west-1"


def test_s3_credentials_come_in_pairs_and_the_secret_is_not_shown():
    s3 = {**BASE, "object_store": "s3://bucket"}
    with pytest.raises(InvalidOption, match="s3_secret_access_key"):
        parse_options({**s3, "s3_access_key_id": "k"})
    with pytest.raises(InvalidOption, match="s3_access_key_id"):
        parse_options({**s3, "s3_secret_access_key": "s"})
    assert "topsecret" not in repr(parse_options({**s3, "s3_access_key_id": "k", "s3_secret_access_key": "topsecret"}))
