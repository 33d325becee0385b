#!/usr/bin/env bash
# Builds .device/, what benchmarks/gpu_session.sh reads on a lent GPU machine that has no network: the authors'
# release as given (../shared/neusight-upstream, or the folder in $UPSTREAM) and the training GPUs' measured-kernel
# files of the installed aiconfigurator-core, laid out as the package (with its METADATA, so that the package's
# version is read from there). About 22 MB. .device/ is ignored through .git/info/exclude (never committed: the
# release is not ours to commit) and travels to the device as a carried path:
#   bash benchmarks/device_carry.sh          # here, once
#   run(command="OUT=$OUT bash benchmarks/gpu_session.sh", carry=[".device"])
set -eu
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
UPSTREAM=${UPSTREAM:-../shared/neusight-upstream}
[ -d "$UPSTREAM" ] || { echo "no release at $UPSTREAM (set UPSTREAM)"; exit 1; }
grep -qx ".device/" .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo ".device/" >> .git/info/exclude; }
rm -rf .device
mkdir -p .device
cp -r "$UPSTREAM" .device/upstream
$PY - <<'EOF'
import importlib.metadata as md
import shutil
from pathlib import Path

from neusight_core.data import measured_kernels as mk

dist = md.distribution(mk.DISTRIBUTION)
dst = Path(".device/aic")
src = mk.data_root()
for f in dist.files or []:                          # the METADATA, so that the version is found on PYTHONPATH
    if f.name == "METADATA":
        t = dst / f.parent
        t.mkdir(parents=True, exist_ok=True)
        shutil.copy(dist.locate_file(f), t / "METADATA")
pkg = dst / mk.PACKAGE
pkg.mkdir(parents=True, exist_ok=True)
(pkg / "__init__.py").touch()
n = 0
for system in mk.TRAINING:                           # the training GPUs only: the held-out ones stay here
    for f in (src / system).rglob("*.parquet"):
        if f.name in (mk.GEMM_FILE, *mk.ATTENTION_FILES.values()):
            t = pkg / "systems" / "data" / f.relative_to(src)
            t.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(f, t)
            n += 1
print(f".device/aic: {n} files of {', '.join(mk.TRAINING)} ({mk.DISTRIBUTION} {dist.version})")
EOF
PYTHONPATH=$PWD:$PWD/.device/aic $PY -c 'from neusight_core.data import measured_kernels as m; print("reads", m.data_root(), m.package_version())'
du -sh .device
