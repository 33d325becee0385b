"""Speed of serving answers (docs/serving.md): one ``serve`` answer from the trace cache in a new process, and a
1,000-question serving sweep (5 GPUs x TP 1, 2, 4, 8 x concurrency 8-128 x ISL 512-8192 x OSL 128, 1024 of
Llama-3.1-8B) from a cold trace cache. Targets: 2 s and 60 s on 2 cores.

    .venv/bin/python benchmarks/serve_speed.py [--quick] [--rounds N]

The cold sweep uses a fresh trace cache folder (a temporary directory); the single answer is timed after it, from that
cache. Weights: full if trained, else ``--quick``; training time is never counted.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ONE = ["--model", "llama3_8b", "--device", "H100", "--engine", "trtllm", "--isl", "1024", "--osl", "128",
       "--concurrency", "32"]
SWEEP = ["--model", "llama3_8b", "--device", "H100,H200,A100,L40S,B200", "--tp", "1,2,4,8",
         "--concurrency", "8,16,32,64,128", "--isl", "512,1024,2048,4096,8192", "--osl", "128,1024"]


def timed(args: list, env: dict) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "neusight_core", "serve", *args], cwd=ROOT, env=env, check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="quick weights")
    ap.add_argument("--rounds", type=int, default=5, help="single answers timed (the median counts)")
    a = ap.parse_args(argv)
    weights = ["--quick"] if a.quick else []
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as out:
        env = dict(os.environ, NEUSIGHT_TRACE_CACHE=cache, TQDM_DISABLE="1")
        sweep_s = timed(SWEEP + weights + ["--out", str(Path(out) / "sweep.csv")], env)
        rows = sum(1 for _ in open(Path(out) / "sweep.csv")) - 1
        one = [timed(ONE + weights, env) for _ in range(a.rounds)]
    print(f"serving sweep, {rows} questions, cold trace cache: {sweep_s:.1f} s (target 60 s)")
    print(f"one serve answer from the trace cache, new process: median {statistics.median(one):.2f} s of {a.rounds} "
          f"({min(one):.2f}-{max(one):.2f}; target 2 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
