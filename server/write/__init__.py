"""The write path: a request in, validated, encoded and produced to the write buffer.

Line protocol parsing (`line_protocol.py` with its C extension `_lpfast.c`),
the router (`router.py`: database checks, schema checks, one path for line
protocol and Arrow writes), InfluxDB 3's write_lp semantics (`lp_v3.py`: precision `auto`,
partial writes) and deletes (`deletes.py`).

May import: `catalog`, `chunk_store`, `lifecycle`, `server.errors`, `server.metrics`,
`server.write_buffer`, `server.runtime`, `server.config`, `server.consume`.
"""
