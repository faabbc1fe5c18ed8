"""docker/ stays consistent with the CLI: every option compose passes to `iox serve` is accepted."""
from __future__ import annotations

import os
import re

from iox_spark.server.cli.main import build_parser

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


def _package_dirs() -> dict[str, str]:
    """setup.py's `_PACKAGE_DIRS`: {installed package: its folder in the repository}."""
    import ast

    tree = ast.parse(open(os.path.join(ROOT, "setup.py"), encoding="utf-8").read())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id == "_PACKAGE_DIRS" for t in targets):
                return ast.literal_eval(node.value)
    raise AssertionError("setup.py declares no _PACKAGE_DIRS")


def test_one_root_package_lands_in_site_packages():
    """Nothing generic at the top of site-packages: `iox_spark`, and `pyspark_iox` that Spark's
    registration of data sources needs at the top."""
    dirs = _package_dirs()
    assert {name.split(".")[0] for name in dirs} == {"iox_spark", "pyspark_iox"}
    assert {"iox_spark.server", "iox_spark.catalog", "iox_spark.chunk_store", "iox_spark.lifecycle"} <= set(dirs)


def test_dockerfile_installs_every_package():
    text = open(os.path.join(ROOT, "docker", "Dockerfile")).read()
    folders = sorted(set(_package_dirs().values()) | {"proto"})
    assert {"server", "catalog", "chunk_store", "lifecycle", "iox_spark", "proto"} <= set(folders)
    for folder in folders:
        assert f"COPY {folder} ./{folder}" in text


def test_every_serve_option_has_an_env_variable(monkeypatch):
    monkeypatch.setenv("IOX_GRPC_PORT", "9999")
    monkeypatch.setenv("IOX_KAFKA_BOOTSTRAP", "k:1")
    ns = build_parser().parse_args(["serve"])
    assert ns.grpc_port == 9999 and ns.kafka_bootstrap == "k:1"
