"""Integration tests: real processes (the broker, Spark, servers, moto_server), grouped by feature
folder like the code (api, write, write_buffer, consume, query, lifecycle, admin, pool, runtime); the
fixtures and helpers they share live here. A part that cannot be reached fails the test loudly."""
