"""Notebook 04's SUMMARY section and metrics, built by tier1_report from small hand-made frames."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from neusight_core.studies import recipe_eval as R
from neusight_core.reports import tier1_report as T


def _run(**over) -> T.Tier1Run:
    groups = list(R.HEADLINE_GROUPS[:3])
    pooled = pd.DataFrame([
        {"group": "NVIDIA inference", "predictor": "neusight", "source": "ours", "mape": 9.4, "n": 40},
        {"group": "NVIDIA inference", "predictor": "neusight", "source": "authors", "mape": 11.5, "n": 40},
        {"group": "NVIDIA inference", "predictor": "roofline", "source": "ours", "mape": 55.0, "n": 40},
        {"group": "AMD", "predictor": "neusight", "source": "ours", "mape": np.nan, "n": 0},
    ])
    seed_sum = pd.DataFrame([{"group": g, "predictor": r, "mean": m, "min": m - 1, "max": m + 1, "n": 10, "seeds": 3}
                             for g, m in zip(groups, (9.4, 8.4, 10.0)) for r in R.RECIPES])
    versus = pd.DataFrame([{"group": groups[0], "beats every seed": True, "target met": True, "target": 9.0,
                            "neusight mean": 8.9},
                           {"group": groups[1], "beats every seed": False, "target met": np.nan, "target": np.nan,
                            "neusight mean": 8.4}])
    claims = pd.DataFrame([{"recipe": r, "claim": c, "verdict": v} for r in R.RECIPES
                           for c, v in (("C1", "REPRODUCED"), ("C2", "MIXED (REPRODUCED 1, DEVIATES 2)"))])
    base = dict(
        quick=True, configs=pd.DataFrame({"gpu": ["A", "B"], "config": ["x", "y"]}),
        failed=pd.DataFrame({"gpu_short": ["H100"], "config": ["gpt3_27-inf-2048-8"], "ours_error": ["TraceError: boom"]}),
        predictors=["neusight", "roofline"], seeds=[0, 1, 2], total_s=12.3, pooled=pooled, seed_sum=seed_sum,
        authors_pairs={g: 11.1 for g in groups}, recipe_tab=pd.DataFrame({"predictions": ["neusight"], "x": ["9.4 (8.4-10.4)"]}),
        versus=versus, gemm_vs_alone=pd.DataFrame({"gpu": ["H100"], "time_ratio": [1.07]}), recipe_claims=claims,
        graph_tab=pd.DataFrame({"row": ["our trace"], f"{groups[0]} mean": [9.4]}),
        headline=pd.DataFrame({"claim": ["C1", "C2", "C2", "C3", "C4"], "n_cells": [3.0, 54, 54, 26, 30],
                               "quantity": ["NeuSight", "NeuSight", "Roofline", "NeuSight", "NeuSight avg"],
                               "paper": [8.9, 9.7, 31.2, 7.3, 8.1]}),
        claims_both=pd.DataFrame({"claim": ["C1"], "verdict (ours)": ["REPRODUCED"]}),
        timing=pd.DataFrame([{"cold_s": 1.25, "warm_s": 0.5, "load_s": 0.1}]),
        train_times=pd.DataFrame({"predictor": ["neusight", "li"], "seed": [0, 0], "train_s": [754.0, np.nan]}),
        verdicts={"tier": 1, "counts": {"REPRODUCED": 3}})
    base.update(over)
    return T.Tier1Run(**base)


def test_summary_names_failures_targets_groups_and_times():
    md = T.summary_markdown(_run())
    assert "QUICK subset" in md and "2 configurations, 1 failed to predict: H100 gpt3_27-inf-2048-8 (TraceError: boom)" in md
    assert "met on 1 of 1 groups: inference (Fig. 7) 8.9 (target 9.0)" in md
    # a column per baseline the pooled frame has (here only the roofline)
    assert "| our Roofline |\n" in md and "Habitat" not in md
    assert "| NVIDIA inference | 40 | 9.4 | 11.5 | 55.0 |\n" in md and "| AMD | 0 | — | — | — |" in md
    assert "H100 1.07" in md and "cold 1.25 s" in md and "2 configurations x 2 predictors: 12 s" in md
    assert "Ablation" not in md
    with_abl = T.summary_markdown(_run(abl_tab=pd.DataFrame({"row": ["base", "+ lr"], "g mean": [10.0, 9.0]})))
    assert "Ablation" in with_abl and "+ lr" in with_abl
    # the heading says what the rows trained on, where the notebook gives it
    cap = "Pooled MAPE (%) ...; every row, the base included, trained on the same random 1,000 raw records per op class."
    with_cap = T.summary_markdown(_run(abl_tab=pd.DataFrame({"row": ["base", "+ lr"], "g mean": [10.0, 9.0]}),
                                       abl_caption=cap))
    assert f"`tables/ablation.md`): {cap}\n\n| row" in with_cap


def test_metrics_are_json_and_carry_the_verdict_summary():
    m = T.metrics(_run())
    json.dumps(m)                                        # metrics.json must serialise
    assert m["failed"] == 1 and m["quick"] is True and m["seeds"] == [0, 1, 2]
    assert m["mape"]["NVIDIA inference|neusight|ours"] == 9.4 and m["mape"]["AMD|neusight|ours"] is None
    assert m["training_seconds"] == {"neusight|0": 754.0}           # the NaN (untrained) one is left out
    assert m["verdicts"]["counts"] == {"REPRODUCED": 3}
    s = m["verdicts"]["summary"]
    for r in R.RECIPES:
        assert f"`{r}` 9.4 (8.4-10.4) / 8.4 (7.4-9.4) / 10.0 (9.0-11.0)" in s
        assert "MIXED" not in s       # one count per line: the block's (seed 0's); every seed's in the table named
    assert s.index("NeuSight's own MAPE") < s.index("the paper 9.7 / 7.3 / 8.1") < s.index(
        "authors' shipped predictions 11.1 / 11.1 / 11.1")
    assert "AMD" not in s                                   # no AMD configuration in this run: nothing said
    assert set(m["claims_per_recipe"]) == set(R.RECIPES)


def test_the_verdict_line_gives_the_amd_gap_with_its_reason():
    pooled = _run().pooled.copy()
    pooled.loc[pooled.group == "AMD", "mape"] = 41.3
    pooled = pd.concat([pooled, pd.DataFrame([{"group": "AMD", "predictor": "neusight", "source": "authors",
                                               "mape": 11.2, "n": 20}])])
    s = T.verdict_summary(_run(pooled=pooled))
    assert "AMD (Fig. 9): ours 41.3 % against the authors' 11.2 %, because the release has no BMM / linear " \
           "training collects for MI100 / MI210" in s and "it trains on MI100 + MI210" in s
