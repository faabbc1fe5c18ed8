#!/usr/bin/env bash
# README command 2: set everything up, then run the whole test suite.
# pytest's exit code 5 (nothing collected) is a failure here, not a pass.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
# no arguments: pyproject.toml's testpaths (tests/), in IOX_TEST_WORKERS processes (default 2),
# each test file in one of them (its module fixtures, a Spark cluster or a broker, start once),
# files handed out in the order tests/conftest.py collects them (the longest first);
# arguments given: passed to pytest as they are (one process unless they say -n)
if [ "$#" -eq 0 ]; then
  set -- -n "${IOX_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder
fi
.venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests: failing loudly" >&2
  exit 1
fi
exit "$rc"
