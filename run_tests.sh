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
# With -n auto the workers already fill the cores, and each notebook or training worker they start is another
# process; torch's and OpenMP's own thread pools (one thread per core each) on top of them oversubscribe the
# cores, and their idle threads spin. One thread per process, unless the caller chose: a fresh clone's suite on
# this 2-core machine took 5.1 min wall / 8.9 min CPU with it, 6.1-7.0 / 11.0-12.1 without (2026-11-26).
if [ ${#workers[@]} -gt 0 ]; then
    export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" MKL_NUM_THREADS="${MKL_NUM_THREADS:-1}"
fi
exec "$NEUSIGHT_PY" -m pytest "${workers[@]}" "$@"
