"""The surfaces users reach: gRPC, HTTP (v1, v2, v3), Flight, Flight SQL, InfluxQL, tokens and /metrics, through the clients users have.

Real processes, as every integration test (tests/integration/__init__.py)."""
