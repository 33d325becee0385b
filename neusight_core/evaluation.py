"""Tier 0: the tidy index of every labelled configuration, and the paper's tables rebuilt from it.

The index is read from the raw files of the authors' release, never from their ``summary.csv``:

* ``labels/<GPU>/<config>.json``                     measured latency (one file = one index row)
* ``labels/<GPU>/<config>.csv``                      measured latency per traced node (where shipped)
* ``artifacts/release/results/prediction/<GPU>/<predictor>/<config>.{json,csv}``   predictions
* ``artifacts/release/results/opgraph/<config>.csv``  op class (``OpName``) of every traced node

``<config>`` is ``<model>-<inf|train>-<seq>-<batch>[-fusion|-dp4|-tp4|-pp4_1]``.

Index columns (one row per label JSON)
--------------------------------------
=====================  ==============================================================================
gpu                    release GPU id (folder name), e.g. ``NVIDIA_H100_80GB_HBM3``
gpu_short              short name used in the paper's tables (``H100``, ``A100-40GB``, ``MI250``, ...)
vendor                 ``NVIDIA`` | ``AMD``
model                  release model id (``bert_large``, ``gpt2_large``, ``gpt3_xl``, ``gpt3_27``,
                       ``opt_13``, ``switchxl4``, ``switch4``)
model_display          the paper's name (``BERT-Large``, ``GPT3-2.7B``, ``SwitchTrans``, ...)
mode                   ``inf`` | ``train``
seq, batch             sequence length, (global) batch size
option                 ``none`` | ``fusion`` | ``dp4`` | ``tp4`` | ``pp4_1``
config                 the file stem, e.g. ``gpt2_large-train-1024-4-dp4``
num_layer              ``num_layer`` of the label JSON (0 for the distributed labels, -1 where null)
label_e2e_ms           measured end-to-end latency (``e2e_latency``)
label_fw_ms            measured forward latency (``fw_latency``; 0 where the authors did not split)
label_bw_ms            measured backward latency (``bwall_latency``: backward incl. accumulation)
pred_<p>_ms            predictor ``p``'s end-to-end prediction (``e2e_latency`` of its JSON), NaN if
                       the release has none; ``p`` in :data:`PREDICTORS`. ``li`` is Li et al.
                       (MICRO'23), the release's ``micro`` folder.
ape_<p>                APE of ``pred_<p>_ms`` against ``label_e2e_ms`` in %
ood_gpu                the GPU is one of the unseen ones (H100, L4, A100-80GB; MI250 for AMD)
ood_model              the model is one of the out-of-distribution ones (GPT3-XL, GPT3-2.7B, OPT-1.3B)
ood                    ``ood_gpu or ood_model`` with the authors' NVIDIA GPU list (their Table 6 split)
in_authors_summary     the authors' ``summary.csv`` has this configuration (it only lists configs that
                       have an op graph; three labelled Switch configs have none)
has_per_op             measured per-op sums are available (plain configuration with a per-node
                       label CSV and an op graph). The release lacks the per-node label CSVs of
                       the Switch Transformer configurations (its ABSENT.txt), so these have none.
label_<OP>_ms          measured latency summed over the nodes of op class ``OP``
pred_<p>_<OP>_ms       predictor ``p``'s latency summed over the nodes of op class ``OP`` (plain
                       configurations whose per-node prediction CSV is shipped)
ape_<p>_<OP>           APE of the two (NaN where the measured sum is 0)
=====================  ==============================================================================

``OP`` is one of :data:`OP_CLASSES` (``BMM``, ``LINEAR`` = FC, ``VEC`` = element-wise,
``SOFTMAX``, ``LAYERNORM``), mapped from the authors' ``OpName`` exactly as their ``summarize.py``
does: ``BMM``, ``Linear``, any ``VEC*`` except softmax/layernorm, ``VECsoftmax*``, ``VECln*``.
Like the authors, the per-node traces hold one transformer block that is counted ``num_layer``
times (Switch Transformer traces are complete and are not replicated).

Table builders (``TABLES``) turn an index into the layout of the authors' ``summary/*.csv`` files.
They take the index and a ``predictors`` mapping (column key -> row label), and recompute every APE
from ``label_e2e_ms`` and ``pred_<key>_ms``, so an index whose ``pred_neusight_ms`` holds *our*
predictions (see :func:`with_predictions`) gives our version of every figure and table.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from . import paths, report
from . import devices, registry, schema

PREDICTORS = ("neusight", "roofline", "habitat", "li")
# Release folder name of each predictor (Li et al. ships as "micro").
RELEASE_PREDICTOR_DIR = {"neusight": "neusight", "roofline": "roofline", "habitat": "habitat", "li": "micro"}
# Row order and names of the authors' figures (the release's predictors).
FIGURE_PREDICTORS = {"roofline": "Roofline", "habitat": "Habitat", "li": "Li et al.", "neusight": "NeuSight"}
# Display names in the paper's tables: the figures' names for the release's four predictors (our re-implementation
# of each is shown under the same name next to the authors' column), the registry's label for the others.
PREDICTOR_DISPLAY = {**{n: registry.label(n) for n in registry.names()}, **FIGURE_PREDICTORS}

OP_CLASSES = schema.PAPER_CLASSES   # the columns of the release's tables

OPTIONS = ("none", "fusion", "dp4", "tp4", "pp4_1")
MODES = ("inf", "train")

GPU_SHORT = {
    "NVIDIA_H100_80GB_HBM3": "H100",
    "NVIDIA_L4": "L4",
    "NVIDIA_A100-PCIE-40GB": "A100-40GB",
    "NVIDIA_A100_80GB_PCIe": "A100-80GB",
    "NVIDIA_A100-SXM4-40GB": "A100x4",
    "Tesla_V100-PCIE-32GB": "V100",
    "Tesla_P100-PCIE-16GB": "P100",
    "Tesla_T4": "T4",
    "Tesla_P4": "P4",
    "AMD_Instinct_MI100": "MI100",
    "AMD_Instinct_MI210": "MI210",
    "AMD_Instinct_MI250": "MI250",
}
# Unseen GPUs (SPEC section 4); the authors' Table 6 uses the NVIDIA three.
OOD_MODELS = ("gpt3_xl", "gpt3_27", "opt_13")

MODEL_DISPLAY = {
    "bert_large": "BERT-Large", "gpt2_large": "GPT2-Large", "gpt3_xl": "GPT3-XL", "opt_13": "OPT-1.3B",
    "gpt3_27": "GPT3-2.7B", "switchxl4": "SwitchTrans", "switch4": "SwitchTrans-4",
}
# Sequence length of each model in the figures (the A100-40GB also has Switch at 2048, not in Fig. 7).
MODEL_SEQ = {"bert_large": 512, "gpt2_large": 1024, "gpt3_xl": 2048, "opt_13": 2048, "gpt3_27": 2048,
             "switchxl4": 512}

# First and last node of the traced transformer block that the authors replicate num_layer times.
_LAYER_MARKERS = {
    "bert": ("bert_encoder_layer_0_attention_self_query", "bert_encoder_layer_0_output_layer_norm"),
    "gpt": ("transformer_h_0_ln_1", "add_15"),
    "opt": ("model_decoder_layers_0_self_attn_layer_norm", "view_11"),
}

_CONFIG_RE = re.compile(r"^(?P<model>[a-z0-9_]+)-(?P<mode>inf|train)-(?P<seq>\d+)-(?P<batch>\d+)(?:-(?P<option>[a-z0-9_]+))?$")


class EvaluationError(ValueError):
    """Bad or missing input for the Tier-0 evaluation; the message names the file or value."""


class LabelFileError(EvaluationError):
    """A label or prediction file that cannot be read; the message names the file."""


# ---------------------------------------------------------------------------------------- index
def parse_config_name(stem: str) -> dict:
    """``gpt2_large-train-1024-4-dp4`` -> model, mode, seq, batch, option ('none' when absent)."""
    m = _CONFIG_RE.match(stem)
    if not m:
        raise EvaluationError(f"configuration name {stem!r} is not <model>-<inf|train>-<seq>-<batch>[-option]")
    option = m["option"] or "none"
    if option not in OPTIONS:
        raise EvaluationError(f"configuration {stem!r}: unknown option {option!r} (known: {', '.join(OPTIONS)})")
    return {"model": m["model"], "mode": m["mode"], "seq": int(m["seq"]), "batch": int(m["batch"]),
            "option": option}


def _read_latency_json(path: Path, keys: tuple[str, ...], nullable: tuple[str, ...] = ()) -> dict:
    """Read a label/prediction JSON; any defect becomes one LabelFileError line naming the file.
    Keys in ``nullable`` may be JSON null (read as NaN)."""
    try:
        body = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise LabelFileError(f"{path}: cannot read ({e.__class__.__name__}: {e})") from None
    except json.JSONDecodeError as e:
        raise LabelFileError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    if not isinstance(body, dict):
        raise LabelFileError(f"{path}: expected a JSON object with {', '.join(keys)}, got {type(body).__name__}")
    out = {}
    for k in keys:
        if k not in body:
            raise LabelFileError(f"{path}: missing key {k!r}")
        v = body[k]
        if v is None and k in nullable:
            out[k] = np.nan
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise LabelFileError(f"{path}: {k!r} must be a finite non-negative number, got {v!r}")
        out[k] = float(v)
    return out


def _replicated_sum(trace: pd.DataFrame, model: str, n_layer: int, value_col: str) -> pd.Series:
    """Latency per OpName of the whole model from a one-block trace (block counted n_layer times)."""
    weight = np.ones(len(trace))
    if n_layer > 0 and "switch" not in model:
        for family, (first, last) in _LAYER_MARKERS.items():
            if family in model:
                names = trace["Name"].to_numpy()
                starts, ends = np.flatnonzero(names == first), np.flatnonzero(names == last)
                if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
                    raise EvaluationError(f"trace of {model}: cannot find its block ({first} .. {last})")
                weight[starts[0]:ends[0] + 1] = n_layer
                break
        else:
            raise EvaluationError(f"no transformer-block markers known for model {model!r}")
    lat = pd.to_numeric(trace[value_col], errors="coerce").fillna(0.0).to_numpy() * weight
    return pd.Series(lat, index=trace.index).groupby(trace["OpName"]).sum()


def _op_class_sums(per_opname: pd.Series) -> dict:
    """Authors' op classes from OpName sums (summarize.py: VEC excludes softmax and layernorm)."""
    names = per_opname.index.astype(str)
    masks = {
        "BMM": names == "BMM",
        "LINEAR": names == "Linear",
        "VEC": names.str.contains(r"VEC(?!softmax|ln$)", regex=True),
        "SOFTMAX": names.str.match("VECsoftmax"),
        "LAYERNORM": names.str.match("VECln"),
    }
    return {op: float(per_opname[np.asarray(m)].sum()) for op, m in masks.items()}


def _read_csv(path: Path, usecols) -> pd.DataFrame:
    try:
        return pd.read_csv(path, usecols=usecols)
    except (ValueError, pd.errors.ParserError, OSError, UnicodeDecodeError) as e:
        raise LabelFileError(f"{path}: cannot read per-node CSV ({str(e).splitlines()[0]})") from None


def _per_op(gpu: str, stem: str, model: str, n_layer: int, labels: Path, preds: Path, graphs: Path) -> dict:
    """Per-op-class sums of the label (needs its per-node CSV and the op graph) and of each
    predictor (needs its per-node CSV); only what is shipped."""
    out = {}
    label_csv, graph_csv = labels / gpu / f"{stem}.csv", graphs / f"{stem}.csv"
    if label_csv.is_file() and graph_csv.is_file():
        label = _read_csv(label_csv, ["Name", "latency"])
        graph = _read_csv(graph_csv, ["Name", "OpName"])
        label = label.merge(graph, on="Name", how="left")  # op class of each measured node
        out["has_per_op"] = True
        for op, v in _op_class_sums(_replicated_sum(label, model, n_layer, "latency")).items():
            out[f"label_{op}_ms"] = v
    for p in PREDICTORS:
        pcsv = preds / gpu / RELEASE_PREDICTOR_DIR[p] / f"{stem}.csv"
        if pcsv.is_file():
            trace = _read_csv(pcsv, ["Name", "OpName", "e2e_latency"])
            for op, v in _op_class_sums(_replicated_sum(trace, model, n_layer, "e2e_latency")).items():
                out[f"pred_{p}_{op}_ms"] = v
    return out


def safe_ape(label, pred) -> np.ndarray:
    """APE in %; NaN where the label is missing or 0 (no relative error exists) or pred missing."""
    return np.atleast_1d(report.ape(label, pred, nonpositive="nan"))


def build_index(labels_dir: str | Path | None = None, predictions_dir: str | Path | None = None,
                opgraph_dir: str | Path | None = None, per_op: bool = True, progress: bool = True) -> pd.DataFrame:
    """The tidy index (columns in the module docstring), one row per ``labels/<GPU>/*.json``."""
    labels = Path(labels_dir) if labels_dir else paths.labels_dir()
    preds = Path(predictions_dir) if predictions_dir else paths.predictions_dir()
    graphs = Path(opgraph_dir) if opgraph_dir else paths.opgraph_dir()
    if not labels.is_dir():
        raise EvaluationError(f"label folder {labels} does not exist (run `python -m neusight_core.release`)")
    files = sorted(labels.glob("*/*.json"))
    if not files:
        raise EvaluationError(f"no label files <GPU>/<config>.json under {labels}")
    graph_stems = {p.stem for p in graphs.glob("*.csv")} if graphs.is_dir() else set()

    it = files
    if progress:
        from tqdm import tqdm  # plain text bar: no ipywidgets needed in the notebooks
        it = tqdm(files, desc="index", unit="config")
    rows = []
    for f in it:
        gpu, stem = f.parent.name, f.stem
        try:
            cfg = parse_config_name(stem)
        except EvaluationError as e:
            raise LabelFileError(f"{f}: {e}") from None
        # num_layer is null in the two A100-40GB Switch labels at sequence 2048.
        lab = _read_latency_json(f, ("e2e_latency", "fw_latency", "bwall_latency", "num_layer"),
                                 nullable=("num_layer",))
        if lab["e2e_latency"] <= 0:
            raise LabelFileError(f"{f}: 'e2e_latency' must be positive, got {lab['e2e_latency']!r}")
        row = {
            "gpu": gpu, "gpu_short": GPU_SHORT.get(gpu, gpu),
            "vendor": "AMD" if gpu.startswith("AMD") else "NVIDIA",
            **cfg, "model_display": MODEL_DISPLAY.get(cfg["model"], cfg["model"]), "config": stem,
            "num_layer": -1 if np.isnan(lab["num_layer"]) else int(lab["num_layer"]),
            "label_e2e_ms": lab["e2e_latency"], "label_fw_ms": lab["fw_latency"],
            "label_bw_ms": lab["bwall_latency"],
        }
        for p in PREDICTORS:
            pj = preds / gpu / RELEASE_PREDICTOR_DIR[p] / f"{stem}.json"
            row[f"pred_{p}_ms"] = (_read_latency_json(pj, ("e2e_latency",))["e2e_latency"]
                                   if pj.is_file() else np.nan)
        row["in_authors_summary"] = stem in graph_stems
        row["has_per_op"] = False
        # Per-op sums only for plain configurations, as in the authors' Table 6.
        if per_op and cfg["option"] == "none":
            row.update(_per_op(gpu, stem, cfg["model"], row["num_layer"], labels, preds, graphs))
        rows.append(row)

    df = pd.DataFrame(rows)
    # unseen GPUs from the catalogue (``unseen: true`` in devices.yaml); the paper's "ood" split is NVIDIA's
    unseen = {g: devices.get_device(g) for g in df["gpu"].unique()}
    df["ood_gpu"] = df["gpu"].map(lambda g: unseen[g].unseen)
    df["ood_model"] = df["model"].isin(OOD_MODELS)
    df["ood"] = df["ood_model"] | df["gpu"].map(lambda g: unseen[g].unseen and unseen[g].vendor == "NVIDIA")
    for col in [f"label_{op}_ms" for op in OP_CLASSES] + [f"pred_{p}_{op}_ms" for p in PREDICTORS for op in OP_CLASSES]:
        if col not in df:
            df[col] = np.nan
    return _add_apes(df)


def _add_apes(df: pd.DataFrame) -> pd.DataFrame:
    """(Re)compute every ape_* column from the label and pred_* columns present."""
    df = df.copy()
    for col in [c for c in df.columns if re.fullmatch(r"pred_[a-z0-9-]+_ms", c)]:
        p = col[len("pred_"):-len("_ms")]
        df[f"ape_{p}"] = safe_ape(df["label_e2e_ms"], df[col])
        for op in OP_CLASSES:
            if f"pred_{p}_{op}_ms" in df and f"label_{op}_ms" in df:
                df[f"ape_{p}_{op}"] = safe_ape(df[f"label_{op}_ms"], df[f"pred_{p}_{op}_ms"])
    return df


KEY = ["gpu", "model", "mode", "seq", "batch", "option"]


def with_predictions(index: pd.DataFrame, predictions: pd.DataFrame, predictor: str = "neusight",
                     column: str = "e2e_ms", per_op_columns: dict | None = None) -> pd.DataFrame:
    """Index with ``pred_<predictor>_ms`` replaced by ``predictions[column]`` (joined on gpu, model,
    mode, seq, batch, option); configurations missing from ``predictions`` get NaN. ``predictor``
    may also be a new key (e.g. ``"ours"``) to put our numbers next to the authors'.
    ``per_op_columns`` maps op class -> column of ``predictions`` holding its per-op sum."""
    missing = [k for k in KEY + [column] if k not in predictions.columns]
    if missing:
        raise EvaluationError(f"predictions frame lacks column(s) {', '.join(missing)}")
    if predictions.duplicated(KEY).any():
        dup = predictions[predictions.duplicated(KEY, keep=False)][KEY].head(3).to_dict("records")
        raise EvaluationError(f"predictions frame has duplicate configurations, e.g. {dup}")
    cols = {column: f"pred_{predictor}_ms"}
    for op, c in (per_op_columns or {}).items():
        cols[c] = f"pred_{predictor}_{op}_ms"
    sub = predictions[KEY + list(cols)].rename(columns=cols)
    out = index.drop(columns=[c for c in cols.values() if c in index.columns]).merge(sub, on=KEY, how="left")
    return _add_apes(out)


def index_counts(index: pd.DataFrame) -> pd.DataFrame:
    """Number of labelled configurations per GPU and mode (for the count check against the files)."""
    return index.groupby(["gpu", "mode"]).size().unstack(fill_value=0)


def fill_per_op_from_authors_summary(index: pd.DataFrame, summary_csv: str | Path | None = None) -> pd.DataFrame:
    """DIAGNOSTIC ONLY: copy the authors' per-op label sums from their ``summary.csv`` into the rows
    whose per-node label CSV is not in the release (the Switch configurations), to check that this
    is the only reason Table 6 differs. Returns a new index with ``per_op_source`` =
    ``raw`` | ``authors_summary``; the Tier-0 tables are never built from it."""
    p = Path(summary_csv) if summary_csv else paths.summary_dir() / "summary.csv"
    cols = {f"label_{'Linear' if op == 'LINEAR' else 'VECsoftmax' if op == 'SOFTMAX' else 'VECln' if op == 'LAYERNORM' else op}_e2e_latency": f"label_{op}_ms"
            for op in OP_CLASSES}
    s = pd.read_csv(p, usecols=["model_name", "mode", "seqlen", "batch", "device", "option", *cols])
    s = s.rename(columns={"model_name": "model", "seqlen": "seq", "device": "gpu", **cols})
    s["option"] = s["option"].fillna("none")
    out = index.copy()
    out["per_op_source"] = np.where(out["has_per_op"], "raw", "")
    m = out.merge(s, on=KEY, how="left", suffixes=("", "_authors"))
    fill = (~out["has_per_op"]) & (out["option"] == "none") & m["label_BMM_ms_authors"].notna().to_numpy()
    for op in OP_CLASSES:
        out.loc[fill, f"label_{op}_ms"] = m.loc[fill.to_numpy(), f"label_{op}_ms_authors"].to_numpy()
    out.loc[fill, "per_op_source"] = "authors_summary"
    return _add_apes(out)


# ------------------------------------------------------------------------------- table builders
@dataclass(frozen=True)
class FigureSpec:
    """A figure of per-configuration APE: GPU sections x (model, batch) columns."""
    name: str
    mode: str
    gpus: tuple
    headings: tuple  # ((model, (batch, ...)), ...)


FIG7 = FigureSpec("nvidia_inf", "inf",
                  ("NVIDIA_H100_80GB_HBM3", "NVIDIA_L4", "NVIDIA_A100-PCIE-40GB", "Tesla_V100-PCIE-32GB",
                   "Tesla_P100-PCIE-16GB", "Tesla_T4", "Tesla_P4"),
                  (("bert_large", (8, 16)), ("gpt2_large", (4, 8)), ("gpt3_xl", (2, 8)), ("opt_13", (2, 8)),
                   ("gpt3_27", (2, 8)), ("switchxl4", (1, 2))))
FIG8 = FigureSpec("nvidia_train", "train",
                  ("NVIDIA_H100_80GB_HBM3", "NVIDIA_L4", "NVIDIA_A100_80GB_PCIe", "Tesla_V100-PCIE-32GB"),
                  (("bert_large", (2, 8)), ("gpt2_large", (1, 4)), ("gpt3_xl", (1, 2)), ("opt_13", (1, 2)),
                   ("gpt3_27", (1, 2)), ("switchxl4", (1, 2))))
_AMD = ("AMD_Instinct_MI100", "AMD_Instinct_MI210", "AMD_Instinct_MI250")
FIG9_INF = FigureSpec("amd_inf", "inf", _AMD, FIG7.headings[:5])
FIG9_TRAIN = FigureSpec("amd_train", "train", _AMD, FIG8.headings[:5])
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
                    rows.append({"figure": figure, "gpu": gpu, "gpu_short": GPU_SHORT.get(gpu, gpu),
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
        t.index = pd.Index([GPU_SHORT[g] for g in t.index.get_level_values("gpu")], name="gpu")
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
    check_columns(index, [f"pred_{p}_{op}_ms" for p in preds for op in OP_CLASSES] + ["ood"])
    pop = perop_population(index)
    cols = pd.MultiIndex.from_tuples([(dist, schema.CLASS_LABEL[op]) for dist in ("In Distribution", "Out of Distribution")
                                      for op in OP_CLASSES], names=["distribution", "op"])
    out = pd.DataFrame(np.nan, index=pd.Index(list(preds.values()), name="predictor"), columns=cols)
    for p, disp in preds.items():
        for ood, dist in ((False, "In Distribution"), (True, "Out of Distribution")):
            sub = pop[pop["ood"] == ood]
            for op in OP_CLASSES:
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
                            & (index["mode"] == "inf") & (index["option"] == ("fusion" if fused else "none"))
                            & (index["seq"] == MODEL_SEQ[model])]
                if hit.empty:
                    continue
                r = hit.iloc[0]
                rows.append({"gpu": gpu, "gpu_short": GPU_SHORT[gpu], "model": model, "model_display": disp,
                             "batch": b, "fused": fused, "label_ms": r["label_e2e_ms"],
                             "pred_ms": r[f"pred_{predictor}_ms"],
                             "ape": float(safe_ape([r["label_e2e_ms"]], [r[f"pred_{predictor}_ms"]])[0])})
    return pd.DataFrame(rows)


QUANTITIES = ("Measured Latency (ms)", "Prediction (ms)", "APE (%)")


def table_fusion_inf(index: pd.DataFrame, predictor: str = "neusight") -> pd.DataFrame:
    """Table 7 (operator fusion): rows (model, batch, quantity), columns (GPU, Non-fused/Fused).
    The authors print prediction and APE in one cell, ``pred (APE%)``; here they are two rows."""
    cells = fusion_cells(index, predictor)
    cols = pd.MultiIndex.from_tuples([(GPU_SHORT[g], f) for g in FUSION_GPUS for f in ("Non-fused", "Fused")],
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
                            & (index["mode"] == "train") & (index["option"] == opt)]
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
    df = _read_csv(p, None)
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
