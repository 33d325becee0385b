"""Tier 0: the tidy index of every labelled configuration (the paper's tables built from it: ``paper_tables``).

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
                       the release has none; ``p`` in :data:`RELEASE_PREDICTORS`. ``li`` is Li et al.
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

``OP`` is one of :data:`schema.PAPER_CLASSES` (``BMM``, ``LINEAR`` = FC, ``VEC`` = element-wise,
``SOFTMAX``, ``LAYERNORM``), mapped from the authors' ``OpName`` exactly as their ``summarize.py``
does: ``BMM``, ``Linear``, any ``VEC*`` except softmax/layernorm, ``VECsoftmax*``, ``VECln*``.
Like the authors, the per-node traces hold one transformer block that is counted ``num_layer``
times (Switch Transformer traces are complete and are not replicated).

The paper's tables built from an index are in ``paper_tables`` (``paper_tables.TABLES``).
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from neusight_core import paths
from neusight_core.studies import error_metric
from neusight_core.data import devices
from neusight_core.predictors import registry
from neusight_core.question import schema
from neusight_core.question.schema import OpClass

RELEASE_PREDICTORS = ("neusight", "roofline", "habitat", "li")
# Release folder name of each predictor (Li et al. ships as "micro").
RELEASE_PREDICTOR_DIR = {"neusight": "neusight", "roofline": "roofline", "habitat": "habitat", "li": "micro"}
# Row order and names of the authors' figures (the release's predictors).
FIGURE_PREDICTORS = {"roofline": "Roofline", "habitat": "Habitat", "li": "Li et al.", "neusight": "NeuSight"}
# Display names in the paper's tables: the figures' names for the release's four predictors (our re-implementation
# of each is shown under the same name next to the authors' column), the registry's label for the others.
PREDICTOR_DISPLAY = {**{n: registry.label(n) for n in registry.names()}, **FIGURE_PREDICTORS}


OPTIONS = ("none", "fusion", "dp4", "tp4", "pp4_1")

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
        OpClass.BMM: names == OpClass.BMM,
        OpClass.LINEAR: names == "Linear",
        OpClass.VEC: names.str.contains(r"VEC(?!softmax|ln$)", regex=True),
        OpClass.SOFTMAX: names.str.match("VECsoftmax"),
        OpClass.LAYERNORM: names.str.match("VECln"),
    }
    return {op: float(per_opname[np.asarray(m)].sum()) for op, m in masks.items()}


def read_csv_columns(path: Path, usecols) -> pd.DataFrame:
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
        label = read_csv_columns(label_csv, ["Name", "latency"])
        graph = read_csv_columns(graph_csv, ["Name", "OpName"])
        label = label.merge(graph, on="Name", how="left")  # op class of each measured node
        out["has_per_op"] = True
        for op, v in _op_class_sums(_replicated_sum(label, model, n_layer, "latency")).items():
            out[f"label_{op}_ms"] = v
    for p in RELEASE_PREDICTORS:
        pcsv = preds / gpu / RELEASE_PREDICTOR_DIR[p] / f"{stem}.csv"
        if pcsv.is_file():
            trace = read_csv_columns(pcsv, ["Name", "OpName", "e2e_latency"])
            for op, v in _op_class_sums(_replicated_sum(trace, model, n_layer, "e2e_latency")).items():
                out[f"pred_{p}_{op}_ms"] = v
    return out


def safe_ape(label, pred) -> np.ndarray:
    """APE in %; NaN where the label is missing or 0 (no relative error exists) or pred missing."""
    return np.atleast_1d(error_metric.ape(label, pred, nonpositive="nan"))


def build_index(labels_dir: str | Path | None = None, predictions_dir: str | Path | None = None,
                opgraph_dir: str | Path | None = None, per_op: bool = True, progress: bool = True) -> pd.DataFrame:
    """The tidy index (columns in the module docstring), one row per ``labels/<GPU>/*.json``."""
    labels = Path(labels_dir) if labels_dir else paths.labels_dir()
    preds = Path(predictions_dir) if predictions_dir else paths.predictions_dir()
    graphs = Path(opgraph_dir) if opgraph_dir else paths.opgraph_dir()
    if not labels.is_dir():
        raise EvaluationError(f"label folder {labels} does not exist (run `python -m neusight_core.data.release`)")
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
            "gpu": gpu, "gpu_short": devices.short_name(gpu),
            "vendor": "AMD" if gpu.startswith("AMD") else "NVIDIA",
            **cfg, "model_display": MODEL_DISPLAY.get(cfg["model"], cfg["model"]), "config": stem,
            "num_layer": -1 if np.isnan(lab["num_layer"]) else int(lab["num_layer"]),
            "label_e2e_ms": lab["e2e_latency"], "label_fw_ms": lab["fw_latency"],
            "label_bw_ms": lab["bwall_latency"],
        }
        for p in RELEASE_PREDICTORS:
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
    for col in [f"label_{op}_ms" for op in schema.PAPER_CLASSES] + [f"pred_{p}_{op}_ms" for p in RELEASE_PREDICTORS for op in schema.PAPER_CLASSES]:
        if col not in df:
            df[col] = np.nan
    return _add_apes(df)


def _add_apes(df: pd.DataFrame) -> pd.DataFrame:
    """(Re)compute every ape_* column from the label and pred_* columns present."""
    df = df.copy()
    for col in [c for c in df.columns if re.fullmatch(r"pred_[a-z0-9-]+_ms", c)]:
        p = col[len("pred_"):-len("_ms")]
        df[f"ape_{p}"] = safe_ape(df["label_e2e_ms"], df[col])
        for op in schema.PAPER_CLASSES:
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
    cols = {f"label_{'Linear' if op == OpClass.LINEAR else 'VECsoftmax' if op == OpClass.SOFTMAX else 'VECln' if op == OpClass.LAYERNORM else op}_e2e_latency": f"label_{op}_ms"
            for op in schema.PAPER_CLASSES}
    s = pd.read_csv(p, usecols=["model_name", "mode", "seqlen", "batch", "device", "option", *cols])
    s = s.rename(columns={"model_name": "model", "seqlen": "seq", "device": "gpu", **cols})
    s["option"] = s["option"].fillna("none")
    out = index.copy()
    out["per_op_source"] = np.where(out["has_per_op"], "raw", "")
    m = out.merge(s, on=KEY, how="left", suffixes=("", "_authors"))
    fill = (~out["has_per_op"]) & (out["option"] == "none") & m["label_BMM_ms_authors"].notna().to_numpy()
    for op in schema.PAPER_CLASSES:
        out.loc[fill, f"label_{op}_ms"] = m.loc[fill.to_numpy(), f"label_{op}_ms_authors"].to_numpy()
    out.loc[fill, "per_op_source"] = "authors_summary"
    return _add_apes(out)
