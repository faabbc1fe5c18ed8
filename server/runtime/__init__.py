"""The processes the server runs on: Spark, the embedded broker, and their tuning.

The SparkSession (`spark.py`), the Spark home its JVM runs from (`spark_home.py`),
its JVM's class-data-sharing archive (`jvm_archive.py`), the Python worker daemon
(`spark_worker_daemon.py`), the check that a cluster's executors run the server's code (`executor_check.py`), the
embedded Tansu broker and its supervisor (`broker.py`), the truncation of its durable
store below what is persisted (`broker_truncation.py`), CPU priorities of the
write path (`write_path_priority.py`), the garbage collector's settings
(`gc_pauses.py`), the check that the listening ports are free (`ports.py`) and the signals
`iox serve` answers (`stop_signals.py`).

May import: `catalog`, `chunk_store`, `lifecycle`, `server.errors`, `server.metrics`,
`server.write_buffer` (the streaming source Spark registers).
"""
