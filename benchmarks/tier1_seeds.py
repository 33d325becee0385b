"""Tier 1 (notebook 04's labelled configurations) of the weights that are trained here, per seed, without training.

Issue 36: weights trained on a GPU are another draw of the seeds; their Tier 1 table goes beside the CPU ones. This
predicts every labelled configuration with each (recipe, seed) whose full (or ``--quick``) weights exist, and
writes ``tier1_long.csv`` (one row per configuration x predictor x seed), ``tier1_summary.csv`` (mean, min, max and
spread over seeds per group, ``recipe_eval.seed_summary``) and ``weights.csv`` (where and how long each trained).

    .venv/bin/python benchmarks/tier1_seeds.py --out /tmp/t1 [--predictors neusight,neusight-paper,roofline]
        [--seeds 0,1,2] [--quick]
    .venv/bin/python benchmarks/tier1_seeds.py --compare A/tier1_long.csv B/tier1_long.csv

``--compare``: two such tables (e.g. weights trained on a GPU machine, whose torch / transformers trace some models
differently, and weights trained here) on the configurations whose kernel tables agree, i.e. whose roofline
prediction is the same in both (to 1e-9): MAPE per group, predictor and seed of each, then mean (min-max) over seeds.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def compare(a_csv: str, b_csv: str) -> int:
    import numpy as np
    import pandas as pd

    from neusight_core.studies import evaluation as ev
    from neusight_core.studies import recipe_eval as re
    from neusight_core.studies import reproduce
    a, b = pd.read_csv(a_csv), pd.read_csv(b_csv)
    key = ["gpu", "config"]
    ra = a[a.predictor == "roofline"].set_index(key)["pred_ms"]
    rb = b[b.predictor == "roofline"].set_index(key)["pred_ms"]
    both = ra.index.intersection(rb.index)
    same = both[np.isclose(ra.loc[both], rb.loc[both], rtol=1e-9, atol=0) | (ra.loc[both].isna() & rb.loc[both].isna())]
    print(f"{len(same)} of {len(both)} configurations have the same kernel tables in both (roofline equal)")
    configs = reproduce.select_configs(ev.build_index(), False)
    configs = configs[configs.set_index(key).index.isin(same)].reset_index(drop=True)
    rows = []
    for name, t in (("A", a), ("B", b)):
        t = t[t.set_index(key).index.isin(same) & (t.predictor != "roofline")]
        s = re.seed_summary(re.seed_mape(t, configs))
        rows.append(s[s.group.isin(re.HEADLINE_GROUPS)].assign(table=name))
    out = pd.concat(rows)
    out["cell"] = [re.fmt_mean_range(r) for _, r in out.iterrows()]
    print(out.pivot_table(index=["predictor", "table"], columns="group", values="cell", aggfunc="first")
          [list(re.HEADLINE_GROUPS)].to_string())
    return 0


def main(argv=None) -> int:
    import pandas as pd

    from neusight_core.studies import evaluation as ev
    from neusight_core import predictors as P
    from neusight_core.studies import recipe_eval as re
    from neusight_core.studies import reproduce
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--predictors", default="neusight,neusight-paper,roofline")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--quick", action="store_true", help="the quick weights and the quick configurations")
    ap.add_argument("--compare", nargs=2, metavar="LONG_CSV")
    a = ap.parse_args(argv)
    if a.compare:
        return compare(*a.compare)
    if not a.out:
        ap.error("--out is required (or --compare A B)")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    seeds = [int(s) for s in a.seeds.split(",")]
    trained, weights = {}, []
    for n in a.predictors.split(","):
        for s in (seeds if n in re.SEEDED else [0]):
            # trained weights only: a benchmark never starts a training (the seedless baselines fit in seconds)
            if n in re.SEEDED and P.trains_long(n) and not P.is_trained(n, a.quick, s):
                print(f"{n} seed {s}: no {'quick' if a.quick else 'full'} weights here; skipped", flush=True)
                continue
            p = P.get(n, quick=a.quick, seed=s)
            trained[(n, s)] = p
            weights.append({"predictor": n, "seed": s, "train_seconds": p.info.get("train_seconds"),
                            "trained_on": p.info.get("trained_on", "cpu (before issue 36: not recorded)")})
    pd.DataFrame(weights).to_csv(out / "weights.csv", index=False)
    configs = reproduce.select_configs(ev.build_index(), a.quick)
    long = re.predict_seeded(configs, trained, progress=False)
    long.to_csv(out / "tier1_long.csv", index=False)
    summary = re.seed_summary(re.seed_mape(long, configs))
    summary.to_csv(out / "tier1_summary.csv", index=False)
    head = summary[summary["group"].isin(re.HEADLINE_GROUPS)]
    print(pd.DataFrame(weights).to_string(index=False))
    print(head.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
