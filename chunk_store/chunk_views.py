"""Where chunk views live: local temp views of the server's own Spark session.

Invariant: what a gRPC or HTTP query reads is named only in the server's session (the driver's
SparkSession the server built), never in `global_temp`: a Spark Connect session is a new session
of the same application, which neither sees nor changes the server's local temp views, so no
Spark Connect client can drop or replace what the query path reads. A query runs in a clone of
the server's session (`query_session`: it sees the chunk views), builds its table DataFrames,
then `hide_chunk_views` clears the clone's temp views before the user's SQL is analysed, so the
SQL sees only the tables the query path registers. Spark Connect reads the table views
`global_temp.<database>__<table>`, made from DataFrames (their analysed plans, not names).

Driver only. `spark` is the server's session unless said otherwise.
"""
from __future__ import annotations

__all__ = ["register", "drop", "query_session", "hide_chunk_views", "in_session"]


def in_session(spark, df):
    """`df` as a DataFrame of `spark` (the same plan; `df` itself when it is one already): a
    foreachBatch DataFrame belongs to the streaming query's session."""
    if df.sparkSession is spark:
        return df
    from pyspark.sql import DataFrame

    jdf = spark._jvm.org.apache.spark.sql.classic.Dataset.ofRows(spark._jsparkSession, df._jdf.logicalPlan())
    return DataFrame(jdf, spark)


def register(spark, name: str, df) -> str:
    """Registers `df` as the temp view `name` of `spark`'s session (replacing one of that name);
    returns `name`."""
    in_session(spark, df).createOrReplaceTempView(name)
    return name


def drop(spark, name: str) -> None:
    """Drops the temp view `name` of `spark`'s session (none of that name: nothing happens)."""
    spark.catalog.dropTempView(name)


def query_session(spark):
    """A clone of `spark`'s session for one query or one read: it sees the chunk views; its own
    temp views and settings stay its own."""
    from pyspark.sql import SparkSession

    return SparkSession(spark.sparkContext, spark._jsparkSession.cloneSession())


def hide_chunk_views(session) -> None:
    """Clears every temp view of `session` (a `query_session`): the user's SQL, analysed after,
    reaches only the views registered after this."""
    session._jsparkSession.sessionState().catalog().clearTempTables()
