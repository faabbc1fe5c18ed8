"""docker/ stays consistent with the CLI: every option compose passes to `iox serve` is accepted."""
from __future__ import annotations

import os
import re

from server.cli.main import build_parser

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _compose_serve_args() -> list[str]:
    text = open(os.path.join(ROOT, "docker", "compose.yml")).read()
    block = text.split("command:\n      - serve\n", 1)[1]
    args = []
    for line in block.splitlines():
        m = re.match(r"^      - (.+)$", line)
        if not m:
            break
        args.append(m.group(1))
    return args


def test_compose_passes_only_options_iox_serve_accepts():
    args = _compose_serve_args()
    assert len(args) >= 5, args
    ns = build_parser().parse_args(["serve", *args])  # argparse exits (SystemExit) on an unknown option
    assert ns.kafka_bootstrap == "kafka:9092"
    assert ns.partitions == 4
    assert ns.spark_connect_port == 15002
    assert ns.bind_host == "0.0.0.0"  # beyond loopback: with the token compose sets
    text = open(os.path.join(ROOT, "docker", "compose.yml")).read()
    assert "IOX_AUTH_TOKEN:" in text


def _installed_packages() -> list[str]:
    """The top-level packages pyproject.toml installs (`iox` is generated from proto/)."""
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        include = tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]["include"]
    return sorted({p.split(".")[0] for p in include} - {"iox"} | {"proto"})


def test_dockerfile_installs_every_package():
    text = open(os.path.join(ROOT, "docker", "Dockerfile")).read()
    pkgs = _installed_packages()
    assert {"server", "catalog", "chunk_store", "lifecycle", "proto"} <= set(pkgs)
    for pkg in pkgs:
        assert f"COPY {pkg} ./{pkg}" in text


def test_every_serve_option_has_an_env_variable(monkeypatch):
    monkeypatch.setenv("IOX_GRPC_PORT", "9999")
    monkeypatch.setenv("IOX_KAFKA_BOOTSTRAP", "k:1")
    ns = build_parser().parse_args(["serve"])
    assert ns.grpc_port == 9999 and ns.kafka_bootstrap == "k:1"
