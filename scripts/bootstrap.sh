#!/usr/bin/env bash
# Sourced by run_all.sh and run_tests.sh. Makes .venv from the pinned requirements.txt when it is
# missing or stale, then provisions (unpacks and verifies) the authors' release. Sets NEUSIGHT_PY, the
# interpreter the caller runs.
# Honours: PYTHON (interpreter to build the venv with, default python3.11), NEUSIGHT_RELEASE
# (path to the release folder, archive or upstream clone), NEUSIGHT_PYTHON (use this interpreter as it is,
# no venv: a GPU machine whose Python already holds a CUDA build of torch, e.g. a container image).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
# The pinned venv (the default): built from requirements.txt when missing or stale, this checkout installed
# editable into it.
_neusight_venv() {
  PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"
  if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)'; then
    echo "error: Python 3.11 is required (found $("$PY" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2
    exit 2
  fi
  want="$(sha256sum "$ROOT/requirements.txt" | cut -d' ' -f1)"
  have="$(cat "$VENV/.requirements.sha256" 2>/dev/null || true)"
  if [ "$want" != "$have" ]; then
    echo "[setup] creating virtualenv .venv from requirements.txt (first run takes a few minutes)"
    [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
    # This machine's pip config lists local wheel folders that may not all exist; hide that noise only.
    # (grep exits 1 when pip printed nothing, which must not abort the script under set -e.)
    set +o pipefail
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$ROOT/requirements.txt" 2>&1 \
      | { grep -v "is ignored: it is neither a file nor a directory" || true; }
    rc=${PIPESTATUS[0]}
    set -o pipefail
    if [ "$rc" -ne 0 ]; then echo "error: pip install -r requirements.txt failed (exit $rc)" >&2; exit "$rc"; fi
    echo "$want" > "$VENV/.requirements.sha256"
  fi
  # This checkout installed editable into its venv (pyproject.toml: `pip install -e .`, no download: the
  # pins bring setuptools >= 77 through torch, which builds it), so that a notebook opened from notebooks/
  # in JupyterLab imports neusight_core and .venv/bin/neusight exists. Once per checkout (and again when
  # pyproject.toml changes). Only into a venv of this checkout: a .venv that is a symlink belongs to
  # another checkout. pytest (pytest.ini pythonpath) and run_all.sh put the running checkout first on
  # sys.path in any case.
  if [ ! -L "$VENV" ]; then
    want_e="$ROOT $(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
    if [ "$(cat "$VENV/.editable-install" 2>/dev/null || true)" != "$want_e" ] || [ ! -x "$VENV/bin/neusight" ]; then
      echo "[setup] installing this checkout into .venv (pip install -e .)"
      set +o pipefail
      "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-index --no-deps \
          --no-build-isolation -e "$ROOT" 2>&1 \
        | { grep -v "is ignored: it is neither a file nor a directory" || true; }
      rc=${PIPESTATUS[0]}
      set -o pipefail
      if [ "$rc" -ne 0 ]; then echo "error: pip install -e . failed (exit $rc)" >&2; exit "$rc"; fi
      # what earlier versions of this script wrote instead of the editable install
      rm -f "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/neusight-artifact.pth"
      echo "$want_e" > "$VENV/.editable-install"
    fi
  fi
}

if [ -n "${NEUSIGHT_PYTHON:-}" ]; then
  NEUSIGHT_PY="$(command -v "$NEUSIGHT_PYTHON" || true)"
  if [ -z "$NEUSIGHT_PY" ]; then echo "error: NEUSIGHT_PYTHON=$NEUSIGHT_PYTHON: no such interpreter" >&2; exit 2; fi
  # modules the notebooks and the runner import (module names, not package names); optional ones only warn
  missing="$("$NEUSIGHT_PY" - <<'PYEOF'
import importlib.util, sys
if sys.version_info[:2] < (3, 11):
    print(f"Python 3.11 or newer (this is {sys.version.split()[0]})"); sys.exit()
need = ["torch", "transformers", "numpy", "pandas", "yaml", "matplotlib", "sklearn", "threadpoolctl", "scipy",
        "tqdm", "tabulate", "papermill", "nbformat", "nbclient", "ipykernel", "jupyter_client"]
print(" ".join(n for n in need if importlib.util.find_spec(n) is None))
PYEOF
)"
  if [ -n "$missing" ]; then
    echo "error: NEUSIGHT_PYTHON=$NEUSIGHT_PYTHON lacks: $missing (install them there, or unset NEUSIGHT_PYTHON to use the pinned .venv)" >&2
    exit 2
  fi
  echo "[setup] using $NEUSIGHT_PY as it is (NEUSIGHT_PYTHON): $("$NEUSIGHT_PY" - <<'PYEOF'
import importlib.util, sys
import torch
opt = [n for n in ("aiconfigurator_core", "nbconvert", "pytest") if importlib.util.find_spec(n) is None]
cuda = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU build"
print(f"Python {sys.version.split()[0]}, torch {torch.__version__} ({cuda}); requirements.txt's pins are not applied"
      " (environment.json records every version)" + (f"; without {', '.join(opt)}" if opt else ""))
PYEOF
)"
  # the checkout is not installed into that Python: put it first on the path of every process it starts
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
else
  _neusight_venv
  NEUSIGHT_PY="$VENV/bin/python"
fi
echo "[setup] provisioning the authors' release"
(cd "$ROOT" && "$NEUSIGHT_PY" -m neusight_core.data.release ${NEUSIGHT_RELEASE:+--source "$NEUSIGHT_RELEASE"})
