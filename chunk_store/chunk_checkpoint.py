"""Materialising chunk data where it survives the loss of an executor.

Invariant: a DataFrame returned by `checkpoint` holds its rows (its lineage is
cut) and keeps them as long as the driver holds the DataFrame, whatever happens
to executors. In local mode (chunk_store/cluster.py) that is Spark's local
checkpoint: the blocks live in the one executor, which is the driver's own JVM,
so they die only with the driver (whose restart rebuilds every chunk from the
write buffer anyway). On a cluster an executor may be lost at any time (its
host fails, it is killed for memory, its worker restarts it), and a local
checkpoint's blocks would go with it: every later read of the chunk would fail
(`CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND`) until a restart. So on a cluster the rows
are collected to the driver as Arrow and handed back to Spark as a local
relation: tasks that read it get their rows from the driver, and a lost
executor loses nothing but the tasks it ran, which Spark runs again elsewhere.
The price: the driver holds the unpersisted data (what the buffer-size limits
bound) and ships it to the tasks that read it; persisted data is read from the
object store by the executors themselves.

Called on the driver (ingest, compaction, persist) with a DataFrame; runs its job.
"""
from __future__ import annotations

from iox_spark.chunk_store.cluster import runs_local

__all__ = ["checkpoint"]


def checkpoint(df):
    """`df` materialised (one Spark job): its local checkpoint in local mode, a driver-held local
    relation of its rows on a cluster (see the module docstring). Same columns, types and rows."""
    spark = df.sparkSession
    if runs_local(spark):
        return df.localCheckpoint(eager=True)
    table = df.toArrow()
    return spark.createDataFrame(table, schema=df.schema)
