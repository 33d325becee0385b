"""Issue 23: every prediction entry point gives the same numbers before and after the engine.

    .venv/bin/python benchmarks/engine_equality.py save  /tmp/before.pkl   # on the code before the change
    .venv/bin/python benchmarks/engine_equality.py check /tmp/before.pkl   # after it: max relative difference

Computes, with the weights under artifacts/trained (quick ones for neusight / neusight-paper seeds 0-1, roofline,
habitat, li; with ``--full`` also the full ones of neusight seeds 0-1 and neusight-paper seeds 0-2), what each
entry point answers for a fixed list of scenarios:

* ``reproduce.predict_configs`` / ``recipe_eval.sweep_seeded`` / ``recipe_eval.predict_seeded`` over all labelled
  configurations of two GPUs (H100: every option; L4: fusion), ``recipe_studies.predict_tables`` (authors' graph and
  no-mask variants) on their figure cells;
* ``latency.predict_model`` for single scenarios (TP / PP / DP, fusion, bf16, decode, training, ResNet-50, ViT-B/16),
  its phases, per-class sums, memory and the kernel table's ``pred_ms``;
* ``sweep.run`` over a dozen rows (plans, bf16, training, an image model, a bad row);
* ``whatif.run`` in quick mode (notebook 06's grid).

``check`` compares every number to 1e-9 relative (strings and NaN placement exactly) and exits 1 on a difference.
"""
from __future__ import annotations

import argparse
import pickle
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

GPUS = ["NVIDIA_H100_80GB_HBM3", "NVIDIA_L4"]
QUICK = [("neusight", 0), ("neusight", 1), ("neusight-paper", 0), ("neusight-paper", 1), ("roofline", 0),
         ("habitat", 0), ("li", 0)]
FULL = [("neusight", 0), ("neusight", 1), ("neusight-paper", 0), ("neusight-paper", 1), ("neusight-paper", 2)]
SINGLE = [  # latency.predict_model keyword sets
    dict(model="gpt2_large", device="H100", batch=4, seq=512, mode="inf"),
    dict(model="gpt2_large", device="A100", batch=2, seq=256, mode="train"),
    dict(model="bert_large", device="V100", batch=8, seq=128, mode="inf", fusion=True),
    dict(model="gpt3_xl", device="H100", batch=4, seq=512, mode="train", parallel="tp", gpus=4),
    dict(model="gpt3_xl", device="H100", batch=8, seq=512, mode="train", parallel="pp", gpus=4, micro_batches=2),
    dict(model="gpt2_large", device="H100", batch=8, seq=256, mode="train", parallel="dp", gpus=4),
    dict(model="gpt2_large", device="H100", batch=4, seq=512, mode="inf", dtype="bf16"),
    dict(model="gpt2_large", device="L4", batch=2, seq=1, mode="inf", past=255),
    dict(model="resnet50", device="A100", batch=32, image_size=224, mode="inf"),
    dict(model="vit_b16", device="H100", batch=8, image_size=224, mode="train"),
]
SWEEP_ROWS = [
    dict(model="gpt2_large", device="H100", batch=4, seq=512, mode="inf"),
    dict(model="gpt2_large", device="H100", batch=8, seq=512, mode="inf"),
    dict(model="gpt2_large", device="A100", batch=4, seq=256, mode="train"),
    dict(model="bert_large", device="L4", batch=2, seq=384, mode="inf", dtype="bf16"),
    dict(model="bert_large", device="L4", batch=4, seq=384, mode="train", dtype="bf16"),
    dict(model="gpt3_xl", device="H100", batch=4, seq=512, mode="train", parallel="tp", gpus=4),
    dict(model="gpt3_xl", device="H100", batch=8, seq=512, mode="train", parallel="pp", gpus=4, micro_batches=2),
    dict(model="gpt2_large", device="H100", batch=8, seq=256, mode="train", parallel="dp", gpus=4),
    dict(model="bert_large", device="V100", batch=8, seq=128, mode="inf", fusion=True),
    dict(model="gpt2_large", device="L4", batch=2, seq=1, mode="inf", past=255),
    dict(model="resnet50", device="A100", batch=32, image_size=224, mode="inf"),
    dict(model="gpt2_large", device="H100", batch=0, seq=512, mode="inf"),         # an error row
]


def _quick_trained():
    from neusight_core import predictors as P
    return {(n, s): P.get(n, quick=True, seed=s) for n, s in QUICK}


def _numbers(d: dict, prefix: str = "") -> dict:
    """Flatten a predict_model result into {key: number or string}."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if k in ("trace_s", "predict_s"):
            continue                      # wall times
        if isinstance(v, pd.DataFrame):
            out[key + ".pred_ms"] = v["pred_ms"].to_numpy(float)
        elif isinstance(v, dict):
            out.update(_numbers(v, key + "."))
        elif isinstance(v, (list, tuple)) and all(isinstance(x, (int, float)) for x in v):
            out[key] = np.asarray(v, float)
        else:
            out[key] = v
    return out


def compute(full: bool) -> dict:
    from neusight_core.studies import evaluation as ev
    from neusight_core.cost import latency, sweep
    from neusight_core.studies import recipe_eval as R, recipe_studies as S, reproduce, whatif
    res, times = {}, {}
    index = ev.build_index()
    configs = index[index["gpu"].isin(GPUS)].reset_index(drop=True)
    trained = _quick_trained()
    t = time.perf_counter()
    res["reproduce.predict_configs"] = reproduce.predict_configs(configs, ["neusight", "neusight-paper", "roofline",
                                                                           "habitat", "li"], quick=True, seeds=(0, 1),
                                                                 progress=False).drop(columns=["ours_wall_s"])
    times["reproduce.predict_configs"] = time.perf_counter() - t
    t = time.perf_counter()
    res["recipe_eval.sweep_seeded"] = R.sweep_seeded(configs, ["neusight", "neusight-paper", "roofline", "habitat",
                                                               "li"], (0, 1), quick=True, progress=False)
    times["recipe_eval.sweep_seeded"] = time.perf_counter() - t
    t = time.perf_counter()
    res["recipe_eval.predict_seeded"] = R.predict_seeded(configs, trained, progress=False)
    times["recipe_eval.predict_seeded"] = time.perf_counter() - t
    fig_cells = configs[R.figure_mask(configs, "nvidia_inf") | R.figure_mask(configs, "nvidia_train")]
    recipe_trained = {k: v for k, v in trained.items() if k[0] in ("neusight", "neusight-paper")}
    for v, fn in S.GRAPH_TABLES.items():
        t = time.perf_counter()
        res[f"recipe_eval.predict_tables.{v}"] = S.predict_tables(fig_cells, recipe_trained, fn, progress=False)
        times[f"recipe_eval.predict_tables.{v}"] = time.perf_counter() - t
    if full:
        from neusight_core import predictors as P
        full_trained = {(n, s): P.get(n, quick=False, seed=s) for n, s in FULL}
        t = time.perf_counter()
        res["recipe_eval.predict_seeded.full"] = R.predict_seeded(configs, full_trained, progress=False)
        times["recipe_eval.predict_seeded.full"] = time.perf_counter() - t
    t = time.perf_counter()
    for i, kw in enumerate(SINGLE):
        for name in ("neusight", "roofline"):
            for seed in ((0, 1) if name == "neusight" else (0,)):
                r = latency.predict_model(predictor=trained[(name, seed)], quick=True, **kw)
                res[f"latency.predict_model.{i}.{name}.{seed}"] = _numbers(r)
        res[f"latency.predict_model.{i}.byname"] = _numbers(latency.predict_model(predictor="neusight", quick=True,
                                                                                  **kw))
    times["latency.predict_model"] = time.perf_counter() - t
    t = time.perf_counter()
    res["sweep.run"] = sweep.run(pd.DataFrame(SWEEP_ROWS), ["neusight", "roofline", "habitat"], (0, 1), quick=True,
                                 progress=False)
    res["sweep.run.objects"] = sweep.run(pd.DataFrame(SWEEP_ROWS), [("neusight s1", trained[("neusight", 1)]),
                                                                    ("li", trained[("li", 0)])], progress=False)
    times["sweep.run"] = time.perf_counter() - t
    t = time.perf_counter()
    res["whatif.run"] = whatif.run(quick=True, predictor="neusight")
    times["whatif.run"] = time.perf_counter() - t
    return res, times


#: fields a change added on purpose (``--new-fields``): a key or column of that name that only the new result has
#: is left out of the comparison (the check's output names them), so that the numbers beside it are compared
NEW_FIELDS: set = set()


def _compare(a, b, where: str, diffs: list):
    """Append (relative difference, where) for numbers; a string / NaN-placement mismatch is inf."""
    if isinstance(a, dict) and isinstance(b, dict):
        # flattened results name a nested field "field.key": the field's name is its first part
        a = {k: v for k, v in a.items() if not (str(k).split(".")[0] in NEW_FIELDS and k not in b)}
    if isinstance(a, pd.DataFrame) and isinstance(b, pd.DataFrame):
        a = a.drop(columns=[c for c in a.columns if c in NEW_FIELDS and c not in b.columns])
    if isinstance(a, dict):
        if set(a) != set(b):
            diffs.append((np.inf, f"{where}: keys {sorted(set(a) ^ set(b))}"))
        for k in set(a) & set(b):
            _compare(a[k], b[k], f"{where}.{k}", diffs)
        return
    if isinstance(a, pd.DataFrame):
        if list(a.columns) != list(b.columns) or len(a) != len(b):
            diffs.append((np.inf, f"{where}: columns / rows {list(a.columns)} {len(a)} vs {list(b.columns)} {len(b)}"))
            return
        for c in a.columns:
            _compare(a[c].to_numpy(), b[c].to_numpy(), f"{where}[{c}]", diffs)
        return
    if isinstance(a, np.ndarray) or isinstance(a, pd.Series):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            diffs.append((np.inf, f"{where}: shape {a.shape} vs {b.shape}"))
            return
        try:
            fa, fb = a.astype(float), b.astype(float)
        except (TypeError, ValueError):
            def same(x, y):      # a missing value (None, NaN, pd.NA) equals only a missing one
                nx, ny = (bool(pd.isna(v)) if np.ndim(v) == 0 else False for v in (x, y))
                return (nx and ny) or (not nx and not ny and bool(np.all(x == y)))
            bad = [i for i, (x, y) in enumerate(zip(a, b)) if not same(x, y)]
            if bad:
                diffs.append((np.inf, f"{where}: {len(bad)} values differ, e.g. {a[bad[0]]!r} vs {b[bad[0]]!r}"))
            return
        if (np.isnan(fa) != np.isnan(fb)).any():
            diffs.append((np.inf, f"{where}: NaN placement"))
            return
        m = ~np.isnan(fa)
        rel = np.abs(fa[m] - fb[m]) / np.maximum(np.abs(fb[m]), 1e-300)
        rel = np.where(fa[m] == fb[m], 0.0, rel)
        diffs.append((float(rel.max()) if rel.size else 0.0, where))
        return
    if isinstance(a, (float, int, np.floating, np.integer)) and not isinstance(a, bool):
        _compare(np.asarray([a]), np.asarray([b]), where, diffs)
        return
    if not (a == b or (a is None and b is None)):
        diffs.append((np.inf, f"{where}: {a!r} vs {b!r}"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["save", "check"])
    ap.add_argument("file", type=Path)
    ap.add_argument("--full", action="store_true", help="also the full weights (neusight 0-1, neusight-paper 0-2)")
    ap.add_argument("--show", type=int, default=15, help="check: list this many of the largest differences")
    ap.add_argument("--new-fields", default="", help="check: comma-separated keys / columns the change added (left "
                                                      "out where the saved result lacks them)")
    a = ap.parse_args(argv)
    NEW_FIELDS.update(x for x in a.new_fields.split(",") if x)
    if NEW_FIELDS:
        print(f"left out where only the new result has them: {', '.join(sorted(NEW_FIELDS))}")
    t0 = time.perf_counter()
    res, times = compute(a.full)
    print("wall times (s): " + ", ".join(f"{k} {v:.1f}" for k, v in times.items()))
    print(f"computed in {time.perf_counter() - t0:.0f} s")
    if a.action == "save":
        a.file.write_bytes(pickle.dumps(res))
        print(f"saved {len(res)} results to {a.file}")
        return 0
    before = pickle.loads(a.file.read_bytes())
    diffs = []
    for k in before:
        if k not in res:
            diffs.append((np.inf, f"{k}: missing now"))
            continue
        _compare(res[k], before[k], k, diffs)
    per_entry: dict[str, float] = {}
    for d, w in diffs:      # the entry point: the result's name without its scenario index / predictor
        entry = ".".join(p for p in w.split("[")[0].split(".")[:3] if not p.isdigit())
        per_entry[entry] = max(per_entry.get(entry, 0.0), d)
    print("max relative difference per entry point: " + ", ".join(f"{k} {v:.2g}" for k, v in sorted(per_entry.items())))
    worst = sorted(diffs, key=lambda d: -d[0])
    n_bad = sum(d > 1e-9 for d, _ in diffs)
    print(f"{len(diffs)} number groups compared; max relative difference {worst[0][0]:.3g} ({worst[0][1]})")
    for d, w in worst[:a.show]:
        if d > 1e-9:
            print(f"  DIFFERENT {d:.3g}: {w}")
    print("EQUAL to 1e-9" if n_bad == 0 else f"{n_bad} groups differ by more than 1e-9")
    return 1 if n_bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
