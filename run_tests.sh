#!/usr/bin/env bash
# The test command: sets up .venv and the release (scripts/bootstrap.sh), then runs pytest.
# Extra arguments go to pytest, e.g. ./run_tests.sh -k release -x, or ./run_tests.sh tests/test_runner.py
# (pytest.ini's testpaths names tests/ when no path is given)
# The tests run on every core (pytest-xdist's -n auto: on 2 cores the suite takes about 60 % of its serial time);
# give -n yourself to choose (-n 0: one process, in order).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")" && pwd)"
source "$ROOT/scripts/bootstrap.sh"
cd "$ROOT"
workers=(-n auto)
for a in "$@"; do
    case "$a" in -n|-n*|--numprocesses|--numprocesses=*) workers=() ;; esac
done
exec "$NEUSIGHT_PY" -m pytest "${workers[@]}" "$@"
