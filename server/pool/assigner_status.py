"""The assigner's status endpoint: the pool as the assigner saw it, over HTTP.

Invariant: it answers from what the assigner's rounds recorded (`Assigner.status`, its counters);
it never asks the members itself, so a scrape costs the pool nothing. With a token (the
assigner's `--token`, an admin token of the members), every route but `/health` answers 401
unless the request carries it (`Authorization: Token T` or `Bearer T`): the status names every
database and member.

Routes: `GET /status` (JSON, `Assigner.status`), `GET /metrics` (Prometheus text:
`iox_assigner_rounds_total`, `iox_assigner_active`, `iox_assigner_members`,
`iox_assigner_members_reachable`, `iox_assigner_partitions`, `iox_assigner_moves_total{why}`),
`GET /health` (200 once serving).

When it runs: `iox assigner --status-addr HOST:PORT` starts it (a daemon thread) before the first
round and stops it when the assigner stops. Imports prometheus-client and the API's token parsing.
"""
from __future__ import annotations

import hmac
import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from iox_spark.server.api.auth import token_from_authorization

__all__ = ["AssignerStatusServer"]

log = logging.getLogger(__name__)


class _Collector:
    """The assigner's figures, read at each scrape."""

    def __init__(self, assigner):
        self.assigner = assigner

    def collect(self):
        a = self.assigner
        st = a.status()
        rounds = CounterMetricFamily("iox_assigner_rounds", "rounds this assigner ran (active or standing by)")
        rounds.add_metric([], a.rounds)
        yield rounds
        active = GaugeMetricFamily("iox_assigner_active", "1 while this assigner decides (holds the lease or "
                                                          "runs alone), 0 while it stands by")
        active.add_metric([], 0 if st["role"] == "standby" else 1)
        yield active
        members = GaugeMetricFamily("iox_assigner_members", "ingesters configured (--ingesters)")
        members.add_metric([], len(st["members"]))
        yield members
        reachable = GaugeMetricFamily("iox_assigner_members_reachable", "ingesters that answered the last round")
        reachable.add_metric([], sum(1 for m in st["members"] if m["reachable"]))
        yield reachable
        parts = GaugeMetricFamily("iox_assigner_partitions", "(database, Kafka partition) units assigned")
        parts.add_metric([], len(st["assignments"]))
        yield parts
        moves = CounterMetricFamily("iox_assigner_moves", "partitions moved since start, by cause", labels=["why"])
        totals = dict(a.moves_total)
        for why in ("handoff", "rebalance"):
            moves.add_metric([why], totals.get(why, 0))
        yield moves


class AssignerStatusServer:
    """Serves `assigner`'s status on (`host`, `port`) (0: a free port, then `port` says which)."""

    def __init__(self, assigner, host: str, port: int, token: str | None = None):
        self.assigner = assigner
        self._token = token
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(assigner))
        server = self

        class _Handler(BaseHTTPRequestHandler):
            def log_message(self, fmt, *args):  # requests are not worth a log line each
                log.debug("assigner status: " + fmt, *args)

            def do_GET(self):  # noqa: N802 - http.server's name
                path = self.path.split("?", 1)[0]
                if path == "/health":
                    return self._send(200, "text/plain; charset=utf-8", b"ok\n")
                if not server._authorized(self.headers.get("Authorization")):
                    return self._send(401, "application/json", json.dumps(
                        {"code": "unauthorized", "message": "this assigner's status needs its token "
                                                            "(Authorization: Token T)"}).encode(),
                                      [("WWW-Authenticate", 'Token realm="iox-assigner"')])
                if path == "/status":
                    return self._send(200, "application/json", json.dumps(server.assigner.status(), indent=2).encode())
                if path == "/metrics":
                    return self._send(200, CONTENT_TYPE_LATEST, generate_latest(registry))
                return self._send(404, "application/json", json.dumps(
                    {"code": "not found", "message": f"no route {path!r}: /status, /metrics, /health"}).encode())

            def _send(self, code: int, ctype: str, body: bytes, headers=()):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in headers:
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

        self._httpd = ThreadingHTTPServer((host, port), _Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="assigner-status", daemon=True)

    def _authorized(self, header: str | None) -> bool:
        if self._token is None:
            return True
        presented = token_from_authorization(header)
        return presented is not None and hmac.compare_digest(presented.encode(), self._token.encode())

    def start(self) -> "AssignerStatusServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
