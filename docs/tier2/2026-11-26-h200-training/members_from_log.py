"""Each member's progress in the pooled CPU training of call 2 (call2_cpu_pool_log.txt, 16 processes, cut at 190 s):
epochs done, seconds, seconds per epoch and, for a member not finished, its time if that rate held (an
extrapolation). Run from the repository root: python docs/tier2/2026-11-26-h200-training/members_from_log.py"""
import re
from pathlib import Path

import pandas as pd

last = {}
for line in (Path(__file__).parent / "call2_cpu_pool_log.txt").read_text().splitlines():
    m = re.match(r"\[member (\S+) (\w+) seed (\d) #(\d)\] epoch (\d+)/(\d+) at (\d+) s", line)
    if m:
        recipe, cls, seed, i, done, total, s = m.groups()
        last[(recipe, cls, int(seed), int(i))] = (int(done), int(total), int(s))
rows = [{"recipe": r, "class": c, "seed": sd, "member": i, "epochs_done": d, "epochs": t, "seconds": s,
         "s_per_epoch": round(s / d, 2), "finished": d == t, "seconds_at_this_rate": round(s / d * t)}
        for (r, c, sd, i), (d, t, s) in sorted(last.items())]
df = pd.DataFrame(rows)
print(df.to_string(index=False))
print(f"\n{len(df)} members started, {int(df['finished'].sum())} finished; not started in 190 s: the members not listed")
