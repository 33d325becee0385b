"""The host's cost per kernel as the calibration model grows (host.tiny_step_us with 4, 16 and 32 layers), and the
GPU's own cost between two queued kernels (eager stream order and inside a CUDA graph).

Why: the tiny Llama's training calibration (4 layers) read 66.4 / 50.1 / 38.5 us per kernel on three GPU hosts, a
spread too wide to set a per-phase host cost (docs/tier2.md); a step's fixed costs (the loss, autograd's start,
zeroing the gradients) are shared by more kernels in a deeper model. And a GPU-bound eager step still took 1-4 %
more than its kernels (docs/tier2/2026-11-28-*): the GPU's gap between queued kernels, measured here directly by
queueing N one-element additions behind a sleeping kernel, so that the host is never the limit.

    python benchmarks/host_layers.py --out DIR      # on a GPU machine (CPU only: the CPU figures)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--layers", default="4,16,32")
    a = ap.parse_args(argv)
    import torch
    from neusight_core.cost import host
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    out = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu", "layers": {}}
    for n in (int(x) for x in a.layers.split(",")):
        out["layers"][n] = host.tiny_step_us(dev, layers=n)
        print(n, "layers:", {k: round(v, 2) for k, v in out["layers"][n].items()}, flush=True)
    if dev == "cuda":      # 500 launches (host.queued_launch_us); this script's first run queued 2,000, too many
        out["queued"] = host.queued_launch_us()
        print("queued:", {k: round(v, 3) for k, v in out["queued"].items()}, flush=True)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "host_layers.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
