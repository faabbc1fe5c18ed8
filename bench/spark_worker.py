"""The baselines' Spark application: a separate process, what a Spark user would run instead of iox.

Started by bench/harness.py `SparkWorker` as `python -m bench.spark_worker SCRATCH DRIVER_MEMORY`.
Protocol: one JSON command per stdin line, one answer per line on stdout prefixed
with `@@BENCH ` (Spark may print other lines; they are ignored).

On start it builds a SparkSession like the server does (local[*], same
interpreter, the same `iox_kafka` Python source registered) and reports
Spark's own start time (session + first trivial job).

Commands:
- filesink: a plain Structured Streaming job: `iox_kafka` source -> decode the
  Arrow payloads (mapInArrow) -> `writeStream.format("parquet")` partitioned by
  table and day, until the given end offsets are processed.
- sql: Spark SQL over plain Parquet files (repeat, report each latency).
- exit.
"""
from __future__ import annotations

import glob
import json
import os
import sys
import time
import traceback

MARK = "@@BENCH "
SINK_SCHEMA = ("tbl string, host string, region string, usage_user double, usage_system double, "
               "requests long, time long, day string")


def reply(obj) -> None:
    sys.stdout.write(MARK + json.dumps(obj) + "\n")
    sys.stdout.flush()


def _decode(batches):
    import pyarrow as pa
    import pyarrow.compute as pc

    from iox_spark.server.write_buffer.wire_format import decode_payload

    for b in batches:
        tbls = b.column("tbl").to_pylist()
        payloads = b.column("payload")
        for i, tbl in enumerate(tbls):
            t = decode_payload(payloads[i].as_py())
            n = t.num_rows
            days = pc.strftime(pc.cast(t.column("time"), pa.timestamp("ns")), format="%Y-%m-%d")
            yield pa.RecordBatch.from_arrays(
                [pa.array([tbl] * n, pa.string()), t.column("host").combine_chunks(),
                 t.column("region").combine_chunks(), t.column("usage_user").combine_chunks(),
                 t.column("usage_system").combine_chunks(), t.column("requests").combine_chunks(),
                 t.column("time").combine_chunks(), days.combine_chunks()],
                names=["tbl", "host", "region", "usage_user", "usage_system", "requests", "time", "day"])


def filesink(spark, bootstrap: str, topic_prefix: str, out: str, ckpt: str, end_offsets: dict,
             max_per_partition: int, trigger_ms: int, timeout_s: float) -> dict:
    """Runs the file-sink job until every partition reached end_offsets {topic: {"p": end_exclusive}}."""
    reader = (spark.readStream.format("iox_kafka").option("bootstrap", bootstrap)
              .option("topic_prefix", topic_prefix).option("max_messages_per_partition", str(max_per_partition)))
    df = reader.load().filter("kind = 'write'").select("tbl", "payload").mapInArrow(_decode, SINK_SCHEMA)
    t0 = time.monotonic()
    q = (df.writeStream.format("parquet").option("path", out).option("checkpointLocation", ckpt)
         .partitionBy("tbl", "day").trigger(processingTime=f"{trigger_ms} milliseconds").start())
    done_at = None
    try:
        while time.monotonic() - t0 < timeout_s:
            if q.exception() is not None:
                raise RuntimeError(str(q.exception()))
            lp = q.lastProgress
            if lp and lp.get("sources"):
                end = lp["sources"][0].get("endOffset")
                end = json.loads(end) if isinstance(end, str) else end
                if end and all(int(end.get(t, {}).get(p, 0)) >= int(e)
                               for t, parts in end_offsets.items() for p, e in parts.items()):
                    done_at = time.monotonic()
                    break
            time.sleep(0.05)
        progress = [p for p in q.recentProgress]
    finally:
        q.stop()
    batches = [p for p in progress if p.get("numInputRows", 0) > 0]
    files: dict = {}
    for f in glob.glob(os.path.join(out, "tbl=*", "day=*", "*.parquet")):
        part = os.path.relpath(os.path.dirname(f), out)
        files[part] = files.get(part, 0) + 1
    rows = spark.read.parquet(out).count() if files else 0
    return {"seconds": (done_at - t0) if done_at else None, "timed_out": done_at is None, "rows": rows,
            "files": files, "batches": len(batches), "messages": sum(p["numInputRows"] for p in batches)}


def sql(spark, path: str, view: str, query: str, repeat: int) -> dict:
    spark.read.parquet(path).createOrReplaceTempView(view)
    spark.sql(query).toArrow()  # warm-up
    times = []
    rows = 0
    for _ in range(repeat):
        t0 = time.monotonic()
        rows = spark.sql(query).toArrow().num_rows
        times.append(time.monotonic() - t0)
    return {"times": times, "rows": rows}


def main(argv) -> int:
    scratch, driver_memory = argv[1], argv[2]
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from iox_spark.server.runtime.spark import build_spark

    try:
        t0 = time.monotonic()
        spark = build_spark("local[*]", driver_memory, os.path.join(scratch, "spark"), 0)
        spark.range(1).count()
        start_s = time.monotonic() - t0
    except Exception:
        reply({"error": traceback.format_exc()})
        return 1
    reply({"ready": True, "start_seconds": start_s})
    for line in sys.stdin:
        try:
            cmd = json.loads(line)
            name = cmd.pop("cmd")
            if name == "exit":
                reply({"bye": True})
                break
            if name == "filesink":
                reply(filesink(spark, **cmd))
            elif name == "sql":
                reply(sql(spark, **cmd))
            else:
                reply({"error": f"unknown command {name}"})
        except Exception:
            reply({"error": traceback.format_exc()})
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
