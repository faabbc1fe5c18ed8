"""`IoxDataSource` pins one catalog revision when the read is loaded and carries it pickled."""
from __future__ import annotations

import pickle

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql.datasource import InputPartition
from pyspark.sql.types import StringType, StructField, StructType

from iox_spark.catalog.object_store import LocalObjectStore, parquet_key
from iox_spark.catalog.preserved_catalog import AddParquet, PreservedCatalog, SetTableSchema
from iox_spark.source import IoxDataSource
from iox_spark.source.errors import SchemaMismatch

COLUMNS = (("host", "tag", "string"), ("v", "field", "float"), ("time", "time", "time"))


def _commit_file(store, cat, name, time_ns, v):
    key = parquet_key("db", "cpu", "1970-01-01", name)
    fs, path = store.arrow_prepare_write(key)
    pq.write_table(pa.table({"host": ["a"], "v": [v], "time_ns": pa.array([time_ns], pa.int64()),
                             "_iox_seq": pa.array([time_ns], pa.int64())}), path, filesystem=fs)
    cat.commit([SetTableSchema(table="cpu", columns=COLUMNS),
                AddParquet(key=key, table="cpu", partition_key="1970-01-01", row_count=1, size_bytes=1,
                           min_time_ns=time_ns, max_time_ns=time_ns, min_seq=time_ns, max_seq=time_ns,
                           schema=COLUMNS[:2])], 1.0)


def _rows(source) -> list:
    reader = source.reader(source.schema())
    parts = pickle.loads(pickle.dumps(reader.partitions()))
    reader = pickle.loads(pickle.dumps(reader))  # as the executors get it
    return sorted(r["time_ns"] for p in parts for b in reader.read(p) for r in b.to_pylist())


def test_the_revision_of_load_is_what_every_partition_reads(tmp_path):
    store = LocalObjectStore(tmp_path)
    cat, _ = PreservedCatalog.create_or_load(store, "db", 1.0)
    _commit_file(store, cat, "f1", 1_000, 1.0)
    source = IoxDataSource({"object_store": str(tmp_path), "database": "db", "table": "cpu"})
    assert source.schema().fieldNames() == ["host", "v", "time", "time_ns"]
    loaded = pickle.loads(pickle.dumps(source))  # Spark ships the instance schema() was asked of
    _commit_file(store, cat, "f2", 5_000, 2.0)  # committed after load()
    assert _rows(loaded) == [1_000]
    fresh = IoxDataSource({"object_store": str(tmp_path), "database": "db", "table": "cpu"})
    assert _rows(fresh) == [1_000, 5_000]
    assert [[len(g) for g in p.groups] for p in fresh.reader(fresh.schema()).partitions()] == [[1, 1]]


def test_a_given_schema_must_be_the_tables_and_an_empty_partition_reads_nothing(tmp_path):
    store = LocalObjectStore(tmp_path)
    cat, _ = PreservedCatalog.create_or_load(store, "db", 1.0)
    cat.commit([SetTableSchema(table="cpu", columns=COLUMNS)], 1.0)
    source = IoxDataSource({"object_store": str(tmp_path), "database": "db", "table": "cpu"})
    with pytest.raises(SchemaMismatch, match="leave out .schema"):
        source.reader(StructType([StructField("host", StringType())]))
    reader = source.reader(source.schema())
    assert reader.partitions() == []  # Spark then reads one InputPartition(None)
    assert list(reader.read(InputPartition(None))) == []
