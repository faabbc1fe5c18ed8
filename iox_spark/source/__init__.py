"""A Spark data source reading a database's persisted rows straight from the object store.

Users of their own Spark (no server needed) register :class:`IoxDataSource` and read a
table as the server's queries present it (`data_source.py`): the options it takes
(`options.py`), the catalog snapshot it plans from (`plan.py`), the rows an executor
reads of a group of Parquet files (`rows.py`), and its errors (`errors.py`).

May import: `catalog`, `chunk_store`, `lifecycle`, pyarrow, pyspark and the other third-party
libraries; never `server`.
"""
from iox_spark.source.data_source import IoxDataSource

__all__ = ["IoxDataSource"]
