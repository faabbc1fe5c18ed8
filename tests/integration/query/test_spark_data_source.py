"""The `iox` Spark data source reads from a plain PySpark session exactly the rows `iox sql` answers.

Real parts: the session server (real broker, real Spark) writes, deletes and persists; the data
source then reads its object store (a local directory; and the same objects copied to a real
moto S3 endpoint) through the session's Spark, registered like a user registers it.
"""
from __future__ import annotations

import uuid

import boto3
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from iox_spark.catalog.object_store import S3Config, S3ObjectStore, encode_key_segment, object_store_from_url
from iox_spark.catalog.preserved_catalog import read_state
from iox_spark.source import IoxDataSource
from iox_spark.source.plan import load_snapshot, plan_read
from tests.integration.s3_fixture import (  # noqa: F401
    MOTO_ACCESS_KEY_ID,
    MOTO_REGION,
    MOTO_SECRET_ACCESS_KEY,
    moto_s3,
)
from tests.timestamps import T0
from tests.rows import write_applied

#: every column, as `iox sql` answers them
Q = "SELECT * FROM cpu"


def _normal(t: pa.Table) -> list:
    """Rows of an answer, sorted, with `time` as integer microseconds (the answers differ only in
    the time zone their timestamps are labelled with)."""
    i = t.schema.get_field_index("time")
    t = t.set_column(i, "time", pc.cast(t.column("time"), pa.timestamp("us")).cast(pa.int64()))
    return sorted(t.to_pylist(), key=lambda r: (r["host"], r["time_ns"]))


def _types(t: pa.Table) -> list:
    return [(f.name, str(f.type).replace(", tz=UTC", "").replace(", tz=Etc/UTC", "")) for f in t.schema]


@pytest.fixture(scope="module")
def spark(iox_server):
    spark = iox_server.spark
    spark.dataSource.register(IoxDataSource)
    return spark


@pytest.fixture(scope="module")
def persisted(iox_server, spark):
    """A database written, deleted from, written again at the deleted times and persisted twice:
    (database, object store url, the answer after the first persist and that revision)."""
    from iox_spark.server.api.client import IoxClient

    c = IoxClient(f"127.0.0.1:{iox_server.grpc_port}")
    c.wait_ready(60)
    db = f"sds_{uuid.uuid4().hex[:10]}"
    write_applied(c, db, [f'cpu,host=h{i % 2} v={i}.5,n={i}i,u={i}u,s="s{i}",b={"true" if i % 3 else "false"} {T0 + i}'
                   for i in range(10)])
    c.persist(db)
    url = iox_server.config.object_store_url
    first_revision = read_state(object_store_from_url(url), db).revision
    first = c.query(db, Q)
    # delete h0's rows in [T0+2, T0+7), then write h0 again at two of those times (after the delete:
    # they stay) and change one field of an h1 point persisted before (a merge across files)
    c.wait_applied(db, c.delete(db, T0 + 2, T0 + 7, "host = 'h0'", "cpu"), timeout_s=90)
    write_applied(c, db, [f"cpu,host=h0 v=100.25,n=100i {T0 + 4}", f"cpu,host=h0 v=200.25 {T0 + 6}",
                   f"cpu,host=h1 v=300.5 {T0 + 3}"])
    c.persist(db)
    yield db, url, first, first_revision, c
    c.close()


def _read(spark, **options):
    r = spark.read.format("iox")
    for k, v in options.items():
        r = r.option(k, v)
    return r.load().toArrow()


def test_reads_what_iox_sql_answers_with_deletes_and_rewrites_applied(spark, persisted):
    db, url, _first, _rev, c = persisted
    expect = c.query(db, Q)
    got = _read(spark, object_store=url, database=db, table="cpu")
    assert got.column_names == expect.column_names
    assert _types(got) == _types(expect)
    rows = _normal(got)
    assert rows == _normal(expect)
    # the outcome itself: h0's deleted points are gone except the two written after the delete
    h0 = {r["time_ns"] - T0: (r["v"], r["n"]) for r in rows if r["host"] == "h0"}
    assert h0 == {0: (0.5, 0), 4: (100.25, 100), 6: (200.25, None), 8: (8.5, 8)}
    h1_3 = [r for r in rows if r["host"] == "h1" and r["time_ns"] == T0 + 3]
    assert [(r["v"], r["n"], r["u"], r["s"], r["b"]) for r in h1_3] == [(300.5, 3, 3, "s3", False)]
    assert len(rows) == 9
    # what made it so: the newest revision's two overlapping files read as one merged group, one delete
    plan = plan_read(load_snapshot(object_store_from_url(url), db, None), "cpu", now_s=0.0)
    assert [len(g) for g in plan.groups] == [2] and len(plan.deletes) == 1


def test_an_older_revision_reads_that_snapshot(spark, persisted):
    db, url, first, first_revision, _c = persisted
    got = _read(spark, object_store=url, database=db, table="cpu", revision=str(first_revision))
    assert _normal(got) == _normal(first)
    assert len(first) == 10


def test_the_same_objects_read_from_s3(spark, persisted, moto_s3):  # noqa: F811
    db, url, _first, _rev, c = persisted
    bucket = f"sds-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_s3, aws_access_key_id=MOTO_ACCESS_KEY_ID,
                 aws_secret_access_key=MOTO_SECRET_ACCESS_KEY, region_name=MOTO_REGION).create_bucket(Bucket=bucket)
    s3 = S3ObjectStore(S3Config(bucket=bucket, prefix="tenant/objects", endpoint_url=moto_s3, region=MOTO_REGION,
                                access_key_id=MOTO_ACCESS_KEY_ID, secret_access_key=MOTO_SECRET_ACCESS_KEY))
    local = object_store_from_url(url)
    copied = 0
    for meta in local.list(f"{encode_key_segment(db)}/"):
        s3.put(meta.key, local.get(meta.key))
        copied += 1
    assert copied >= 4  # transactions and Parquet files
    opts = dict(object_store=f"s3://{bucket}/tenant/objects", database=db, table="cpu", s3_endpoint=moto_s3,
                s3_region=MOTO_REGION, s3_access_key_id=MOTO_ACCESS_KEY_ID, s3_secret_access_key=MOTO_SECRET_ACCESS_KEY)
    assert _normal(_read(spark, **opts)) == _normal(c.query(db, Q))
    # a file of the snapshot gone from S3 (as cleanup deletes files of old revisions): the job fails saying so
    r = spark.read.format("iox")
    for k, v in opts.items():
        r = r.option(k, v)
    df = r.load()
    s3.delete(next(m.key for m in s3.list(f"{encode_key_segment(db)}/data/")))
    from pyspark.errors import PySparkException

    with pytest.raises(PySparkException, match="is no longer in the object store"):
        df.toArrow()


def test_spark_finds_the_source_by_itself_in_a_session_that_did_not_register_it(iox_server, persisted):
    """Spark registers the `DefaultSource` of every installed `pyspark_*` module (pyspark_iox/) in
    each session; a new session of the server's Spark has none of the module fixture's registrations."""
    db, url, _first, _rev, c = persisted
    fresh = iox_server.spark.newSession()
    assert _normal(_read(fresh, object_store=url, database=db, table="cpu")) == _normal(c.query(db, Q))


def test_bad_reads_fail_with_the_cause(spark, persisted):
    db, url, _first, _rev, _c = persisted
    from pyspark.errors import PySparkException

    cases = [({"assigner": "127.0.0.1:9000"}, "the assigner serves no reads"),
             ({"table": "nope"}, "persisted tables: 'cpu'"),
             ({"revision": "999999"}, "has no catalog revision 999999"),
             ({"colour": "red"}, "unknown option")]
    for extra, message in cases:
        opts = {"object_store": url, "database": db, "table": "cpu", **extra}
        with pytest.raises(PySparkException, match=message):
            _read(spark, **opts)
