"""`spark.read.format("iox")`: a database table's persisted rows, read from the object store.

Usage (any PySpark 4 session that has this project installed; no server needed)::

    from iox_spark.source import IoxDataSource
    spark.dataSource.register(IoxDataSource)  # unless Spark found pyspark_iox/ by itself
    df = (spark.read.format("iox")
          .option("object_store", "s3://bucket/prefix")   # or a directory, as the server's --object-store
          .option("database", "mydb").option("table", "cpu")
          .load())

Options: iox_spark/source/options.py. The rows are those of the preserved catalog's
snapshot: what the server persisted (its unpersisted rows, and deletes not recorded
by a persist yet, are not in it). In an ingester pool, ``.option("unpersisted", "true")``
adds the rows the table's owner holds and has not persisted, with its deletes
(iox_spark/source/owner_rows.py); the snapshot is then read at least at the revision
the owner's answer goes with.

Invariants: the snapshot is read once, on the driver, when the read is loaded
(``load()`` asks for the schema): the catalog revision it names, with its files,
deletes and schema, is pickled with the data source into every partition, so all
partitions and every action of the DataFrame read that one revision (load again to
see newer data). Each group of files whose times overlap (iox_spark/source/plan.py)
is read whole by one input partition on an executor (iox_spark/source/rows.py);
small groups are packed into one partition up to ``PARTITION_BYTES`` of Parquet.

Contracts: `IoxDataSource`, its reader and its partitions are picklable; the
reader's `read` runs on executors and holds no state between calls.
"""
from __future__ import annotations

import time

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from iox_spark.source.errors import SchemaMismatch
from iox_spark.source.options import ReadOptions, parse_options
from iox_spark.source.owner_rows import fetch_owner_rows
from iox_spark.source.plan import FileRef, ReadPlan, load_snapshot, pack_groups, plan_read
from iox_spark.source.rows import read_group, spark_schema

__all__ = ["IoxDataSource", "SOURCE_NAME"]

#: the format name users pass to `spark.read.format`
SOURCE_NAME = "iox"


class _FileGroups(InputPartition):
    """One input partition: groups of files, each group the files of one time overlap (picklable)."""

    def __init__(self, index: int, groups: tuple[tuple[FileRef, ...], ...]):
        super().__init__(index)
        self.groups = groups


class _Reader(DataSourceReader):
    """Plans the partitions (driver) and reads one (executor); picklable, stateless reads."""

    def __init__(self, options: ReadOptions, plan: ReadPlan):
        self._store = options.store()
        self._plan = plan

    def partitions(self) -> list:
        return [_FileGroups(i, run) for i, run in enumerate(pack_groups(self._plan.groups))]

    def read(self, partition):
        # a table without files: Spark asks for one partition anyway, an InputPartition(None)
        for group in getattr(partition, "groups", ()):
            yield from read_group(self._store, self._plan, group)


class IoxDataSource(DataSource):
    """The `iox` batch data source (see the module docstring). Register it in a session with
    ``spark.dataSource.register(IoxDataSource)``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def _snapshot(self) -> tuple[ReadOptions, ReadPlan]:
        """The options and the plan of the revision this read reads, loaded once (driver)."""
        plan = getattr(self, "_plan", None)
        if plan is None:
            opts = parse_options(self.options)
            store = opts.store()
            state = load_snapshot(store, opts.database, opts.revision)
            owner = None
            if opts.unpersisted:
                owner = fetch_owner_rows(store, state, opts.table, opts.token)
                if owner is not None and owner.catalog_revision > state.revision:
                    # what the owner persisted by its answer is in that revision: read at least it
                    state = load_snapshot(store, opts.database, None)
            self._opts = opts
            self._plan = plan = plan_read(state, opts.table, time.time(), owner)
        return self._opts, plan

    def schema(self):
        return spark_schema(self._snapshot()[1])

    def reader(self, schema) -> DataSourceReader:
        opts, plan = self._snapshot()
        expected = spark_schema(plan)
        if schema != expected:
            raise SchemaMismatch(plan.table, expected.simpleString(), schema.simpleString())
        return _Reader(opts, plan)
