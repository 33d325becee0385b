"""The paper's figures and tables (Figures 7-10, Tables 6-8) rebuilt from a Tier 0 index (``evaluation``).

Table builders (``TABLES``) turn an index into the layout of the authors' ``summary/*.csv`` files.
They take the index and a ``predictors`` mapping (column key -> row label), and recompute every APE
from ``label_e2e_ms`` and ``pred_<key>_ms``, so an index whose ``pred_neusight_ms`` holds *our*
predictions (``evaluation.with_predictions``) gives our version of every figure and table.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from neusight_core.data import devices
from neusight_core import paths
from neusight_core.question import schema
from neusight_core.question.schema import Mode
from neusight_core.studies.evaluation import (FIGURE_PREDICTORS, KEY, MODEL_DISPLAY, MODEL_SEQ,
                                      PREDICTOR_DISPLAY, EvaluationError, LabelFileError, read_csv_columns, safe_ape)

# ------------------------------------------------------------------------------- table builders
@dataclass(frozen=True)
class FigureSpec:
    """A figure of per-configuration APE: GPU sections x (model, batch) columns."""
    name: str
    mode: str
    gpus: tuple
    headings: tuple  # ((model, (batch, ...)), ...)


FIG7 = FigureSpec("nvidia_inf", Mode.INF,
                  ("NVIDIA_H100_80GB_HBM3", "NVIDIA_L4", "NVIDIA_A100-PCIE-40GB", "Tesla_V100-PCIE-32GB",
                   "Tesla_P100-PCIE-16GB", "Tesla_T4", "Tesla_P4"),
                  (("bert_large", (8, 16)), ("gpt2_large", (4, 8)), ("gpt3_xl", (2, 8)), ("opt_13", (2, 8)),
                   ("gpt3_27", (2, 8)), ("switchxl4", (1, 2))))
FIG8 = FigureSpec("nvidia_train", Mode.TRAIN,
                  ("NVIDIA_H100_80GB_HBM3", "NVIDIA_L4", "NVIDIA_A100_80GB_PCIe", "Tesla_V100-PCIE-32GB"),
                  (("bert_large", (2, 8)), ("gpt2_large", (1, 4)), ("gpt3_xl", (1, 2)), ("opt_13", (1, 2)),
                   ("gpt3_27", (1, 2)), ("switchxl4", (1, 2))))
_AMD = ("AMD_Instinct_MI100", "AMD_Instinct_MI210", "AMD_Instinct_MI250")
FIG9_INF = FigureSpec("amd_inf", Mode.INF, _AMD, FIG7.headings[:5])
FIG9_TRAIN = FigureSpec("amd_train", Mode.TRAIN, _AMD, FIG8.headings[:5])
FIGURES = {f.name: f for f in (FIG7, FIG8, FIG9_INF, FIG9_TRAIN)}


def _pred_keys(predictors) -> dict:
    if predictors is None:
        return dict(FIGURE_PREDICTORS)
    if isinstance(predictors, str):
        return {predictors: PREDICTOR_DISPLAY.get(predictors, predictors)}
    if isinstance(predictors, dict):
        return dict(predictors)
    return {p: PREDICTOR_DISPLAY.get(p, p) for p in predictors}


def check_columns(index: pd.DataFrame, cols) -> None:
    missing = [c for c in cols if c not in index.columns]
    if missing:
        raise EvaluationError(f"index lacks column(s) {', '.join(missing)}")


def figure_cells(index: pd.DataFrame, figure: str, predictors=None) -> pd.DataFrame:
    """The cells of a figure in long form: gpu, gpu_short, model, model_display, batch, predictor,
    label_ms, pred_ms, ape. Only cells whose configuration has a label are returned (the others are
    blank in the paper); ``ape`` is NaN where the predictor has no prediction."""
    spec = FIGURES[figure]
    preds = _pred_keys(predictors if predictors is not None else
                       (FIGURE_PREDICTORS if spec.name.startswith("nvidia") else {"neusight": "NeuSight"}))
    check_columns(index, KEY + ["label_e2e_ms"] + [f"pred_{p}_ms" for p in preds])
    sel = index[(index["mode"] == spec.mode) & (index["option"] == "none") & index["gpu"].isin(spec.gpus)]
    rows = []
    for gpu in spec.gpus:
        for model, batches in spec.headings:
            for b in batches:
                hit = sel[(sel["gpu"] == gpu) & (sel["model"] == model) & (sel["batch"] == b)
                          & (sel["seq"] == MODEL_SEQ[model])]
                if hit.empty:
                    continue
                if len(hit) > 1:
                    raise EvaluationError(f"{figure}: {len(hit)} index rows for {gpu} {model} b{b}")
                r = hit.iloc[0]
                for p, disp in preds.items():
                    rows.append({"figure": figure, "gpu": gpu, "gpu_short": devices.short_name(gpu),
                                 "model": model, "model_display": MODEL_DISPLAY[model], "batch": b,
                                 "predictor": p, "predictor_display": disp,
                                 "label_ms": r["label_e2e_ms"], "pred_ms": r[f"pred_{p}_ms"],
                                 "ape": float(safe_ape([r["label_e2e_ms"]], [r[f"pred_{p}_ms"]])[0])})
    return pd.DataFrame(rows, columns=["figure", "gpu", "gpu_short", "model", "model_display", "batch",
                                       "predictor", "predictor_display", "label_ms", "pred_ms", "ape"])


def figure_columns(spec: FigureSpec) -> pd.MultiIndex:
    return pd.MultiIndex.from_tuples([(MODEL_DISPLAY[m], b) for m, bs in spec.headings for b in bs],
                                     names=["model", "batch"])


def _figure_table(index: pd.DataFrame, spec: FigureSpec, predictors) -> pd.DataFrame:
    """APE table in the authors' layout: rows (GPU, predictor), columns (model, batch)."""
    cells = figure_cells(index, spec.name, predictors)
    preds = _pred_keys(predictors)
    rows = pd.MultiIndex.from_tuples([(g, d) for g in spec.gpus for d in preds.values()],
                                     names=["gpu", "predictor"])
    out = pd.DataFrame(np.nan, index=rows, columns=figure_columns(spec))
    for c in cells.itertuples():
        out.loc[(c.gpu, c.predictor_display), (c.model_display, c.batch)] = c.ape
    return out


def table_nvidia_inf(index: pd.DataFrame, predictors=None) -> pd.DataFrame:
    """Figure 7: inference APE (%) per NVIDIA GPU and predictor (rows) x model and batch (columns)."""
    return _figure_table(index, FIG7, predictors)


def table_nvidia_train(index: pd.DataFrame, predictors=None) -> pd.DataFrame:
    """Figure 8: training APE (%) on H100, L4, A100-80GB, V100."""
    return _figure_table(index, FIG8, predictors)


def _amd_table(index: pd.DataFrame, spec: FigureSpec, predictors) -> pd.DataFrame:
    preds = _pred_keys(predictors if predictors is not None else {"neusight": "NeuSight"})
    t = _figure_table(index, spec, preds)
    if len(preds) == 1:  # the authors' layout: one row per GPU (short name), NeuSight only
        t.index = pd.Index([devices.short_name(g) for g in t.index.get_level_values("gpu")], name="gpu")
    return t


def table_amd_inf(index: pd.DataFrame, predictors=None) -> pd.DataFrame:
    """Figure 9 (inference): NeuSight APE (%) on MI100, MI210, MI250."""
    return _amd_table(index, FIG9_INF, predictors)


def table_amd_train(index: pd.DataFrame, predictors=None) -> pd.DataFrame:
    """Figure 9 (training): NeuSight APE (%) on MI100, MI210, MI250."""
    return _amd_table(index, FIG9_TRAIN, predictors)


def perop_population(index: pd.DataFrame, predictor: str = "neusight") -> pd.DataFrame:
    """Configurations of Table 6: plain NVIDIA configs of the authors' summary with a prediction of
    ``predictor`` (the authors filter on NeuSight having one)."""
    return index[(index["option"] == "none") & (index["vendor"] == "NVIDIA") & index["in_authors_summary"]
                 & index[f"pred_{predictor}_ms"].notna()]


def table_perop(index: pd.DataFrame, predictors=None, zero_label_as_zero: bool = True) -> pd.DataFrame:
    """Table 6: per-operator MAPE (%), rows predictor, columns (In/Out of Distribution, op class).

    Each cell is the mean over configurations of the APE of the op class's summed latency.
    ``zero_label_as_zero``: the authors' summarize.py turns the infinite APE of a configuration whose
    measured sum of an op class is 0 (and predicted is not) into 0 before averaging; True keeps their
    rule so the table can be compared, False leaves such configurations out."""
    preds = _pred_keys(predictors)
    check_columns(index, [f"pred_{p}_{op}_ms" for p in preds for op in schema.PAPER_CLASSES] + ["ood"])
    pop = perop_population(index)
    cols = pd.MultiIndex.from_tuples([(dist, schema.CLASS_LABEL[op]) for dist in ("In Distribution", "Out of Distribution")
                                      for op in schema.PAPER_CLASSES], names=["distribution", "op"])
    out = pd.DataFrame(np.nan, index=pd.Index(list(preds.values()), name="predictor"), columns=cols)
    for p, disp in preds.items():
        for ood, dist in ((False, "In Distribution"), (True, "Out of Distribution")):
            sub = pop[pop["ood"] == ood]
            for op in schema.PAPER_CLASSES:
                lab, pr = sub[f"label_{op}_ms"].to_numpy(float), sub[f"pred_{p}_{op}_ms"].to_numpy(float)
                a = safe_ape(lab, pr)
                if zero_label_as_zero:
                    a[(lab == 0) & (pr > 0)] = 0.0
                out.loc[disp, (dist, schema.CLASS_LABEL[op])] = np.nanmean(a) if np.isfinite(a).any() else np.nan
    return out


FUSION_GPUS = ("NVIDIA_L4", "NVIDIA_A100-PCIE-40GB", "NVIDIA_H100_80GB_HBM3")
FUSION_ROWS = (("bert_large", "BERT", 8), ("bert_large", "BERT", 16), ("gpt2_large", "GPT2-Large", 4),
               ("gpt2_large", "GPT2-Large", 8))


def fusion_cells(index: pd.DataFrame, predictor: str = "neusight") -> pd.DataFrame:
    """Table 7 cells in long form: gpu, model, batch, fused (bool), label_ms, pred_ms, ape."""
    check_columns(index, KEY + [f"pred_{predictor}_ms"])
    rows = []
    for gpu in FUSION_GPUS:
        for model, disp, b in FUSION_ROWS:
            for fused in (False, True):
                hit = index[(index["gpu"] == gpu) & (index["model"] == model) & (index["batch"] == b)
                            & (index["mode"] == Mode.INF) & (index["option"] == ("fusion" if fused else "none"))
                            & (index["seq"] == MODEL_SEQ[model])]
                if hit.empty:
                    continue
                r = hit.iloc[0]
                rows.append({"gpu": gpu, "gpu_short": devices.short_name(gpu), "model": model, "model_display": disp,
                             "batch": b, "fused": fused, "label_ms": r["label_e2e_ms"],
                             "pred_ms": r[f"pred_{predictor}_ms"],
                             "ape": float(safe_ape([r["label_e2e_ms"]], [r[f"pred_{predictor}_ms"]])[0])})
    return pd.DataFrame(rows)


QUANTITIES = ("Measured Latency (ms)", "Prediction (ms)", "APE (%)")


def table_fusion_inf(index: pd.DataFrame, predictor: str = "neusight") -> pd.DataFrame:
    """Table 7 (operator fusion): rows (model, batch, quantity), columns (GPU, Non-fused/Fused).
    The authors print prediction and APE in one cell, ``pred (APE%)``; here they are two rows."""
    cells = fusion_cells(index, predictor)
    cols = pd.MultiIndex.from_tuples([(devices.short_name(g), f) for g in FUSION_GPUS for f in ("Non-fused", "Fused")],
                                     names=["gpu", "fusion"])
    rows = pd.MultiIndex.from_tuples([(d, f"batch={b}", q) for _, d, b in FUSION_ROWS for q in QUANTITIES],
                                     names=["model", "batch", "quantity"])
    out = pd.DataFrame(np.nan, index=rows, columns=cols)
    for c in cells.itertuples():
        col = (c.gpu_short, "Fused" if c.fused else "Non-fused")
        for q, v in zip(QUANTITIES, (c.label_ms, c.pred_ms, c.ape)):
            out.loc[(c.model_display, f"batch={c.batch}", q), col] = v
    return out


DIST_GPUS = (("A100x4", "NVIDIA_A100-SXM4-40GB"), ("H100x4", "NVIDIA_H100_80GB_HBM3"))
DIST_ROWS = (("gpt2_large", "GPT2-Large", 4), ("gpt2_large", "GPT2-Large", 16), ("gpt3_xl", "GPT3-XL", 4))
DIST_OPTIONS = (("dp4", "DP"), ("tp4", "TP"), ("pp4_1", "PP"))


def distributed_cells(index: pd.DataFrame, predictor: str = "neusight") -> pd.DataFrame:
    """Table 8 cells in long form: system, gpu, model, batch, parallel, label_ms, pred_ms, ape."""
    check_columns(index, KEY + [f"pred_{predictor}_ms"])
    rows = []
    for system, gpu in DIST_GPUS:
        for model, disp, b in DIST_ROWS:
            for opt, par in DIST_OPTIONS:
                hit = index[(index["gpu"] == gpu) & (index["model"] == model) & (index["batch"] == b)
                            & (index["mode"] == Mode.TRAIN) & (index["option"] == opt)]
                if hit.empty:
                    continue
                r = hit.iloc[0]
                rows.append({"system": system, "gpu": gpu, "model": model, "model_display": disp, "batch": b,
                             "parallel": par, "label_ms": r["label_e2e_ms"], "pred_ms": r[f"pred_{predictor}_ms"],
                             "ape": float(safe_ape([r["label_e2e_ms"]], [r[f"pred_{predictor}_ms"]])[0])})
    return pd.DataFrame(rows)


def table_distributed(index: pd.DataFrame, predictor: str = "neusight") -> pd.DataFrame:
    """Table 8 (4-GPU DP/TP/PP): rows (model, global batch, quantity), columns (system, DP/TP/PP)."""
    cells = distributed_cells(index, predictor)
    cols = pd.MultiIndex.from_tuples([(s, par) for s, _ in DIST_GPUS for _, par in DIST_OPTIONS],
                                     names=["system", "parallel"])
    rows = pd.MultiIndex.from_tuples([(d, b, q) for _, d, b in DIST_ROWS for q in QUANTITIES],
                                     names=["model", "global_batch", "quantity"])
    out = pd.DataFrame(np.nan, index=rows, columns=cols)
    for c in cells.itertuples():
        for q, v in zip(QUANTITIES, (c.label_ms, c.pred_ms, c.ape)):
            out.loc[(c.model_display, c.batch, q), (c.system, c.parallel)] = v
    return out


def load_fp16mm(path: str | Path | None = None) -> pd.DataFrame:
    """The release's FP16 tensor-core BMM measurements on H100 (Figure 10): B, M, N, K, label_ms,
    pred_ms (the authors' NeuSight prediction) and ``authors_ape`` (their ``err`` column x 100)."""
    p = Path(path) if path else paths.release_dir() / "fp16mm.csv"
    df = read_csv_columns(p, None)
    need = ["B", "M", "N", "K", "Latency", "pred", "err"]
    if any(c not in df.columns for c in need):
        raise LabelFileError(f"{p}: expected columns {', '.join(need)}, got {', '.join(map(str, df.columns))}")
    return pd.DataFrame({"B": df["B"], "M": df["M"], "N": df["N"], "K": df["K"], "label_ms": df["Latency"],
                         "pred_ms": df["pred"], "authors_ape": df["err"] * 100.0})


def table_fp16mm(fp16: pd.DataFrame) -> pd.DataFrame:
    """Figure 10: per BMM shape, measured and predicted latency (ms) and APE (%) recomputed."""
    check_columns(fp16, ["B", "M", "N", "K", "label_ms", "pred_ms"])
    out = fp16[["B", "M", "N", "K", "label_ms", "pred_ms"]].copy()
    out["ape"] = safe_ape(out["label_ms"], out["pred_ms"])
    out.index = pd.Index([f"{r.B}x{r.M}x{r.N}x{r.K}" for r in out.itertuples()], name="shape (BxMxNxK)")
    return out


TABLES = {
    "nvidia_inf": table_nvidia_inf,      # Figure 7
    "nvidia_train": table_nvidia_train,  # Figure 8
    "amd_inf": table_amd_inf,            # Figure 9
    "amd_train": table_amd_train,        # Figure 9
    "perop": table_perop,                # Table 6 (inferred number)
    "fusion_inf": table_fusion_inf,      # Table 7 (inferred number)
    "distributed": table_distributed,    # Table 8
}
PAPER_ITEM = {"nvidia_inf": "Figure 7", "nvidia_train": "Figure 8", "amd_inf": "Figure 9 (inference)",
              "amd_train": "Figure 9 (training)", "perop": "Table 6", "fusion_inf": "Table 7",
              "distributed": "Table 8", "fp16mm": "Figure 10"}
#: what the numbers of each table above are (metric, unit, what a row and a column are), for its title line in a
#: notebook's tables/ (the flattened CSV's column names alone do not say APE or ms)
TABLE_CONTENT = {
    "nvidia_inf": "inference APE (%) per NVIDIA GPU and predictor (rows) x model and batch (columns)",
    "nvidia_train": "training APE (%) per NVIDIA GPU and predictor (rows) x model and batch (columns)",
    "amd_inf": "inference APE (%) of NeuSight per AMD GPU (rows) x model and batch (columns)",
    "amd_train": "training APE (%) of NeuSight per AMD GPU (rows) x model and batch (columns)",
    "perop": "per-operator MAPE (%) per predictor: mean over configurations of the APE of each op class's summed "
             "latency, in / out of distribution",
    "fusion_inf": "measured and NeuSight-predicted inference latency (ms) and APE (%) per model, batch and GPU, "
                  "non-fused / fused",
    "distributed": "measured and NeuSight-predicted 4-GPU training step latency (ms) and APE (%) per model, global batch, "
                   "system and DP / TP / PP",
    "fp16mm": "FP16 tensor-core BMM on H100 per shape: measured (label_ms) and NeuSight-predicted (pred_ms) latency (ms), "
              "APE (%)",
}


def table_title(name: str, predictions: str) -> str:
    """The title line of table ``name``; ``predictions`` says whose, e.g. "the authors' shipped predictions"."""
    return f"{PAPER_ITEM[name]} from {predictions}: {TABLE_CONTENT[name]}"


def build_tables(index: pd.DataFrame, fp16: pd.DataFrame | None = None) -> dict:
    """Every table of Tier 0 from one index (and the FP16 frame for Figure 10, if given)."""
    out = {name: fn(index) for name, fn in TABLES.items()}
    if fp16 is not None:
        out["fp16mm"] = table_fp16mm(fp16)
    return out


def flatten_table(table: pd.DataFrame) -> pd.DataFrame:
    """A table with MultiIndex rows/columns as a flat frame (for CSV/Markdown output)."""
    t = table.copy()
    if isinstance(t.columns, pd.MultiIndex):
        fig = list(t.columns.names) == ["model", "batch"]
        t.columns = [f"{c[0]} b{c[1]}" if fig else " / ".join(str(x) for x in c) for c in t.columns]
    return t.reset_index()
