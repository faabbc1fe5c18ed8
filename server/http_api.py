"""InfluxDB v2 compatible HTTP write API (placeholder until implemented).

Invariant: same all-or-nothing semantics as the gRPC Write: it calls the same Router.
"""
from __future__ import annotations

__all__ = ["HttpWriteServer"]


class HttpWriteServer:
    def __init__(self, router, host: str, port: int):
        self.router = router
        self.host = host
        self.port = port

    def start(self) -> None:
        pass  # TEMPORARY: being implemented (issue 3)

    def stop(self) -> None:
        pass
