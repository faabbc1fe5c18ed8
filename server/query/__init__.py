"""The query path: a user's Spark SQL over one database.

The engine (`engine.py`: views of the database's tables, Arrow results), the SQL
sandbox (`sql_sandbox.py`: only read-only queries over the database's tables run)
and the write buffer's tail (`tail.py`: acknowledged writes Spark has not applied
yet, visible at once), the read barrier (`read_barrier.py`: a query waits for a replay and for its write
token, or says why not), the check of answers against the write buffer (`verify.py`, `iox verify`)
query parameters bound as literals (`params.py`) and InfluxQL (`influxql_parse.py`: its syntax;
`influxql.py`: statements answered over the same query path).

May import: every layer below it: `catalog`, `chunk_store`, `lifecycle`, `server.errors`,
`server.metrics`, `server.write_buffer`, `server.runtime`, `server.config`,
`server.consume`, `server.write`.
"""
