"""Model latency: from a kernel table and a device to forward / backward / end-to-end time.

Pipeline: ``trace.trace_model`` -> (``fusion.fuse``) -> (``parallel.apply_plan``) -> a predictor's
per-launch latency for every row -> ``network.NetworkModel`` for the COMM rows -> the sums below.

Aggregation (SPEC 3.3: kernels of one GPU run one after another):
- ``fw_ms`` / ``bw_ms`` / ``acc_ms``: sum over rows of that phase of ``pred_ms`` (= per-launch time x
  ``count``), compute only.
- ``comm_ms``: time of all COMM rows. Rows marked ``overlap`` (DP gradient all-reduce) run under the
  backward pass, so only the part longer than backward + accumulation is exposed:
  ``exposed = max(0, overlapped_comm - (bw_ms + acc_ms)) + other_comm``.
- single GPU, DP, TP: ``e2e_ms = fw_ms + bw_ms + acc_ms + exposed comm``.
- PP: the kernel table holds one micro-batch with a ``stage`` per row. With stage times T_s
  (compute + its send/recv) and m micro-batches, a GPipe-style schedule takes
  ``sum_s T_s + (m - 1) x max_s T_s``; with m = 1 (the paper's ``pp4_1`` labels) this is the plain
  sum, i.e. the stages wait for each other.

The result is a dict (see :func:`predict_model`) whose ``kernels`` frame carries ``pred_ms`` so that
any number can be traced back to the kernels that make it up.
"""
from __future__ import annotations

import functools
import time
from pathlib import Path

import numpy as np
import pandas as pd

from neusight_core import configs, memory, network
from neusight_core import schema

MODES = ("inf", "train")
PLANS = ("dp", "tp", "pp")


class LatencyInputError(ValueError):
    """Bad arguments to predict_model (zero batch, unknown mode or plan, missing link bandwidth)."""


@functools.lru_cache(maxsize=64)
def trace_cached(model: str, batch: int, seq: int, mode: str, past: int = 0, dtype: str = "fp32") -> pd.DataFrame:
    # on disk across processes (trace_cache: keyed by config content, arguments and versions; a hit
    # does not import transformers), and in memory within the process
    from neusight_core import trace_cache
    return trace_cache.trace(model, batch, seq, mode, past=past, dtype=dtype)


def trace(model, batch: int, seq: int, mode: str, past: int = 0, dtype: str = "fp32") -> pd.DataFrame:
    """Kernel table of a model; traces of named models are cached on disk and per process."""
    if isinstance(model, (str, Path)):
        return trace_cached(str(model), int(batch), int(seq), mode, int(past), dtype).copy()
    from neusight_core import trace as _trace
    return _trace.trace_model(model, batch, seq, mode, past=past, dtype=dtype)


@functools.lru_cache(maxsize=32)
def loaded_predictor(name: str, quick: bool, seed: int = 0):
    """Trained predictors by name, once per process (the sweep uses the same ones)."""
    from neusight_core import predictors
    return predictors.get(name, quick=quick, seed=seed)


def _device(device):
    if isinstance(device, str):
        from neusight_core import devices
        return devices.get_device(device)
    return device


# Physical plausibility of a device description (generous: 10x beyond any GPU of 2026). A number
# outside these ranges is a typo or a unit mistake (GB/s vs B/s), and a prediction from it would be
# a bare wrong number.
DEVICE_LIMITS = {"num_sm": (1, 10_000), "mem_bw_gbs": (1.0, 100_000.0), "fp32_gflops": (1.0, 10_000_000.0),
                 "mem_gb": (0.1, 10_000.0), "l2_mb": (0.0, 10_000.0)}
LINK_LIMITS_GBS = (0.001, 100_000.0)
# A request whose lower-bound memory exceeds the GPUs' memory this many times over is not a configuration
# that "does not fit" (memory.footprint says that, and the latency is still printed): it is a typo or a unit
# mistake (a billion sequences), and gets an error instead of a number.
ABSURD_MEMORY_FACTOR = 100


def _positive_int(what: str, v) -> int:
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
        raise LatencyInputError(f"{what} must be a positive integer, got {v!r}")
    return int(v)


def check_device(dev) -> None:
    """Reject a device description no GPU can have (e.g. 1e8 SMs, 1e30 GB/s, zero bandwidth)."""
    for field, (lo, hi) in DEVICE_LIMITS.items():
        v = getattr(dev, field, None)
        if v is None:
            continue
        try:
            ok = np.isfinite(float(v)) and lo <= float(v) <= hi
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise LatencyInputError(f"device {getattr(dev, 'name', '?')}: {field} = {v!r} is outside the physically "
                                    f"plausible range [{lo:g}, {hi:g}] (check the device file and its units)")


def _config_of(model):
    """The model's config fields for the checks below, with one clear line for files that cannot be
    one. Read as plain JSON (``configs.config_content``), not through transformers, so that a
    question answered from the trace cache imports neither transformers nor torch; the tracer checks
    the model type when it builds the model."""
    from types import SimpleNamespace

    if isinstance(model, (str, Path)) and str(model).endswith(".json") and Path(model).is_file():
        import json
        try:
            body = json.loads(Path(model).read_text())
        except (OSError, ValueError) as e:
            raise LatencyInputError(f"model config {model}: not readable JSON ({str(e).splitlines()[0]})") from None
        if not isinstance(body, dict):
            raise LatencyInputError(f"model config {model}: must be a JSON object (a Hugging Face config), "
                                    f"got a {type(body).__name__}")
    content = configs.config_content(model)
    if not content.get("model_type"):
        from neusight_core.trace import TraceError
        raise TraceError(f"model config {model if isinstance(model, (str, Path)) else content.get('name')} "
                         "has no model_type")
    return SimpleNamespace(**{k: v for k, v in content.items() if isinstance(k, str)})


def check_config(cfg) -> dict:
    """Layers, width, heads and vocabulary of a config; each must be a positive integer."""
    dims = {}
    for what, attrs in (("number of layers", ("num_hidden_layers", "n_layer", "num_layers")),
                        ("hidden size", ("hidden_size", "n_embd", "d_model")),
                        ("number of attention heads", ("num_attention_heads", "n_head", "num_heads")),
                        ("vocabulary size", ("vocab_size",))):
        v = next((getattr(cfg, a) for a in attrs if getattr(cfg, a, None) is not None), None)
        if v is None:
            continue
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
            raise LatencyInputError(f"model {getattr(cfg, 'name_or_path', '') or getattr(cfg, 'name', '') or '?'}: {what} must be a positive "
                                    f"integer, got {v!r}")
        dims[what] = int(v)
    inter = next((getattr(cfg, a) for a in ("intermediate_size", "n_inner", "ffn_dim", "d_ff")
                  if getattr(cfg, a, None)), None)
    dims["intermediate size"] = int(inter) if inter else 4 * dims.get("hidden size", 0)
    return dims


def is_image(model) -> bool:
    """An image model (``configs.is_image_model``): its size argument is the image side, not a sequence."""
    from neusight_core import configs
    return configs.is_image_model(vars(_config_of(model)))


def input_size(model, seq=None, image_size=None) -> int:
    """The size the tracer takes (its ``seq`` argument): the sequence length of a text model, the image
    side of an image model (default ``configs.DEFAULT_IMAGE_SIZE``). The option of the other kind is
    refused with one line (issue 26); so is a text model without a sequence length."""
    from neusight_core import configs
    name = model if isinstance(model, (str, Path)) else getattr(model, "name_or_path", "the model")
    if is_image(model):
        if seq is not None:
            raise LatencyInputError(f"--seq is for text models: {name} is an image model; give --image-size "
                                    f"(default {configs.DEFAULT_IMAGE_SIZE})")
        return configs.DEFAULT_IMAGE_SIZE if image_size is None else image_size
    if image_size is not None:
        raise LatencyInputError(f"--image-size is for image models: {name} is a text model; give --seq")
    if seq is None:
        raise LatencyInputError(f"{name} is a text model: give its sequence length (--seq)")
    return seq


def check_image_request(name, past, parallel) -> None:
    """What an image model cannot be asked (issue 26): a KV cache, and the TP / PP plans (``parallel.py``
    splits transformer blocks the Megatron way; data parallelism is modelled)."""
    if past:
        raise LatencyInputError(f"a KV cache (--past) is for text decoders: {name} is an image model")
    if parallel in ("tp", "pp"):
        raise LatencyInputError(f"{parallel} is not modelled for image models ({name}); data parallelism (dp) is")


def validate_inputs(model, device, batch, seq, mode, parallel=None, gpus=1, link_gbs=None, micro_batches=1,
                    past=0, dtype="fp32"):
    """Every check of a prediction request, in one place (the CLI and predict_model both use it).

    Raises LatencyInputError with one line for anything a GPU run could not be: non-positive or
    non-integer sizes, an unknown mode or plan, GPUs / link / micro-batches without the plan that uses
    them, a link bandwidth of 0, tensor parallelism over more GPUs than the heads split into, a model
    config that is not a JSON object or has non-positive dimensions, a device outside physical
    ranges, or a configuration whose weights + one activation tensor exceed the GPUs' memory 100 times
    over (one that merely does not fit is predicted, with ``memory.footprint``'s "does not fit").
    Returns (device, config)."""
    try:
        image = is_image(model)
    except Exception:  # noqa: BLE001 - an unknown or broken config is reported below, after the sizes
        image = False
    batch = _positive_int("batch", batch)
    seq = _positive_int("image size" if image else "sequence length", seq)
    micro_batches = _positive_int("micro-batch count", micro_batches)
    gpus = _positive_int("GPU count", gpus)
    if not isinstance(past, (int, np.integer)) or isinstance(past, bool) or past < 0:
        raise LatencyInputError(f"past (KV cache length) must be a non-negative integer, got {past!r}")
    if mode not in MODES:
        raise LatencyInputError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if parallel is not None and parallel not in PLANS:
        raise LatencyInputError(f"parallel plan must be one of {', '.join(PLANS)}, got {parallel!r}")
    if dtype not in schema.PRECISIONS:
        raise LatencyInputError(f"dtype must be one of {', '.join(schema.PRECISIONS)}, got {dtype!r}")
    if parallel is None:
        if gpus > 1:
            raise LatencyInputError(f"{gpus} GPUs need a parallel plan (dp, tp or pp); without one the "
                                    "prediction is for a single GPU")
        if link_gbs is not None:
            raise LatencyInputError("a link bandwidth only matters with a parallel plan (dp, tp or pp)")
    if micro_batches > 1 and parallel != "pp":
        raise LatencyInputError("micro-batches only apply to pipeline parallelism (pp)")
    if link_gbs is not None:
        try:
            lk = float(link_gbs)
        except (TypeError, ValueError):
            lk = float("nan")
        if not (np.isfinite(lk) and LINK_LIMITS_GBS[0] <= lk <= LINK_LIMITS_GBS[1]):
            raise LatencyInputError(f"link bandwidth must be a positive number of GB/s up to "
                                    f"{LINK_LIMITS_GBS[1]:g}, got {link_gbs!r}")
    dev = _device(device)
    check_device(dev)
    cfg = _config_of(model)
    dims = check_config(cfg)
    if image:
        check_image_request(getattr(cfg, "name", model), past, parallel)
        dims["image channels"] = int(getattr(cfg, "num_channels", 3) or 3)
    heads = dims.get("number of attention heads")
    if parallel == "tp" and heads and heads % gpus:
        raise LatencyInputError(f"tensor parallelism over {gpus} GPUs needs the {heads} attention heads to split "
                                f"evenly; use a GPU count that divides {heads}")
    layers = dims.get("number of layers")
    if parallel == "pp" and layers and gpus > layers:
        raise LatencyInputError(f"pipeline parallelism over {gpus} GPUs needs at least {gpus} layers, the model has {layers}")
    if parallel == "dp" and batch % gpus:
        raise LatencyInputError(f"data parallelism over {gpus} GPUs needs a global batch divisible by {gpus}, got {batch}")
    need = memory.min_memory_gb(dims, batch, seq, mode, parallel, gpus, past, dtype)
    if need > ABSURD_MEMORY_FACTOR * dev.mem_gb:
        raise LatencyInputError(f"impossible on {dev.name}: at least {need:,.1f} GB per GPU (weights + one "
                                f"activation tensor) against {dev.mem_gb:g} GB of memory, over "
                                f"{ABSURD_MEMORY_FACTOR}x what it has")
    return dev, cfg


def aggregate(kernels: pd.DataFrame, micro_batches: int = 1) -> dict:
    """Sum a kernel table that already has ``pred_ms`` (per row, times ``count``) into phase totals."""
    k = kernels
    comm = (k["op_class"] == "COMM").to_numpy()
    phase = k["phase"].to_numpy()
    pred = k["pred_ms"].to_numpy(float)
    fw = float(pred[(phase == "fw") & ~comm].sum())
    bw = float(pred[(phase == "bw") & ~comm].sum())
    acc = float(pred[(phase == "acc") & ~comm].sum())
    overlap = comm & k.get("overlap", pd.Series(False, index=k.index)).fillna(False).astype(bool).to_numpy()
    comm_total = float(pred[comm].sum())
    comm_overlap = float(pred[overlap].sum())
    exposed = max(0.0, comm_overlap - (bw + acc)) + (comm_total - comm_overlap)
    stages = k["stage"].fillna(0).astype(int) if "stage" in k else pd.Series(0, index=k.index)
    if stages.nunique() > 1:
        per_stage = k.assign(_s=stages.to_numpy()).groupby("_s")["pred_ms"].sum()
        e2e = float(per_stage.sum() + (micro_batches - 1) * per_stage.max())
    else:
        per_stage = None
        e2e = fw + bw + acc + exposed
    breakdown = (k.groupby("op_class")["pred_ms"].sum().sort_values(ascending=False))
    out = {"e2e_ms": e2e, "fw_ms": fw, "bw_ms": bw, "acc_ms": acc, "comm_ms": comm_total,
           "comm_exposed_ms": exposed, "breakdown": {c: float(v) for c, v in breakdown.items()}}
    if per_stage is not None:
        out["stage_ms"] = {int(s): float(v) for s, v in per_stage.items()}
    return out


def predict_kernels(kernels: pd.DataFrame, device, predictor="neusight", quick: bool = False,
                    net: network.NetworkModel | None = None) -> pd.DataFrame:
    """Return ``kernels`` with ``pred_ms`` = predicted per-launch time x ``count`` (COMM by ``net``)."""
    dev = _device(device)
    pred = loaded_predictor(predictor, quick) if isinstance(predictor, str) else predictor
    per_launch = np.asarray(pred.predict(kernels, dev), dtype=float)
    comm = (kernels["op_class"] == "COMM").to_numpy()
    if comm.any():
        if net is None:
            raise LatencyInputError("the kernel table has communication rows but no network model was given")
        per_launch = np.where(comm, net.time_ms(kernels), per_launch)
    count = kernels["count"].fillna(1).to_numpy(float) if "count" in kernels else 1.0
    return kernels.assign(pred_ms=per_launch * count)


def predict_model(model, device, batch: int, seq: int, mode: str, predictor="neusight",
                  fusion: bool = False, parallel: str | None = None, gpus: int = 1,
                  link_gbs: float | None = None, micro_batches: int = 1,
                  efficiency: float = network.DEFAULT_EFFICIENCY, quick: bool = False, past: int = 0,
                  dtype: str = "fp32", optimizer: str = "adamw", master_weights: bool = True) -> dict:
    """Predict one configuration.

    ``model``: a config name known to ``trace.load_config`` or a path; ``device``: anything
    ``devices.get_device`` accepts or a Device; ``predictor``: a name in ``predictors.NAMES`` or a
    fitted KernelPredictor. For ``parallel`` in dp/tp/pp, ``batch`` is the global batch and
    ``link_gbs`` defaults to the device's catalogue link bandwidth. ``past`` > 0 (inference,
    extension): ``seq`` new tokens on a KV cache of ``past`` tokens (``seq=1``: one decode step).
    ``dtype`` in fp32 | tf32 | fp16 | bf16 (fp32 = the paper; others extrapolate, see
    ``trace.trace_model``). ``optimizer`` / ``master_weights``: the training state counted in
    ``memory`` (``memory.footprint``).

    Returns ``e2e_ms``, ``fw_ms``, ``bw_ms``, ``acc_ms``, ``comm_ms``, ``comm_exposed_ms``,
    ``breakdown`` (ms per op class), ``stage_ms`` (PP only), ``trace_s`` and ``predict_s`` (wall
    times), ``memory`` (per-GPU footprint and ``fits`` / ``verdict``, ``memory.footprint``), ``dtype``,
    ``dtype_note`` ("" or the sentence of ``Device.precision_note``: this GPU has no tensor cores for
    ``dtype``, its GEMMs use the FP32 peak) and ``kernels`` (the kernel table with ``pred_ms``).
    """
    dev, _ = validate_inputs(model, device, batch, seq, mode, parallel, gpus, link_gbs, micro_batches, past, dtype)
    t0 = time.perf_counter()
    kernels = trace(model, batch, seq, mode, past, dtype)
    if fusion:
        from neusight_core import fusion as _fusion
        kernels = _fusion.fuse(kernels)
    net = None
    if parallel is not None:
        from neusight_core import parallel as _parallel
        bw = link_gbs if link_gbs is not None else dev.link_gbs
        if bw is None and gpus > 1:
            raise LatencyInputError(f"no link bandwidth known for {dev.name}: pass link_gbs")
        net = network.NetworkModel(link_gbs=bw or 1.0, gpus=gpus, efficiency=efficiency)
        kernels = _parallel.apply_plan(kernels, parallel, gpus, micro_batches=micro_batches)
    t1 = time.perf_counter()
    kernels = predict_kernels(kernels, dev, predictor, quick=quick, net=net)
    out = aggregate(kernels, micro_batches if parallel == "pp" else 1)
    mem = memory.footprint(kernels, dev, optimizer=optimizer, master_weights=master_weights)
    out.update(trace_s=t1 - t0, predict_s=time.perf_counter() - t1, kernels=kernels,
               device=dev.name, predictor=predictor if isinstance(predictor, str) else predictor.name,
               dtype=dtype, dtype_note=dev.precision_note(dtype), memory=mem,
               conv_note=conv_note(kernels, predictor, quick))
    return out


def conv_by_roofline(predictor="neusight", quick: bool = False) -> bool:
    """Whether ``predictor`` times convolutions by the roofline, i.e. has no model of its own for them:
    one convolution (a 3 x 3 conv of ResNet-50's third stage at batch 32) predicted on the A100 against
    the roofline. The roofline baseline itself counts as having its model."""
    from neusight_core.predictors import common
    pred = loaded_predictor(predictor, quick) if isinstance(predictor, str) else predictor
    if getattr(pred, "name", "") == "roofline":
        return False
    cin = cout = 256
    k, size, b = 3, 14, 32
    row = pd.DataFrame([{"op_class": "CONV", "sub_op": "fwd", "B": b, "M": b * size * size, "N": cin * k * k,
                         "K": cout, "H": np.nan, "flops": 2.0 * b * size * size * cin * k * k * cout,
                         "bytes_read": 4.0 * (b * cin * size * size + cout * cin * k * k),
                         "bytes_written": 4.0 * b * cout * size * size, "precision": "fp32", "count": 1,
                         "conv_cin": cin, "conv_cout": cout, "conv_k": k, "conv_in": size, "conv_stride": 1,
                         "conv_pad": 1, "conv_groups": 1}])
    dev = _device("A100")
    got = float(np.asarray(pred.predict(row, dev), dtype=float)[0])
    return bool(np.isclose(got, float(common.roofline_ms(row, common.device_arrays(row, dev))[0]), rtol=1e-9))


def conv_note(kernels: pd.DataFrame, predictor="neusight", quick: bool = False) -> str:
    """"" or the sentence that says the convolutions of this prediction are timed by the roofline (issue 26:
    until NeuSight's convolution networks are trained, ``conv_by_roofline``)."""
    conv = (kernels["op_class"] == "CONV").to_numpy()
    if not conv.any() or not conv_by_roofline(predictor, quick):
        return ""
    share = float(kernels["pred_ms"].to_numpy(float)[conv].sum() / max(kernels["pred_ms"].sum(), 1e-30))
    pct = "under 1%" if share < 0.01 else f"{share:.0%}"
    return (f"convolutions ({pct} of the predicted time) are predicted by the roofline: this predictor "
            "has no trained convolution model (issue 26); an extrapolation, no measured latency of an image "
            "model validates it")
