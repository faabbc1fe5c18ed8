"""Spark batch data source `iox_parquet`: reads Parquet files of an object store through pyarrow.

Why: no hadoop-aws jar here, so Spark cannot read `s3a://`; this source reads
any `ObjectStore` (local or S3) on the executors. One input partition per file.
`read` runs on executors and must be stateless; the store travels pickled.

The files' columns come as the `schema` option (a Spark StructType as JSON), not as
a user-specified schema: a load with a user-specified schema stays unresolved
until a session reads it, and Python data sources are registered per session, so
a view of it would fail in any other session (the query engine runs each query in
a session of its own). With the option the load resolves where it is made.
"""
from __future__ import annotations

import base64
import json
import pickle

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

__all__ = ["IoxParquetDataSource"]


class _File(InputPartition):
    def __init__(self, key: str):
        self.key = key


class _Reader(DataSourceReader):
    def __init__(self, options: dict, schema):
        self.store_b64 = options["store"]
        self.keys = json.loads(options["keys"])
        self.columns = [f.name for f in schema.fields]
        self.nullable = [f.nullable for f in schema.fields]

    def partitions(self):
        return [_File(k) for k in self.keys]

    def read(self, partition: _File):
        import pyarrow.parquet as pq

        store = pickle.loads(base64.b64decode(self.store_b64))
        fs, _base = store.arrow_fs()
        pf = pq.ParquetFile(store.arrow_path(partition.key), filesystem=fs)
        import pyarrow as pa

        present = set(pf.schema_arrow.names)
        for batch in pf.iter_batches(batch_size=65_536, columns=[c for c in self.columns if c in present]):
            # in the declared order (Parquet returns file order); absent columns read as NULL
            arrays = [batch.column(c) if c in present else pa.nulls(batch.num_rows) for c in self.columns]
            fields = [pa.field(c, a.type, nullable=n) for c, a, n in zip(self.columns, arrays, self.nullable)]
            yield pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


class IoxParquetDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "iox_parquet"

    def schema(self):
        from pyspark.sql.types import StructType

        return StructType.fromJson(json.loads(self.options["schema"]))

    def reader(self, schema):
        return _Reader(self.options, schema)
