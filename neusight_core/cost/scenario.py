"""Building a request: ``scenario`` validates one and returns it as a :class:`step.Scenario`. The CLI,
``latency.predict_model``, the engine's dict rows (``request.parse``) and the sweep all build theirs here, so a request
is accepted or refused the same way everywhere, with the same one-line ``LatencyInputError``.

What each option is, its default and its own check are declared once with the option (``step.py``). This module holds
what needs more than one field or the model: which size a model takes (``input_size``), the defaults that depend on
the plan or the model (GPUs, gradients, attention, the link), and the checks across fields, the model config and the
device (``check_request``).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from neusight_core.data import configs
from neusight_core.cost import memory
from neusight_core.plans import parallel_experts
from neusight_core.question import schema
from neusight_core.question.schema import Attention, Grads, Mode, Plan, Precision
# PAPER and Scenario are named here too: the question's callers read them as scenario.*
from neusight_core.question.step import (INPUTS, LINK_LIMITS_GBS, PAPER, REQUIRED, LatencyInputError, Scenario,  # noqa: F401
                                not_given, options, plain_defaults)

FIELDS = options()
PLAIN_DEFAULTS = plain_defaults()

# ------------------------------------------------------------------------------ the checks
def device_of(device):
    if isinstance(device, str):
        from neusight_core.data import devices
        return devices.get_device(device)
    return device


# Physical plausibility of a device description (generous: 10x beyond any GPU of 2026). A number
# outside these ranges is a typo or a unit mistake (GB/s vs B/s), and a prediction from it would be
# a bare wrong number.
#: what a GPU can have; a device entry outside is a typo or a unit mistake (a tensor peak of 1e-9 GFLOPS predicted a
#: GEMM at 8e11 ms), refused when the GPU is used, naming the file it came from
DEVICE_LIMITS = {"num_sm": (1, 10_000), "mem_bw_gbs": (1.0, 100_000.0), "fp32_gflops": (1.0, 10_000_000.0),
                 "fp32_vec_gflops": (1.0, 10_000_000.0), "mem_gb": (0.1, 10_000.0), "l2_mb": (0.0, 10_000.0),
                 "link_gbs": LINK_LIMITS_GBS, "tf32_tensor_gflops": (1.0, 100_000_000.0),
                 "fp16_tensor_gflops": (1.0, 100_000_000.0), "bf16_tensor_gflops": (1.0, 100_000_000.0)}
#: the tensor-core peaks of a device entry, and the least a tensor peak can be against the FP32 peak (a generous
#: half: the catalogue's GPUs have 1.9-15.6 times)
TENSOR_PEAKS = ("tf32_tensor_gflops", "fp16_tensor_gflops", "bf16_tensor_gflops")
MIN_TENSOR_OVER_FP32 = 0.5
# A request whose lower-bound memory exceeds the GPUs' memory this many times over is not a configuration
# that "does not fit" (memory.footprint says that, and the latency is still printed): it is a typo or a unit
# mistake (a billion sequences), and gets an error instead of a number.
ABSURD_MEMORY_FACTOR = 100


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
            where = getattr(dev, "origin", "") or "the device file"
            raise LatencyInputError(f"device {getattr(dev, 'name', '?')}: {field} = {v!r} is outside the physically "
                                    f"plausible range [{lo:g}, {hi:g}] (check {where} and its units)")
    # a tensor-core peak is at least the FP32 peak on every GPU of the catalogue (1.9-15.6x); one far below it is a
    # unit mistake (TFLOPS written as GFLOPS) that would time every GEMM in that precision thousands of times too slow
    fp32 = getattr(dev, "fp32_gflops", None)
    for field in TENSOR_PEAKS:
        v = getattr(dev, field, None)
        if v is not None and fp32 and float(v) < MIN_TENSOR_OVER_FP32 * float(fp32):
            where = getattr(dev, "origin", "") or "the device file"
            raise LatencyInputError(f"device {getattr(dev, 'name', '?')}: {field} = {v!r} is {float(fp32) / float(v):,.0f}x "
                                    f"below its FP32 peak {fp32!r}; a tensor-core peak is at least the FP32 peak "
                                    f"(check {where} and its units: GFLOPS)")


def config_of(model):
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
        from neusight_core.tracing.trace import TraceError
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
    name = getattr(cfg, "name_or_path", "") or getattr(cfg, "name", "") or "?"
    heads, kv = dims.get("number of attention heads"), getattr(cfg, "num_key_value_heads", None)
    if heads and kv is not None and (not isinstance(kv, (int, np.integer)) or isinstance(kv, bool) or kv < 1
                                     or heads % kv):
        raise LatencyInputError(f"model {name}: num_key_value_heads = {kv!r} must divide the {heads} attention heads "
                                "(grouped-query attention shares each key/value head among an equal group of heads)")
    experts = parallel_experts.experts_of(vars(cfg))
    top = getattr(cfg, "num_experts_per_tok", None)
    if experts is not None and top is not None and (not isinstance(top, (int, np.integer)) or isinstance(top, bool)
                                                     or not 1 <= top <= experts):
        raise LatencyInputError(f"model {name}: num_experts_per_tok = {top!r} must be an integer from 1 to its "
                                f"{experts} experts (each token is routed to that many)")
    window = getattr(cfg, "sliding_window", None)
    if window is not None and getattr(cfg, "use_sliding_window", True) is not False and (
            not isinstance(window, (int, np.integer)) or isinstance(window, bool) or window < 2):
        raise LatencyInputError(f"model {name}: sliding_window = {window!r} must be an integer of at least 2 tokens "
                                "(or null: no window); a window of 1 attends to each token alone")
    inter = next((getattr(cfg, a) for a in ("intermediate_size", "n_inner", "ffn_dim", "d_ff")
                  if getattr(cfg, a, None)), None)
    dims["intermediate size"] = int(inter) if inter else 4 * dims.get("hidden size", 0)
    return dims


def is_image(model) -> bool:
    """An image model (``configs.is_image_model``): its size argument is the image side, not a sequence."""
    if isinstance(model, (str, Path)) and not str(model).endswith(".json"):
        return configs.is_image_model(str(model))          # a catalogue name: cached per process
    return configs.is_image_model(vars(config_of(model)))


def input_size(model, seq=None, image_size=None) -> int:
    """The size the tracer takes (its ``seq`` argument): the sequence length of a text model, the image
    side of an image model (default ``configs.DEFAULT_IMAGE_SIZE``). The option of the other kind is
    refused with one line; so is a text model without a sequence length."""
    from neusight_core.data import configs
    name = model if isinstance(model, (str, Path)) else getattr(model, "name_or_path", "the model")
    if is_image(model):
        if seq is not None:
            raise LatencyInputError(f"--seq is for text models: {name} is an image model; give --image-size "
                                    f"(default {configs.DEFAULT_IMAGE_SIZE})")
        return configs.DEFAULT_IMAGE_SIZE if image_size is None else image_size
    if image_size is not None:
        raise LatencyInputError(configs.unsupported_image_model(vars(config_of(model)))
                                or f"--image-size is for image models: {name} is a text model; give --seq")
    if seq is None:
        raise LatencyInputError(f"{name} is a text model: give its sequence length (--seq)")
    return seq


def check_image_request(name, past, parallel) -> None:
    """What an image model cannot be asked: a KV cache, and the TP / PP plans (``parallel.py``
    splits transformer blocks the Megatron way; data parallelism is modelled)."""
    if past:
        raise LatencyInputError(f"a KV cache (--past) is for text decoders: {name} is an image model")
    if parallel in schema.TENSOR_PLANS + (Plan.PP,):
        raise LatencyInputError(f"{parallel} is not modelled for image models ({name}); data parallelism (dp) is")


def check_fields(fields: dict, declared: dict | None = None) -> dict:
    """Each given field (None: not given) by its own check (``step.option``'s kind: a positive integer, one of an enum's words, ...),
    in the order the fields are declared (``declared``: a question's ``step.options``, the step question's when None);
    returns them as typed values (enum members, ints, floats)."""
    out = dict(fields)
    for name, o in (FIELDS if declared is None else declared).items():
        v = fields.get(name)
        if v is None and o.user is not REQUIRED:        # not given (``scenario`` made NaN and NA None)
            continue
        out[name] = o.kind.check(o.what or name, v)    # a field the question must give is checked when missing
    return out


def check_request(f: dict, image: bool):
    """The checks across fields, the model config and the device; ``f``: the fields, each checked on its own.

    Raises LatencyInputError with one line for anything a GPU run could not be: GPUs / link / micro-batches without
    the plan that uses them, fp8 on a GPU without FP8 tensor cores or in training, tensor parallelism over more GPUs than the heads split into, a model config that is not
    a JSON object or has non-positive dimensions, a device outside physical ranges, or a configuration whose weights +
    one activation tensor exceed the GPUs' memory 100 times over (one that merely does not fit is predicted, with
    ``memory.footprint``'s "does not fit"). Returns (device, config)."""
    parallel, gpus, batch = f["parallel"], f["gpus"], f["batch"]
    if parallel is None:
        if gpus > 1:
            raise LatencyInputError(f"{gpus} GPUs need a parallel plan ({', '.join(schema.PLANS)}); without one the "
                                    "prediction is for a single GPU")
        if f["link_gbs"] is not None:
            raise LatencyInputError(f"a link bandwidth only matters with a parallel plan ({', '.join(schema.PLANS)})")
    if f["micro_batches"] > 1 and parallel != Plan.PP:
        raise LatencyInputError("micro-batches only apply to pipeline parallelism (pp)")
    dev = device_of(f["device"])
    check_device(dev)
    if f["dtype"] == Precision.FP8:
        # an FP8 GEMM on a GPU without FP8 tensor cores would be a guess at an emulation no engine runs
        if not dev.has_tensor_peak(Precision.FP8):
            raise LatencyInputError(f"{dev.name} has no FP8 tensor cores (Ada, Hopper and Blackwell GPUs have them: "
                                    "L4, L40S, H100, H200, B200, GB200): use bf16")
        if f["mode"] == Mode.TRAIN:
            raise LatencyInputError("fp8 is modelled for inference only (FP8 weights and GEMMs of a served model); "
                                    "use bf16 for training")
    cfg = config_of(f["model"])
    dims = check_config(cfg)
    if f["attention"] == Attention.SDPA and getattr(cfg, "model_type", None) in configs.no_sdpa_model_types():
        raise LatencyInputError(f"{getattr(cfg, 'model_type', f['model'])} has no fused (sdpa) attention in "
                                "transformers: use attention eager")
    if image:
        check_image_request(getattr(cfg, "name", f["model"]), f["past"], parallel)
        dims["image channels"] = int(getattr(cfg, "num_channels", 3) or 3)
    heads = dims.get("number of attention heads")
    if parallel is not None and parallel.splits_tensors and heads and heads % gpus:
        raise LatencyInputError(f"tensor parallelism over {gpus} GPUs needs the {heads} attention heads to split "
                                f"evenly; use a GPU count that divides {heads}")
    if parallel == Plan.EP:
        experts = parallel_experts.experts_of(vars(cfg))
        if experts is None:
            raise LatencyInputError(f"expert parallelism (ep) needs a mixture-of-experts model; "
                                    f"{getattr(cfg, 'name', None) or f['model']} has no experts: use tp")
        if experts % gpus:
            raise LatencyInputError(f"expert parallelism over {gpus} GPUs needs the {experts} experts to spread "
                                    f"evenly; use a GPU count that divides {experts}")
    layers = dims.get("number of layers")
    if parallel == Plan.PP and layers and gpus > layers:
        raise LatencyInputError(f"pipeline parallelism over {gpus} GPUs needs at least {gpus} layers, the model has "
                                f"{layers}")
    if parallel == Plan.DP and batch % gpus:
        raise LatencyInputError(f"data parallelism over {gpus} GPUs needs a global batch divisible by {gpus}, got "
                                f"{batch}")
    size = f["image_size"] if image else f["seq"]
    need = memory.min_memory_gb(dims, batch, size, f["mode"], parallel, gpus, f["past"], f["dtype"])
    if need > ABSURD_MEMORY_FACTOR * dev.mem_gb:
        raise LatencyInputError(f"impossible on {dev.name}: at least {need:,.1f} GB per GPU (weights + one "
                                f"activation tensor) against {dev.mem_gb:g} GB of memory, over "
                                f"{ABSURD_MEMORY_FACTOR}x what it has")
    return dev, cfg


def scenario(model, device, batch, seq=None, mode=None, **given) -> Scenario:
    """Validate a request and return it as a :class:`step.Scenario`. The keywords are the Scenario's fields
    (``step.INPUTS``); a field not given, or given as None, takes the user's default its declaration states: plain
    values, and the rules applied here (GPUs 4 with a plan, the paper's setting, else 1; gradients fresh, or
    accumulate with pp; attention what Hugging Face picks for the model, ``configs.default_attention``; the link the
    catalogue's, with a plan). Raises ``LatencyInputError`` (or the tracer's / catalogue's one-line errors for an
    unknown model or GPU)."""
    unknown = sorted(set(given) - set(INPUTS))
    if unknown:
        raise LatencyInputError(f"unknown option(s) {', '.join(unknown)}; the options are {', '.join(INPUTS)}")
    f = dict.fromkeys(INPUTS)
    f.update(given, model=model, device=device, batch=batch, seq=seq, mode=mode)
    f = {name: None if not_given(v) else v for name, v in f.items()}
    for name, default in PLAIN_DEFAULTS.items():          # the user's plain defaults (the rules come below)
        if f[name] is None:
            f[name] = default
    try:
        image = is_image(model)
    except Exception:  # noqa: BLE001 - an unknown or broken config is reported below, after the sizes
        image = False
    size = input_size(model, f["seq"], f["image_size"])    # the size of its kind, or one line why not
    f["seq"], f["image_size"] = (None, size) if image else (size, None)
    f = check_fields(f)
    if f["gpus"] is None:
        f["gpus"] = 4 if f["parallel"] is not None else 1
    if f["parallel"] == Plan.PP and f["grads"] == Grads.FRESH:
        raise LatencyInputError("pipeline parallelism (pp) accumulates each micro-batch's gradients into the "
                                "last one's: grads fresh does not apply (use accumulate)")
    if f["grads"] is None:   # pipeline parallelism accumulates over its micro-batches (so the authors' pp labels)
        f["grads"] = Grads.ACCUMULATE if f["parallel"] == Plan.PP else Grads.FRESH
    dev, cfg = check_request(f, image)
    if f["attention"] is None:
        f["attention"] = Attention(configs.default_attention(vars(cfg)))
    if f["parallel"] is not None and f["link_gbs"] is None:
        f["link_gbs"] = dev.link_gbs
        if f["link_gbs"] is None and f["gpus"] > 1:
            raise LatencyInputError(f"no link bandwidth known for {dev.name}: give the link bandwidth "
                                    "(--link-gbs / link_gbs)")
    f.update(model=str(model) if isinstance(model, Path) else model, device=dev.name)
    return Scenario(**f)


# ------------------------------------------------------------------------------ without a footprint
def tracer_size(r: dict) -> int:
    """The tracer's one size argument of a request's fields (a dict, or ``vars`` of a Scenario or a study's case):
    its sequence length, or an image model's side (a request keeps the two apart, ``seq`` / ``image_size``; only the
    tracer takes either)."""
    return r["seq"] if r.get("image_size") is None else r["image_size"]


def lower_bound_verdict(r: dict) -> tuple:
    """(fits, verdict) of a request without a footprint: "does not fit" when even ``memory.min_memory_gb`` exceeds
    the GPU's memory, else unknown (None) with that bound."""
    from neusight_core.data import devices
    dims = _dims(r["model"] if isinstance(r["model"], str) else id(r["model"]), r["model"])
    need = memory.min_memory_gb(dims, r["batch"], tracer_size(r), r["mode"], r["parallel"], r["gpus"], r["past"], r["dtype"])
    have = devices.get_device(r["device"]).mem_gb
    per = " per GPU" if r["parallel"] else ""
    if need > have:
        return False, f"does not fit: needs at least {need:,.1f} GB{per} (weights + one activation), has {have:g} GB"
    return None, f"not computed (no trace of this table): at least {need:,.1f} GB{per} of {have:g} GB"


_DIMS: dict = {}


def _dims(key, model) -> dict:
    """``scenario.check_config`` of a model, once per model and process (image models with their channels)."""
    if key not in _DIMS:
        cfg = config_of(model)
        dims = check_config(cfg)
        if is_image(model):
            dims["image channels"] = int(getattr(cfg, "num_channels", 3) or 3)
        _DIMS[key] = dims
    return _DIMS[key]
