"""Notebook 05's recorded modern runs (``live_modern.RECORDED``) predicted with seeds 0-2 of the full weights:
MAPE % by variant (graph = kernel sums, eager = wall times, paper's setting = eager attention and the kernel sum) and phase, mean (min-max)
over seeds, and the signed error of the kernel sums by phase. The measurements are validation: nothing here is
fitted. ``--grads accumulate`` predicts the training steps as before the eighth session (accumulation kernels that
the measured steps, whose gradients start from none, do not run).

    .venv/bin/python benchmarks/modern_steps.py [--seeds 0,1,2] [--grads fresh|accumulate]
    .venv/bin/python benchmarks/modern_steps.py --console docs/tier2/2026-11-28-h200-modern-paths=H200

``--console FOLDER=GPU``: a run whose ``modern_steps.csv`` did not come back, its steps read from the section's log
(``console.txt``: one line per step, times to 0.01 ms); with ``--save`` they are written to FOLDER/modern_steps.csv
(how ``docs/tier2/2026-11-28-h200-modern-paths/modern_steps.csv`` was made).

After the runs, the recorded pairs of two machines (``step_ranges.PAIRS``) are scored the way issue 33 scores its
independent set: a prediction between a step's two measurements counts as exact (``step_ranges.range_mape``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402

from neusight_core.studies import live_modern, step_ranges  # noqa: E402


def steps_from_console(folder) -> pd.DataFrame:
    """The steps of a run's ``console.txt`` (``live_modern.measure_section``'s log lines) as modern_steps.csv rows."""
    import re
    pat = re.compile(r"\[modern\] (\S+) (\w+) b(\d+) s(\d+) (\w+): (\w+) events (\S+) ms, wall (\S+), host (\S+), "
                     r"graph (\S+), kernels (\S+) ms / (\d+)")
    rows = []
    for line in (ROOT / folder / "console.txt").read_text().splitlines():
        m = pat.search(line)
        if m:
            g = m.groups()
            rows.append(dict(model=g[0], phase=g[1], batch=int(g[2]), seq=int(g[3]), attention=g[4], status=g[5],
                             **{c: float(v) for c, v in zip(("events_ms", "wall_ms", "host_ms", "graph_ms",
                                                              "kernel_ms"), g[6:11])}, kernels=int(g[11])))
    out = pd.DataFrame(rows)
    if not out.empty:           # the log prints "graph nan" where the capture failed, and no status
        out["graph_status"] = out["graph_ms"].notna().map({True: "OK", False: ""})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--grads", default="fresh", choices=("fresh", "accumulate"))
    ap.add_argument("--console", default=None, help="FOLDER=GPU: a run's steps from its console.txt")
    ap.add_argument("--save", action="store_true", help="with --console: write them to FOLDER/modern_steps.csv")
    a = ap.parse_args(argv)
    seeds = tuple(int(x) for x in a.seeds.split(","))
    pd.set_option("display.width", 250)
    runs = ({f"console {a.console.split('=')[0]}": (a.console.split("=")[1], a.console.split("=")[0])} if a.console
            else live_modern.RECORDED)
    preds = []
    for name, (gpu, folder) in runs.items():
        steps = steps_from_console(folder) if a.console else pd.read_csv(ROOT / folder / "modern_steps.csv")
        if a.console and a.save:
            steps.reindex(columns=list(live_modern.STEP_COLUMNS)).to_csv(ROOT / folder / "modern_steps.csv", index=False)
            print(f"wrote {len(steps)} steps to {folder}/modern_steps.csv")
        p = live_modern.predict_steps(steps, gpu, ("neusight", "roofline"), seeds, False, grads=a.grads)
        preds.append(p.assign(run=name))
        m = live_modern.step_mape(p)
        cols = [c for c in m.columns if c.startswith("mean")] + ["min pooled", "max pooled"]
        print(f"\n{name} ({gpu}), grads {a.grads}, seeds {list(seeds)}")
        print(m[cols].to_string())
        g = p[(p["variant"] == "graph") & (p["predictor"] == "neusight")]
        print("signed, neusight kernel sums:", g.groupby("phase")["error_pct"].mean().round(1).to_dict())
    pred = pd.concat(preds, ignore_index=True)
    r = step_ranges.range_mape(pred)
    if not r.empty:
        cols = [c for c in r.columns if c.startswith("mean")] + ["min pooled", "max pooled", "steps"]
        print(f"\nagainst two machines' range (a prediction between a step's two measurements is exact), seeds {list(seeds)}")
        print(r[cols].to_string())
        f = step_ranges.range_frame(pred).query("predictor == 'neusight' and variant == 'eager'")
        print("\nneusight eager walls against the range: signed mean error % / share of steps inside the range")
        print(f.groupby(["GPU", "harness", "phase"], sort=False)["error_pct"]
              .agg(signed="mean", inside=lambda e: (e == 0).mean()).round(2).unstack("phase").to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
