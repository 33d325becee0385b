"""Rebuild modern_steps.csv from console.txt: the device session brought back 8 files at most and the CSV was the
one left out, while the console has every step's line (0.01 ms precision). Columns the console does not print
(graph_status when a graph was timed, attention_kernels, peak_gib) are left empty, except graph_status, which is
OK where a graph time is printed. Run from the repository root: python docs/tier2/2026-11-26-h200-modern/steps_from_log.py"""
import re
from pathlib import Path

import pandas as pd

from neusight_core.studies.live_modern import STEP_COLUMNS

here = Path(__file__).parent
pat = re.compile(r"\[modern\] (\S+) (\w+) b(\d+) s(\d+) (\w+): OK events ([\d.]+) ms, wall ([\d.]+), host ([\d.]+), "
                 r"graph ([\w.]+), kernels ([\d.]+) ms / (\d+)")
rows = []
for line in (here / "console.txt").read_text().splitlines():
    m = pat.search(line)
    if m:
        model, phase, b, s, attn, ev, wall, host, graph, kms, nk = m.groups()
        rows.append({"model": model, "phase": phase, "batch": int(b), "seq": int(s), "attention": attn, "status": "OK",
                     "events_ms": float(ev), "wall_ms": float(wall), "host_ms": float(host),
                     "graph_ms": float(graph), "graph_status": "OK" if graph != "nan" else "",
                     "kernel_ms": float(kms), "kernels": int(nk)})
pd.DataFrame(rows, columns=list(STEP_COLUMNS)).to_csv(here / "modern_steps.csv", index=False)
print(len(rows), "steps")
