"""benchmarks/gpu_session.sh as a dry run on the CPU: the device brings back 8 files at most, so the session packs
everything it writes into one archive (a call of 2026-11-27 lost two CSVs to that limit)."""
import os
import subprocess
import sys
import tarfile

import pytest

from neusight_core import paths
from neusight_core.studies import live_harness


def test_the_session_comes_back_as_one_archive(tmp_path):
    if live_harness.no_gpu_reason() is None:
        pytest.skip("this machine has a CUDA GPU: the session would train on it")
    out = tmp_path / "out"
    env = dict(os.environ, QUICK="1", MODERN_S="0", TRAIN_S="60", TOTAL="0", RECIPES="roofline", PY=sys.executable,
               OUT=str(out))
    try:
        r = subprocess.run(["bash", "benchmarks/gpu_session.sh"], cwd=paths.REPO_ROOT, env=env, capture_output=True,
                           text=True, timeout=600, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:     # say where it stood (about 20 s alone; a busy machine is slower)
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"gpu_session.sh dry run still running after 600 s; its output so far: {out[-1500:]}")
    assert r.returncode == 0, r.stderr[-800:]
    assert sorted(p.name for p in out.iterdir()) == ["session.tgz"]
    with tarfile.open(out / "session.tgz") as t:
        names = {n.lstrip("./") for n in t.getnames()}
        assert {"machine.txt", "train_log.txt", "weights_cpu.csv"} <= names
        log = t.extractfile("./train_log.txt").read().decode()
    assert "[train cpu" in log
