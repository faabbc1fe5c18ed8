"""Query results stream (server/query/engine.py `arrow_batches`): the batches of a Spark job reach the
caller in the result's order while the job still runs, the driver never collects a whole result first,
and a limit or a failing expression stops the query with the user's error."""
from __future__ import annotations

import pyarrow as pa
import pytest
from iox_spark.iox import query_pb2

from iox_spark.server.errors import InvalidArgument, QueryResultTooLarge, QueryTimedOut
from iox_spark.server.query.engine import arrow_batches
from tests.waiting import wait_for
from tests.timestamps import T0


@pytest.fixture(scope="module")
def spark(iox_server):
    return iox_server.spark.newSession()


@pytest.mark.parametrize("sql", [
    "SELECT id, id * 2 AS x FROM range(0, 100000, 1, 8)",
    # empty partitions in the middle: those after them wait until the end, still in order
    "SELECT id FROM range(0, 1000, 1, 8) WHERE id < 100 OR id > 900",
    # a sort: range partitions, each sorted
    "SELECT id % 997 AS k, id FROM range(0, 50000, 1, 6) ORDER BY k DESC, id",
    "SELECT id FROM range(0, 10, 1, 4) WHERE id < 0",
])
def test_the_batches_are_the_result_in_order(spark, sql):
    df = spark.sql(sql)
    schema, batches = arrow_batches(df)
    got = pa.Table.from_batches(list(batches), schema=schema)
    assert got.equals(df.toArrow())


def test_the_first_partition_arrives_while_the_job_still_runs(spark):
    """Partition 0 is done at once, partition 3 takes seconds: partition 0's batches are yielded before
    the job ends (Spark's sender buffers 64 KB, so the partition is larger than that)."""
    df = spark.sql("SELECT id, CASE WHEN id = 300000 THEN reflect('java.lang.Thread', 'sleep', 4000L) END AS s "
                   "FROM range(0, 400000, 1, 4)")
    sc = spark.sparkContext
    tracker = sc.statusTracker()
    sc.setJobGroup("iox-test-first-partition", "a query whose partition 3 sleeps")
    try:
        _schema, batches = arrow_batches(df)
        first = next(batches)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    assert first.column("id")[0].as_py() == 0
    (job,) = tracker.getJobIdsForGroup("iox-test-first-partition")
    status_at_first_batch = tracker.getJobInfo(job).status
    rest = list(batches)
    assert status_at_first_batch == "RUNNING", "the job had ended before the first batch was yielded"
    ids = pa.Table.from_batches([first] + rest).column("id")
    assert ids.to_pylist() == list(range(400_000))


def test_a_result_past_the_byte_limit_stops_with_resource_exhausted(spark):
    df = spark.sql("SELECT id, repeat('x', 100) AS s FROM range(0, 200000, 1, 4)")
    _schema, batches = arrow_batches(df, max_bytes=1 << 20)
    got = 0
    with pytest.raises(QueryResultTooLarge, match="--max-query-bytes"):
        for b in batches:
            got += b.nbytes
    assert got <= 1 << 20


def test_batches_waiting_behind_an_earlier_partition_count_toward_the_byte_limit(spark):
    """Partition 0 (10 small rows) sleeps 5 s; the others (about 1 MiB each) arrive first and wait
    for it: with a limit of 1 MiB the query stops before its first batch (partition 0's, far under
    the limit) is yielded; counted only when yielded, it would stop at the second one."""
    df = spark.sql("SELECT id, repeat('x', 100) AS s, CASE WHEN id = 0 THEN reflect('java.lang.Thread', 'sleep', "
                   "5000L) END AS z FROM range(0, 80000, 1, 8) WHERE id < 10 OR id >= 10000")
    _schema, batches = arrow_batches(df, max_bytes=1 << 20)
    with pytest.raises(QueryResultTooLarge, match="--max-query-bytes"):
        next(batches)


def test_closing_the_stream_early_stops_the_job(spark):
    # partition 0 (100,000 rows, past the sender's 64 KB buffer) at once; each later one sleeps 3 s first
    df = spark.sql("SELECT id, CASE WHEN id > 0 AND id % 100000 = 0 THEN reflect('java.lang.Thread', 'sleep', 3000L) "
                   "END AS s FROM range(0, 800000, 1, 8)")
    sc = spark.sparkContext
    tracker = sc.statusTracker()
    sc.setJobGroup("iox-test-closed-early", "a query closed after its first batch")
    try:
        _schema, batches = arrow_batches(df)
        assert next(batches).column("id")[0].as_py() == 0
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    (job,) = tracker.getJobIdsForGroup("iox-test-closed-early")
    batches.close()
    # cancelled: its tasks still sleeping free their slots instead of running on for seconds
    wait_for(lambda: tracker.getJobInfo(job).status == "FAILED", 30, "the closed query's job to be cancelled")
    assert spark.sql("SELECT 1 AS one").toArrow().to_pylist() == [{"one": 1}]


def test_a_query_past_its_timeout_is_cancelled_and_answered_deadline_exceeded(spark, iox_server, client, db):
    """--query-timeout-s: the job of a query still running then is cancelled (its tasks free their
    slots) and the answer is QueryTimedOut, DEADLINE_EXCEEDED over gRPC."""
    import grpc

    sleepy = ("SELECT id, CASE WHEN id % 1000 = 0 THEN reflect('java.lang.Thread', 'sleep', 3000L) END AS s "
              "FROM range(0, 8000, 1, 8)")  # every partition sleeps 3 s at each of its 1,000th rows
    sc = spark.sparkContext
    tracker = sc.statusTracker()
    sc.setJobGroup("iox-test-timeout", "a query past its timeout")
    try:
        _schema, batches = arrow_batches(spark.sql(sleepy), timeout_s=1.0)
        with pytest.raises(QueryTimedOut, match="--query-timeout-s"):
            list(batches)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    (job,) = tracker.getJobIdsForGroup("iox-test-timeout")
    wait_for(lambda: tracker.getJobInfo(job).status == "FAILED", 30, "the timed-out query's job to be cancelled")

    lines = "".join(f"cpu,host=h{i % 7} v={i} {T0 + i}\n" for i in range(40_000))
    client.wait_applied(db, client.write(db, lines))
    engine = iox_server.query_engine
    before, engine.timeout_s = engine.timeout_s, 1.0
    try:
        with pytest.raises(grpc.RpcError) as e:  # 1.6 billion pairs: many seconds on any machine
            client.query(db, "SELECT a.host, sum(a.v * b.v) AS s FROM cpu a CROSS JOIN cpu b GROUP BY a.host")
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "--query-timeout-s" in e.value.details()
    finally:
        engine.timeout_s = before
    assert client.query(db, "SELECT count(*) AS n FROM cpu").to_pylist() == [{"n": 40_000}]


def test_grpc_query_streams_many_messages_with_every_row_once_in_order(iox_server, client, db):
    lines = "".join(f"cpu,host=h{i % 7} usage={i} {T0 + i}\n" for i in range(30_000))
    client.wait_applied(db, client.write(db, lines))
    req = query_pb2.QueryRequest(database=db, sql="SELECT usage FROM cpu ORDER BY usage DESC")
    responses = list(client.query_stub.Query(req, timeout=120))
    assert len(responses) > 1
    tables = [pa.ipc.open_stream(pa.py_buffer(r.arrow_ipc)).read_all() for r in responses]
    assert pa.concat_tables(tables).column("usage").to_pylist() == [float(i) for i in range(29_999, -1, -1)]


def test_a_failing_expression_mid_query_is_invalid_argument(iox_server, client, db):
    import grpc

    client.wait_applied(db, client.write(db, "".join(f"cpu,host=a usage={i} {T0 + i}\n" for i in range(100))))
    with pytest.raises(grpc.RpcError) as e:
        client.query(db, "SELECT assert_true(usage < 50) FROM cpu")
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    with pytest.raises(InvalidArgument):
        res = iox_server.query_engine.run(db, "SELECT assert_true(usage < 50) FROM cpu")
        res.table  # noqa: B018 - read: the job fails while the batches stream
    assert iox_server.catalog.query_pins.running() == 0
