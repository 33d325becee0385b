"""What makes the NeuSight recipes differ (notebooks 03 and 04): the ablation (the authors' recipe with one
difference at a time switched to ours), the graph rows (each recipe on our aten trace, on the authors' graph and
without the attention-mask ops), the epoch cut of the authors' recipe and shapes held out of training.

Seed statistics and the Tier 1 tables these studies report with are ``recipe_eval``'s.
"""
from __future__ import annotations

import time

import numpy as np
import pandas as pd

from neusight_core import predictors as P
from neusight_core.predictors.base import PREDICTION_ONLY_KEYS
from neusight_core.studies import recipe_eval as R

# ---------------------------------------------------------------- graph rows of the ablation (prediction only)
# The kernel tables a recipe can be asked to time: our aten trace (section 2b), the authors' one-layer graph,
# and our trace without the ops that apply the attention mask.
GRAPHS = {"trace": "our aten trace", "authors": "authors' graph", "no_mask": "our trace without attention-mask ops"}


def _authors_table(config: str) -> pd.DataFrame:
    from neusight_core.studies import opgraph
    return opgraph.kernel_table(config)


def _no_mask_table(config: str) -> pd.DataFrame:
    from neusight_core.cost import tables
    from neusight_core.tracing import trace
    from neusight_core.question.step import Step
    from neusight_core.studies import opgraph
    d = opgraph.parse_name(config)
    if d["fusion"] or d["plan"]:
        raise opgraph.OpGraphError(f"{config}: only single-GPU, unfused configurations")
    k = tables.kernel_table(Step(model=d["model"], batch=d["batch"], seq=d["seq"], mode=d["mode"]))
    return k[~trace.attention_mask_ops(k)]


GRAPH_TABLES = {"authors": _authors_table, "no_mask": _no_mask_table}


def predict_tables(configs: pd.DataFrame, trained: dict, table_of, progress: bool = True) -> pd.DataFrame:
    """``predict_seeded``'s frame (without the phase and ``<CLASS>_ms`` columns) with each configuration's kernel
    table from ``table_of(config name)``: ``engine.predict`` of the configurations with that table instead of the
    trace; e2e = the phases' sum of per-launch time x ``count`` (single GPU). Prediction only: the same trained
    networks. A table that cannot be built gives its reason in ``error``."""
    from neusight_core.cost import engine
    from neusight_core.cost import request
    from neusight_core.studies import reproduce
    cfg = configs.reset_index(drop=True)
    requests = [dict(model=r.model, device=r.gpu, batch=int(r.batch), seq=int(r.seq), mode=r.mode,
                     **reproduce.option_kwargs(r.option)) for r in cfg.itertuples(index=False)]

    def key(f):   # what tells the configurations' tables apart
        return (str(f["model"]), int(f["batch"]), int(f["seq"]), f["mode"], bool(f.get("fusion")),
                f.get("parallel") or None, int(f.get("gpus") or 1))
    name_of = {}
    for f, c in zip(requests, cfg["config"]):
        if name_of.setdefault(key(f), c) != c:
            raise ValueError(f"configurations {name_of[key(f)]!r} and {c!r} have the same model, batch, sequence, "
                             "mode and option: one kernel table cannot be both")
    out = engine.predict(request.parse(requests), [(name, p) for (name, _), p in trained.items()],
                         table_of=lambda f: table_of(name_of[key(f)]), memory_columns=False, progress=progress)
    reps = len(out) // max(len(cfg), 1)
    base = pd.concat([cfg[["gpu", "config", "option", "label_e2e_ms"]]] * reps, ignore_index=True)
    # the seed each row is reported under is its key's (predict_seeded checks that the two agree)
    long = base.assign(predictor=out["predictor"].to_numpy(), seed=np.repeat([int(s) for _, s in trained], len(cfg)),
                       e2e_ms=out["e2e_ms"].to_numpy(), error=out["error"].to_numpy())
    return R.tidy(cfg, long)


def graph_names(recipe: str, variants=("authors",)) -> tuple[str, ...]:
    """Row names of a recipe on our trace and on each variant ('<recipe>: our aten trace', ...)."""
    return tuple(f"{recipe}: {GRAPHS[v]}" for v in ("trace", *variants))


def graph_long(long_trace: pd.DataFrame, variants: dict, recipes=R.RECIPES) -> pd.DataFrame:
    """``long_trace`` and every ``{variant: frame}`` in one frame, the predictor renamed to
    '<recipe>: <GRAPHS[variant]>'."""
    parts = []
    for r in recipes:
        names = graph_names(r, tuple(variants))
        for name, frame in zip(names, [long_trace, *variants.values()]):
            parts.append(frame[frame["predictor"] == r].assign(predictor=name))
    return pd.concat(parts, ignore_index=True)


def graph_table(long_trace: pd.DataFrame, variants: dict, configs: pd.DataFrame,
                groups: dict | None = None, recipes=R.RECIPES) -> pd.DataFrame:
    """The graph rows of the ablation: per recipe, pooled MAPE on our aten trace and on each variant's tables
    (``ablation_table``'s columns; "vs our trace" = the variant minus our trace, same recipe and seeds)."""
    groups = R.group_masks(configs, per_gpu=False) if groups is None else groups
    both = graph_long(long_trace, variants, recipes)
    tabs = []
    for r in recipes:
        names = graph_names(r, tuple(variants))
        sub = both[both["predictor"].isin(names)]
        if sub["predictor"].nunique() < 2:
            continue
        t = ablation_table(R.seed_mape(sub, configs, groups), [(n, {}) for n in names], groups=list(groups))
        tabs.append(t.rename(columns={c: c.replace(" vs base", " vs our trace") for c in t.columns}))
    return pd.concat(tabs, ignore_index=True) if tabs else pd.DataFrame()


# ---------------------------------------------------------------- ablation
# keys that change prediction only: no retraining needed (``tile_lookup`` stays in the weights' key, as it always
# was; the predictors' own list is also left out of it)
PREDICTION_ONLY = ("tile_lookup",) + PREDICTION_ONLY_KEYS


def _plan(plan: str) -> dict:
    import yaml

    from neusight_core.predictors.registry import RECIPES_DIR
    return yaml.safe_load((RECIPES_DIR / f"{plan}.yaml").read_text())


def ablation_plan(epochs: int | None = None, plan: str = "ablation") -> list[tuple[str, dict]]:
    """[(row name, config overrides on the base recipe)], first the base itself, last the target recipe.
    A step that switches no value (both recipes agree on its keys) is kept with a note in its name.
    ``epochs`` (CPU budget) overrides the training length of every row that keeps the base's optimiser.
    ``plan``: ``ablation`` (the authors' recipe -> ours) or ``ablation-logo`` (-> our earlier recipe)."""
    from neusight_core.predictors.registry import hparams
    plan = _plan(plan)
    base, target = hparams(plan["base"]), hparams(plan["target"])
    budget = {} if epochs is None else {"epochs": int(epochs)}
    rows = [(f"{plan['base']} (base)", dict(budget))]
    for step in plan["steps"]:
        over = {k: target[k] for k in step["keys"] if k in target and target.get(k) != base.get(k)}
        if "epochs" in step["keys"]:
            row = over
        else:
            row = {**over, **budget}
        rows.append((step["name"] + ("" if over else " (no difference)"), row))
    rows.append((f"all = {plan['target']}", {k: v for k, v in target.items() if v != base.get(k)}
                 | {k: None for k in base if k not in target}))
    return rows


def _variant(base_pred, overrides: dict):
    """A trained predictor with prediction-only keys changed (shares the networks)."""
    import copy

    from neusight_core.predictors.tiles import TileLookup
    p = copy.copy(base_pred)
    p.config = {**base_pred.config, **overrides}
    if "tile_lookup" in overrides:
        state = base_pred.tiles.state()
        state["method"] = overrides["tile_lookup"]
        p.tiles = TileLookup.from_state(state)
    return p


def train_ablation(seeds=(0, 1), epochs: int | None = None, quick: bool = False,
                   rows: int | None = None, plan: str = "ablation") -> tuple[dict, pd.DataFrame]:
    """Train (or load) every ablation row for every seed: ({(row, seed): predictor}, training-time frame).
    ``rows``: every row (the base and the target recipe included) trains on the same random subset of that
    many records per op class (CPU budget), so rows compare with each other, not with the full recipes.
    What is missing trains first, one process per core (``P.train_parallel``)."""
    base_name = _plan(plan)["base"]
    rows_plan = ablation_plan(epochs, plan)
    base_over = rows_plan[0][1]

    def job(name, over, seed):
        """(recipe, config, prediction-only overrides) of one row."""
        train_keys = {k: v for k, v in over.items() if k not in PREDICTION_ONLY}
        if name.startswith("all = "):
            return name.split("= ", 1)[1], None, {}
        if train_keys == base_over and set(over) - set(train_keys):
            return base_name, base_over or None, {k: over[k] for k in over if k in PREDICTION_ONLY}
        return base_name, over or None, {}

    P.train_parallel([(r, quick, int(s), c, rows) for s in seeds for n, o in rows_plan for r, c, _ in [job(n, o, s)]])
    trained, times = {}, []
    for seed in seeds:
        for name, over in rows_plan:
            t0 = time.perf_counter()
            recipe, config, pred_only = job(name, over, seed)
            p = P.get(recipe, quick=quick, seed=int(seed), config=config, rows=rows)
            if pred_only:
                p = _variant(p, pred_only)
            trained[(name, int(seed))] = p
            times.append({"row": name, "seed": int(seed), "train_s": p.info.get("train_seconds", np.nan),
                         "this_call_s": time.perf_counter() - t0})
    return trained, pd.DataFrame(times)


def reduced_base_label(base_row: str, records: int | None) -> str:
    """The base row's label when every row trains on ``records`` raw records per op class: the base is then not the
    full-data recipe of the tables beside it (its MAPE differs from theirs), and its label says so."""
    return base_row if not records else f"{base_row}, trained on {int(records):,} records per class"


def ablation_caption(records: int | None, seeds, epochs: int | None = None) -> str:
    """The ablation table's heading: what its numbers are (pooled MAPE %, over which seeds) and what every row trained
    on (``records`` raw records per op class: CPU budget; None: the full data)."""
    seeds = [int(x) for x in seeds]
    over = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {', '.join(map(str, seeds))}"
    data = (f"every row, the base included, trained on the same random {int(records):,} raw records per op class "
            "(CPU budget), so its base row is not the full-data recipe of the tables above and its MAPE differs"
            if records else "every row trained on the full data")
    return (f"Pooled MAPE (%) over the Figure 7 / 8 cells and their unseen-GPU cells, mean and min-max over {over}; "
            f"{data}" + (f"; epochs capped at {int(epochs)}" if epochs else "") + ".")


def ablation_table(per_seed: pd.DataFrame, plan_rows, groups=R.HEADLINE_GROUPS[:3],
                   records: int | None = None) -> pd.DataFrame:
    """Rows in plan order, columns per group: mean, min, max over seeds and the change from the base. ``records``: the
    raw records per op class every row trained on (``train_ablation``'s ``rows``), written into the base row's label
    (``reduced_base_label``)."""
    s = R.seed_summary(per_seed)
    order = [r for r, _ in plan_rows]
    out = []
    base = s[s["predictor"] == order[0]].set_index("group")
    for r in order:
        d = s[s["predictor"] == r].set_index("group")
        row = {"row": reduced_base_label(r, records) if r == order[0] else r}
        for g in groups:
            if g in d.index:
                row[f"{g} mean"] = d.loc[g, "mean"]
                row[f"{g} min-max"] = f"{d.loc[g, 'min']:.1f}-{d.loc[g, 'max']:.1f}"
                row[f"{g} vs base"] = d.loc[g, "mean"] - base.loc[g, "mean"] if g in base.index else np.nan
        out.append(row)
    return pd.DataFrame(out)


# ---------------------------------------------------------------- epoch cut of the authors' recipe
def epoch_cut_table(meta: dict, cuts=(5, 10, 15, 20, 25, 30, 40, 50)) -> pd.DataFrame:
    """From one run's ``meta.json`` (``info.classes.<cls>.val_history``, validation MAPE after every
    epoch): the best validation MAPE within the first E epochs against the best of the whole run, per
    class. With a constant learning rate the first E epochs of a run are exactly an E-epoch run."""
    rows = []
    for cls, info in meta["info"]["classes"].items():
        h = np.asarray(info.get("val_history", []), float)
        if not len(h):
            continue
        full = float(np.nanmin(h))
        row = {"op_class": cls, "epochs_run": len(h), "best_all": full, "best_epoch": int(np.nanargmin(h))}
        for e in cuts:
            if e <= len(h):
                # epochs whose validation was not finite (a diverged network) are no candidates
                first = h[:e][np.isfinite(h[:e])]
                row[f"best_first_{e}"] = float(first.min()) if first.size else np.nan
        rows.append(row)
    return pd.DataFrame(rows)


def smallest_cut_per_class(meta: dict, points: float = 1.0) -> dict:
    """Per class, the smallest E whose best validation MAPE within the first E epochs is within ``points``
    of the best of the whole run (``meta.json`` of one uncut run; None for a class without history)."""
    out = {}
    for cls, info in meta["info"]["classes"].items():
        h = np.asarray(info.get("val_history", []), float)
        if not len(h) or not np.isfinite(h).any():
            out[cls] = None
            continue
        running = np.fmin.accumulate(np.where(np.isfinite(h), h, np.inf))
        out[cls] = int(np.flatnonzero(running - np.nanmin(h) <= points)[0]) + 1
    return out


def uncut_paper_folder(seed: int = 0, epochs: int = 100):
    """Where the uncut (``epochs``-epoch) run of the authors' recipe lives: the recipe's own folder when it
    trains that many epochs on every class, else the folder of the ``{"epochs": epochs}`` variant
    (``benchmarks/paper_epoch_cut.py`` makes it)."""
    from neusight_core.predictors.registry import hparams
    e = hparams("neusight-paper")["epochs"]
    uncut = all(v == epochs for v in e.values()) if isinstance(e, dict) else e == epochs
    return P.folder("neusight-paper", False, seed, None if uncut else {"epochs": epochs})


# ---------------------------------------------------------------- shapes held out of training
def shape_holdout_check(candidates, seeds=(0,), holdout: float = 0.3, quick: bool = False,
                        drop_gpu: str | None = None) -> pd.DataFrame:
    """How each candidate recipe predicts kernel shapes it never trained on, on the training GPUs only
    (the validation behind our recipe, docs/recipes.md; no end-to-end label, no unseen GPU).

    ``candidates``: [(label, recipe name, config overrides or None)]. The held-out set is a fixed random
    ``holdout`` share of the distinct shapes of the training GPUs' kernel test sets (transformer-derived,
    aligned), held out on every GPU; a recipe with ``extra_training: seen_test`` trains on the other shapes
    only (``extra_holdout``). ``drop_gpu`` (leave one GPU out): every candidate trains without that training
    GPU's records and is scored on its held-out shapes only, as if it were an unseen GPU.

    One row per (candidate, seed, device, op class): ``rows``, ``mape``, ``wmape`` (APE weighted by the
    measured time: the large kernels that dominate a model), ``bias_w`` (time-weighted signed error, %)."""
    from neusight_core.data import dataset
    held = dataset.seen_test_kernels(holdout, part="held_out")
    if drop_gpu:
        held = held[held["device"] == drop_gpu].reset_index(drop=True)
    rows = []
    for label, recipe, over in candidates:
        over = holdout_overrides(recipe, over, holdout, drop_gpu)
        for seed in seeds:
            p = P.get(recipe, quick=quick, seed=int(seed), config=over or None)
            pred = p.predict(held, None)
            y = held["latency_ms"].to_numpy(float)
            d = held.assign(ape=np.abs(pred / y - 1) * 100, err=pred - y)
            for (dev, cls), g in d.groupby(["device", "op_class"]):
                rows.append({"candidate": label, "seed": int(seed), "device": dev, "op_class": cls, "rows": len(g),
                             "mape": g["ape"].mean(),
                             "wmape": (g["ape"] * g["latency_ms"]).sum() / g["latency_ms"].sum(),
                             "bias_w": g["err"].sum() / g["latency_ms"].sum() * 100})
    return pd.DataFrame(rows)


def holdout_overrides(recipe: str, over: dict | None, holdout: float, drop_gpu: str | None = None) -> dict | None:
    """The config overrides under which ``recipe`` is trained for ``shape_holdout_check``."""
    over = dict(over or {})
    if P.create(recipe, 0, over).config.get("extra_training"):
        over["extra_holdout"] = holdout
    if drop_gpu:
        over["drop_gpu"] = drop_gpu
    return over or None


def shape_holdout_summary(per: pd.DataFrame, value: str = "wmape") -> pd.DataFrame:
    """Candidates x op class: ``value`` averaged over the training GPUs, mean and min-max over seeds."""
    g = per.groupby(["candidate", "seed", "op_class"], sort=False)[value].mean().reset_index()
    s = g.groupby(["candidate", "op_class"], sort=False)[value].agg(["mean", "min", "max"]).reset_index()
    s["cell"] = [f"{r['mean']:.1f} ({r['min']:.1f}-{r['max']:.1f})" for _, r in s.iterrows()]
    out = s.pivot(index="candidate", columns="op_class", values="cell")
    order = list(dict.fromkeys(per["candidate"]))
    return out.reindex(order)
