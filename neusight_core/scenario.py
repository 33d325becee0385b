"""One prediction request, validated once: the CLI, ``latency.predict_model`` and the sweep all
build a :class:`Scenario` with :func:`scenario`, so a request is accepted or refused the same way
everywhere, with the same one-line ``LatencyInputError``.

The checks themselves are :func:`validate_inputs` (sizes, mode, plan, dtype, device plausibility,
model config, TP/PP/DP divisibility, the absurd-memory guard) and :func:`input_size` (a sequence
length for text models, an image side for image models, never both); this module resolves the defaults
(GPUs, the catalogue's link bandwidth) and holds the result.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from neusight_core import configs, memory, parallel_experts, schema
from neusight_core.schema import Precision


class LatencyInputError(ValueError):
    """A request no GPU run could be (zero batch, unknown mode or plan, missing link bandwidth, ...): one line."""




# ------------------------------------------------------------------------------ the checks
def device_of(device):
    if isinstance(device, str):
        from neusight_core import devices
        return devices.get_device(device)
    return device


# Physical plausibility of a device description (generous: 10x beyond any GPU of 2026). A number
# outside these ranges is a typo or a unit mistake (GB/s vs B/s), and a prediction from it would be
# a bare wrong number.
LINK_LIMITS_GBS = (0.001, 100_000.0)
#: what a GPU can have; a device entry outside is a typo or a unit mistake (a tensor peak of 1e-9 GFLOPS predicted a
#: GEMM at 8e11 ms), refused when the GPU is used, naming the file it came from
DEVICE_LIMITS = {"num_sm": (1, 10_000), "mem_bw_gbs": (1.0, 100_000.0), "fp32_gflops": (1.0, 10_000_000.0),
                 "fp32_vec_gflops": (1.0, 10_000_000.0), "mem_gb": (0.1, 10_000.0), "l2_mb": (0.0, 10_000.0),
                 "link_gbs": LINK_LIMITS_GBS, "tf32_tensor_gflops": (1.0, 100_000_000.0),
                 "fp16_tensor_gflops": (1.0, 100_000_000.0), "bf16_tensor_gflops": (1.0, 100_000_000.0)}
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
            where = getattr(dev, "origin", "") or "the device file"
            raise LatencyInputError(f"device {getattr(dev, 'name', '?')}: {field} = {v!r} is outside the physically "
                                    f"plausible range [{lo:g}, {hi:g}] (check {where} and its units)")


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
    if isinstance(model, (str, Path)) and not str(model).endswith(".json"):
        return configs.is_image_model(str(model))          # a catalogue name: cached per process
    return configs.is_image_model(vars(_config_of(model)))


def input_size(model, seq=None, image_size=None) -> int:
    """The size the tracer takes (its ``seq`` argument): the sequence length of a text model, the image
    side of an image model (default ``configs.DEFAULT_IMAGE_SIZE``). The option of the other kind is
    refused with one line; so is a text model without a sequence length."""
    from neusight_core import configs
    name = model if isinstance(model, (str, Path)) else getattr(model, "name_or_path", "the model")
    if is_image(model):
        if seq is not None:
            raise LatencyInputError(f"--seq is for text models: {name} is an image model; give --image-size "
                                    f"(default {configs.DEFAULT_IMAGE_SIZE})")
        return configs.DEFAULT_IMAGE_SIZE if image_size is None else image_size
    if image_size is not None:
        raise LatencyInputError(configs.unsupported_image_model(vars(_config_of(model)))
                                or f"--image-size is for image models: {name} is a text model; give --seq")
    if seq is None:
        raise LatencyInputError(f"{name} is a text model: give its sequence length (--seq)")
    return seq


def check_image_request(name, past, parallel) -> None:
    """What an image model cannot be asked: a KV cache, and the TP / PP plans (``parallel.py``
    splits transformer blocks the Megatron way; data parallelism is modelled)."""
    if past:
        raise LatencyInputError(f"a KV cache (--past) is for text decoders: {name} is an image model")
    if parallel in schema.TENSOR_PLANS + ("pp",):
        raise LatencyInputError(f"{parallel} is not modelled for image models ({name}); data parallelism (dp) is")


def validate_inputs(model, device, batch, seq, mode, parallel=None, gpus=1, link_gbs=None, micro_batches=1,
                    past=0, dtype=Precision.FP32, attention="eager", execution="graph", grads="accumulate",
                    comm="bandwidth"):
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
    if mode not in schema.MODES:
        raise LatencyInputError(f"mode must be one of {', '.join(schema.MODES)}, got {mode!r}")
    if parallel is not None and parallel not in schema.PLANS:
        raise LatencyInputError(f"parallel plan must be one of {', '.join(schema.PLANS)}, got {parallel!r}")
    if dtype not in schema.PRECISIONS:
        raise LatencyInputError(f"dtype must be one of {', '.join(schema.PRECISIONS)}, got {dtype!r}")
    if attention is not None and attention not in schema.ATTENTIONS:     # None: the model's default
        raise LatencyInputError(f"attention must be one of {', '.join(schema.ATTENTIONS)}, got {attention!r}")
    if execution not in schema.EXECUTIONS:
        raise LatencyInputError(f"execution must be one of {', '.join(schema.EXECUTIONS)}, got {execution!r}")
    if grads not in schema.GRADS:
        raise LatencyInputError(f"grads must be one of {', '.join(schema.GRADS)}, got {grads!r}")
    if comm not in schema.COMMS:
        raise LatencyInputError(f"comm must be one of {', '.join(schema.COMMS)}, got {comm!r}")
    if parallel is None:
        if gpus > 1:
            raise LatencyInputError(f"{gpus} GPUs need a parallel plan ({', '.join(schema.PLANS)}); without one the "
                                    "prediction is for a single GPU")
        if link_gbs is not None:
            raise LatencyInputError(f"a link bandwidth only matters with a parallel plan ({', '.join(schema.PLANS)})")
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
    dev = device_of(device)
    check_device(dev)
    cfg = _config_of(model)
    dims = check_config(cfg)
    if attention == "sdpa" and getattr(cfg, "model_type", None) in configs.no_sdpa_model_types():
        raise LatencyInputError(f"{getattr(cfg, 'model_type', model)} has no fused (sdpa) attention in transformers: "
                                "use attention eager")
    if image:
        check_image_request(getattr(cfg, "name", model), past, parallel)
        dims["image channels"] = int(getattr(cfg, "num_channels", 3) or 3)
    heads = dims.get("number of attention heads")
    if parallel in schema.TENSOR_PLANS and heads and heads % gpus:
        raise LatencyInputError(f"tensor parallelism over {gpus} GPUs needs the {heads} attention heads to split "
                                f"evenly; use a GPU count that divides {heads}")
    if parallel == "ep":
        experts = parallel_experts.experts_of(vars(cfg))
        if experts is None:
            raise LatencyInputError(f"expert parallelism (ep) needs a mixture-of-experts model; "
                                    f"{getattr(cfg, 'name', None) or model} has no experts: use tp")
        if experts % gpus:
            raise LatencyInputError(f"expert parallelism over {gpus} GPUs needs the {experts} experts to spread "
                                    f"evenly; use a GPU count that divides {experts}")
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



# ------------------------------------------------------------------------------ the request
@dataclass(frozen=True)
class Scenario:
    """A validated request. Its size is ``seq``, the sequence length of a text model, or ``image_size``, the
    image side of an image model: exactly one of the two is set (``size`` is the tracer's argument, either).
    ``link_gbs`` is resolved (given, or the catalogue's link of the device when a plan needs one; None without a
    plan)."""
    model: object          # config name, path, or a config object / dict
    device: str            # catalogue name
    batch: int
    seq: int | None = None           # tokens of a text model (None for an image model)
    mode: str = "inf"
    past: int = 0
    dtype: str = Precision.FP32
    fusion: bool = False
    parallel: str | None = None
    gpus: int = 1
    micro_batches: int = 1
    link_gbs: float | None = None
    image_size: int | None = None    # side of an image model's input (None for a text model)
    attention: str = "eager"      # eager | sdpa (schema.ATTENTIONS); scenario() defaults to what HF picks
    execution: str = "graph"      # eager | graph (schema.EXECUTIONS); scenario() defaults to eager PyTorch
    grads: str = "accumulate"     # fresh | accumulate (schema.GRADS, training); scenario() defaults to fresh
    comm: str = "bandwidth"       # nccl | bandwidth (schema.COMMS, network.py); scenario() defaults to nccl

    def __post_init__(self):
        if (self.seq is None) == (self.image_size is None):
            raise LatencyInputError("a scenario has a sequence length (text model) or an image size (image "
                                    f"model), exactly one: got seq={self.seq}, image_size={self.image_size}")

    @property
    def image(self) -> bool:
        return self.image_size is not None

    @property
    def size(self) -> int:
        """The tracer's size argument (:func:`tracer_size`): the sequence length, or the image side."""
        return tracer_size(vars(self))

    def as_dict(self) -> dict:
        return asdict(self)


#: The paper's setting: eager attention, the step as its kernel sum, gradients accumulated into (the authors'
#: loop), collectives timed by the link's bandwidth alone (the authors' network model). The reproduction (Tier 0/1)
#: asks for it explicitly; a question that does not say gets what people run (``scenario``'s defaults).
PAPER = {"attention": "eager", "execution": "graph", "grads": "accumulate", "comm": "bandwidth"}


def scenario(model, device, batch, seq=None, mode: str = "inf", *, image_size=None, past=0, dtype: str = Precision.FP32,
             fusion: bool = False, parallel: str | None = None, gpus=None, micro_batches=1,
             link_gbs=None, attention: str | None = None, execution: str | None = None,
             grads: str | None = None, comm: str | None = None) -> Scenario:
    """Validate a request and return it as a :class:`Scenario` (``gpus`` defaults to 4 with a plan, the
    paper's setting, else 1; ``attention`` to what Hugging Face picks for the model, ``configs.default_attention``;
    ``execution`` to eager PyTorch; ``grads`` to fresh, PyTorch's default, or accumulate with pp; ``comm`` to
    nccl, the link plus NCCL's fixed cost per all-reduce). Raises
    ``LatencyInputError`` (or the tracer's / catalogue's one-line errors for an unknown model or GPU)."""
    size = input_size(model, seq, image_size)
    gpus = (4 if parallel else 1) if gpus is None else gpus
    execution = "eager" if execution is None else execution
    comm = "nccl" if comm is None else comm
    if parallel == "pp" and grads == "fresh":
        raise LatencyInputError("pipeline parallelism (pp) accumulates each micro-batch's gradients into the "
                                "last one's: grads fresh does not apply (use accumulate)")
    # pipeline parallelism accumulates over its micro-batches (the authors' pp labels were measured so)
    grads = ("accumulate" if parallel == "pp" else "fresh") if grads is None else grads
    dev, cfg = validate_inputs(model, device, batch, size, mode, parallel, gpus, link_gbs, micro_batches,
                               past, dtype, attention, execution, grads, comm)
    attention = configs.default_attention(vars(cfg)) if attention is None else attention
    link = None if link_gbs is None else float(link_gbs)
    if parallel is not None and link is None:
        link = dev.link_gbs
        if link is None and gpus > 1:
            raise LatencyInputError(f"no link bandwidth known for {dev.name}: give the link bandwidth "
                                            "(--link-gbs / link_gbs)")
    image = is_image(model)
    return Scenario(model=str(model) if isinstance(model, Path) else model, device=dev.name, batch=int(batch),
                    seq=None if image else int(size), mode=mode, past=int(past), dtype=dtype, fusion=bool(fusion),
                    parallel=parallel, gpus=int(gpus), micro_batches=int(micro_batches), link_gbs=link,
                    image_size=int(size) if image else None, attention=attention, execution=execution, grads=grads,
                    comm=comm)


# ------------------------------------------------------------------------------ without a footprint
def tracer_size(r: dict) -> int:
    """The tracer's one size argument of a request's fields (a dict, or ``vars`` of a Scenario or a study's case):
    its sequence length, or an image model's side (a request keeps the two apart, ``seq`` / ``image_size``; only the
    tracer takes either)."""
    return r["seq"] if r.get("image_size") is None else r["image_size"]


def lower_bound_verdict(r: dict) -> tuple:
    """(fits, verdict) of a request without a footprint: "does not fit" when even ``memory.min_memory_gb`` exceeds
    the GPU's memory, else unknown (None) with that bound."""
    from neusight_core import devices
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
        cfg = _config_of(model)
        dims = check_config(cfg)
        if is_image(model):
            dims["image channels"] = int(getattr(cfg, "num_channels", 3) or 3)
        _DIMS[key] = dims
    return _DIMS[key]
