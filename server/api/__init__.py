"""The surfaces users reach: gRPC services, the InfluxDB-compatible HTTP API, the client.

`grpc_services.py` (write, query, delete, management, health, reflection), `flight.py` (Arrow
Flight DoGet with InfluxDB 3's ticket, on the gRPC port), `flight_sql.py` (Flight SQL's commands
on the same service), `influxql_answer.py` (InfluxQL answers in 1.x's and InfluxDB 3's shapes), `one_port.py` (HTTP and gRPC on one
port, as InfluxDB 3 serves them),
`http_api.py` (InfluxDB v2 and 1.x writes, /health, /ping, /metrics), `http_query.py` (SQL over HTTP) and
`client.py` (the Python client the CLI, the demo, tests and the benchmark use); `api_parts.py`
(the parts of the server the handlers reach).

May import: every layer below it (`catalog`, `chunk_store`, `lifecycle`, `server.errors`,
`server.metrics`, `server.write_buffer`, `server.runtime`, `server.config`,
`server.consume`, `server.write`, `server.query`); never `server.app` or `server.cli`.
"""
