#!/usr/bin/env bash
# The test command: sets up .venv and the release (scripts/bootstrap.sh), then runs pytest.
# Extra arguments go to pytest, e.g. ./run_tests.sh -k release -x, or ./run_tests.sh tests/test_runner.py
# (pytest.ini's testpaths names tests/ when no path is given)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")" && pwd)"
source "$ROOT/scripts/bootstrap.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/python" -m pytest "$@"
