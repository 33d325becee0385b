"""Live on the local GPU: detect it, measure kernels/models with the paper's protocol, compare (notebook 05).

This module holds the whole models, the scenarios and the notebook's driver (``run_live``); the harness is
``live_harness``, the kernel section ``live_kernels``, the tables and verdicts ``live_report``, the modern
BF16 steps ``live_modern``.

Everything here runs on CPU with fakes (injectable timer, faked device properties); a real GPU is
only touched through :class:`CudaEventTimer` and :func:`local_properties`. The local GPU is always
treated as *unseen*: nothing measured here is ever fed to a predictor's ``fit``.

Measurement protocol (paper): warm-up, 25 timed runs, mean of the 5 fastest, FP32 with TF32 off.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, asdict
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

# the harness and the kernel section (live_harness, live_kernels)
from neusight_core.studies.live_harness import (FASTEST, RUNS, WARMUP, DetectedDevice, HarnessConfig,
                                        Measurement, TimeBudget, harness_dtype, free_cuda, is_oom, error_line, gpu_count,
                                        identify, local_properties, measure, no_gpu_reason, section_budget,
                                        set_precision, software_versions)
from neusight_core.studies.live_kernels import conv_kernel_sweep, kernel_sweep, measure_kernels, skipped_measurements
from neusight_core.question.schema import MODES, Attention, Grads, Mode, Plan, Precision


# ---------------------------------------------------------------- whole models on the GPU
def load_model_config(model):
    """trace.load_config when the tracer is there, else the release's HF JSON; a config passes through."""
    if not isinstance(model, str):
        return model
    try:
        from neusight_core.tracing import trace
        return trace.load_config(model)
    except ImportError:
        from transformers import AutoConfig
        from neusight_core import paths
        return AutoConfig.from_pretrained(str(Path(paths.model_configs_dir()) / f"{model}.json"))


def model_callable(model, batch: int, seq: int, mode: str, device: str = "cuda", compile: bool = False,
                   num_layers: int | None = None, dtype=None, past: int = 0) -> Callable[[], object]:
    """Random-weight HF model (eager attention; no KV cache unless ``past``) -> zero-arg inference, decode or
    fwd+bwd call.

    ``num_layers`` cuts the block count (Llama-2-70B: measure fewer layers, scale to the full model).
    ``compile`` wraps the model in torch.compile (the fused case of the paper's -fusion labels).
    ``past`` > 0 (inference): one decode step of ``seq`` new tokens on a KV cache of ``past`` tokens, filled
    once by a prefill here; each call appends to the cache and crops it back, so every call sees ``past``.
    """
    import copy
    import torch
    from transformers import AutoModelForCausalLM, AutoModel, AutoModelForImageClassification
    from neusight_core.data import configs
    cfg = copy.deepcopy(load_model_config(model))
    # an image model (ResNet, ViT) takes a batch of square images of side ``seq``, as the tracer does
    image = configs.is_image_model(cfg)
    if image and past:
        raise ValueError(f"a decode step (past > 0) is for text decoders, not the image model {cfg.model_type!r}")
    if image and hasattr(cfg, "image_size"):
        cfg.image_size = int(seq)
    if num_layers is not None:
        for key in ("num_hidden_layers", "n_layer", "num_layers"):
            if hasattr(cfg, key):
                setattr(cfg, key, int(num_layers))
    cfg.use_cache = bool(past)
    cfg._attn_implementation = Attention.EAGER
    # Built on the device in its dtype: a 13B model initialised on the host in FP32 took minutes and 52 GB
    # of host memory before it reached the GPU, and a BF16 model cast there after an FP32 build needs 1.5x
    # its memory on the GPU. The weights are random either way (the latency does not depend on them).
    dt = dtype or torch.float32
    with torch.device(device):
        if image:
            m = AutoModelForImageClassification.from_config(cfg, dtype=dt)
        else:
            try:
                m = AutoModelForCausalLM.from_config(cfg, dtype=dt)
            except ValueError:
                m = AutoModel.from_config(cfg, dtype=dt)
    m = m.to(device=device, dtype=dt)
    if image:
        inputs = {"pixel_values": torch.randn(batch, int(cfg.num_channels), seq, seq, device=device, dtype=dt)}
    else:
        ids = torch.randint(0, int(cfg.vocab_size), (batch, seq), device=device)
        inputs = {"input_ids": ids}
    run = torch.compile(m) if compile else m
    if past:
        if mode != Mode.INF:
            raise ValueError("a decode step (past > 0) is inference only")
        m.eval()
        with torch.no_grad():
            cache = m(input_ids=torch.randint(0, int(cfg.vocab_size), (batch, int(past)), device=device),
                      use_cache=True).past_key_values

        def decode():
            with torch.no_grad():
                out = run(input_ids=ids, past_key_values=cache, use_cache=True)
            # back to the prompt, so that the next call decodes the same step (a negative crop drops that many
            # tokens: transformers 5.23 refuses a positive one, 4.x and 5.x take this form)
            cache.crop(-int(seq))
            return out
        return decode
    if mode == Mode.INF:
        m.eval()

        def call():
            with torch.no_grad():
                return run(**inputs)
        return call
    m.train()

    def step():
        out = run(**inputs)
        logits = out.logits if hasattr(out, "logits") else out.last_hidden_state
        loss = logits.float().mean()
        loss.backward()          # optimizer step excluded, as in the paper
        m.zero_grad(set_to_none=True)
    return step


def measure_model(model, batch: int, seq: int, mode: str, timer=None, cfg: HarnessConfig | None = None,
                  budget: TimeBudget | None = None, device: str = "cuda", compile: bool = False,
                  num_layers: int | None = None, past: int = 0) -> Measurement:
    """Build + measure one model configuration; OOM while building is recorded like OOM while running. ``seq`` is
    the tracer's size argument (``LiveCase.tracer_size``: an image model's side). On CUDA the peak memory of the whole run (weights + step) is noted in ``last_peak_memory_gib``."""
    global last_peak_memory_gib
    last_peak_memory_gib = None
    # building a large model (and compiling it) takes seconds to minutes: none is started once the budget is spent
    if budget is not None and budget.remaining() <= 0:
        return Measurement("BUDGET", reason="time budget exhausted before this model was built")
    if device == "cuda":
        import torch
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
    try:
        fn = model_callable(model, batch, seq, mode, device, compile, num_layers, dtype=harness_dtype(cfg), past=past)
    except Exception as e:  # noqa: BLE001
        if is_oom(e):
            free_cuda()
            return Measurement("OOM", reason="out of memory building the model")
        return Measurement("ERROR", reason=f"building the model failed: {error_line(e)}")
    try:
        return measure(fn, timer, cfg, budget)
    except Exception as e:  # noqa: BLE001 - e.g. torch.compile without a working compiler on this machine:
        # recorded on this configuration (the tables show it), and the other configurations are still measured
        return Measurement("ERROR", reason=error_line(e))
    finally:
        del fn
        if device == "cuda":
            import torch
            if torch.cuda.is_available():
                last_peak_memory_gib = torch.cuda.max_memory_allocated() / 2**30
        free_cuda()


last_peak_memory_gib: float | None = None   # peak CUDA memory of the last measure_model (GiB)


# ---------------------------------------------------------------- predictions (degrade cleanly)
def predict_live_kernels(kernels: pd.DataFrame, device_name: str, predictor: str = "neusight",
                    quick: bool = False) -> tuple[np.ndarray | None, str | None]:
    """Per-row predicted ms, or (None, reason) when the predictors/catalogue are not available."""
    try:
        from neusight_core.data import devices
        from neusight_core import predictors
        dev = devices.get_device(device_name)
        return np.asarray(predictors.get(predictor, quick=quick).predict(kernels, dev), float), None
    except Exception as e:  # noqa: BLE001 - reported, never replaced by a number
        return None, f"prediction unavailable: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


NOT_POSSIBLE = "not possible: "


def predict_case(case: "LiveCase", device_name: str, **kw) -> tuple[dict | None, str | None]:
    """latency.predict_model's headline numbers for ``case`` on ``device_name``, or (None, reason); in the paper's
    setting (eager attention, the kernel sum: ``scenario.PAPER``, what these sections measure) but for the
    gradients, which ``model_callable``'s step sets to None after each step (``grads`` fresh; pipeline parallelism
    accumulates its micro-batches', the authors' pp labels too), unless ``kw`` says otherwise."""
    from neusight_core.cost import latency
    from neusight_core.question.step import PAPER
    grads = Grads.ACCUMULATE if kw.get("parallel") == Plan.PP else Grads.FRESH
    try:
        r = latency.predict_model(case.model, device_name, case.batch, mode=case.mode, **case.size,
                                  **{**PAPER, "grads": grads, **kw})
        out = {k: float(r[k]) for k in ("e2e_ms", "fw_ms", "bw_ms", "acc_ms", "comm_ms") if k in r}
        mem = r.get("memory") or {}
        out.update({f"mem_{k}": float(mem[k]) for k in ("total_gib", "weights_gib", "activations_gib", "kv_cache_gib") if k in mem})
        if "fits" in mem:
            out["mem_fits"] = bool(mem["fits"])
        return out, None
    except latency.LatencyInputError as e:  # the configuration cannot run there: an answer, not a failure
        return None, f"{NOT_POSSIBLE}{str(e).splitlines()[0]}"
    except Exception as e:  # noqa: BLE001
        return None, f"prediction unavailable: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


# ---------------------------------------------------------------- scenarios
#: run_live's sections of model scenarios (one row per scenario, ``predicted`` and ``measured_ms``), in order
MODEL_SECTIONS = ("paper", "llama", "vision", "parallel")


@dataclass(frozen=True)
class LiveCase:
    """One configuration notebook 05 measures on the local GPU and predicts (not a ``scenario.Scenario``: it
    names the case, the GPU it is stated for and whether it extends the paper). A text model has a ``seq``, an image
    model an ``image_size`` (its side in pixels), as in a Scenario."""
    name: str
    model: str
    batch: int
    seq: int | None                # tokens per sample; None for an image model
    mode: str                      # inf | train
    parallel: str | None = None    # dp | tp | pp
    gpus: int = 1
    gpu: str = ""                  # catalogue GPU the scenario is stated for ("" = local/target)
    extension: bool = False
    note: str = ""
    past: int = 0                  # KV-cache length for a decode step (extension)
    image_size: int | None = None  # an image model's side in pixels; None for a text model

    @property
    def size(self) -> dict:
        """The size as ``latency.predict_model`` takes it: ``seq`` of a text model, ``image_size`` of an image model."""
        return {"seq": self.seq} if self.image_size is None else {"image_size": self.image_size}

    @property
    def tracer_size(self) -> int:
        """The size as the tracer and ``measure_model`` take it (``scenario.tracer_size``)."""
        from neusight_core.cost.scenario import tracer_size
        return tracer_size(vars(self))


# sequence length of each paper model in the release's label names
SEQ = {"bert_large": 512, "switchxl4": 512, "gpt2_large": 1024, "gpt3_xl": 2048, "gpt3_27": 2048, "opt_13": 2048}


def paper_scenarios(models=None, batches=None, quick: bool = False) -> list[LiveCase]:
    models = models or (["gpt2_large"] if quick else ["bert_large", "gpt2_large", "gpt3_xl", "opt_13", "gpt3_27"])
    batches = batches or ([4] if quick else [2, 4, 8])
    out = []
    for m in models:
        seq = SEQ.get(m, 2048)
        for b in batches:
            for mode in MODES:
                out.append(LiveCase(f"{m}-{mode}-{seq}-{b}", m, b, seq, mode))
    return out


def llama_scenarios(quick: bool = False) -> list[LiveCase]:
    s = [LiveCase("llama2_7b-prefill-2048", "llama2_7b", 1, 2048, Mode.INF, extension=True),
         LiveCase("llama2_13b-prefill-2048", "llama2_13b", 1, 2048, Mode.INF, extension=True),
         LiveCase("llama2_70b-prefill-2048", "llama2_70b", 1, 2048, Mode.INF, extension=True,
                  note="measured with fewer layers; full model = measured x 80 / measured layers "
                       "(transformer blocks are identical; embedding/head counted once, a small error)")]
    # one decode step after a 2048-token prompt: 1 new token attending to 2048 cached ones
    s += [LiveCase(f"{m}-decode-after-2048", m, 1, 1, Mode.INF, extension=True, past=2048,
                   note="one decode step on a KV cache of 2048 tokens (measured with the cache filled by a prefill, "
                        "cropped back after each step)")
          for m in ("llama2_7b", "llama2_13b", "llama2_70b")]
    return [s[0], s[3]] if quick else s


def vision_scenarios(quick: bool = False) -> list[LiveCase]:
    """ResNet-50 and ViT-B/16 at 224 x 224, inference and training, in the paper's protocol (FP32, TF32
    off): models the paper did not measure, so extensions."""
    note = "image model"
    s = [LiveCase(f"{m}-{mode}-224px-{b}", m, b, None, mode, extension=True, note=note, image_size=224)
         for m, mode, b in (("resnet50", Mode.INF, 32), ("resnet50", Mode.INF, 128), ("resnet50", Mode.TRAIN, 64),
                            ("vit_b16", Mode.INF, 32), ("vit_b16", Mode.TRAIN, 32))]
    return s[:1] if quick else s


def parallel_scenarios() -> list[LiveCase]:
    return [LiveCase("gpt2_large-train-dp8-a100", "gpt2_large", 8, 1024, Mode.TRAIN, Plan.DP, 8, "NVIDIA_A100-SXM4-40GB", True),
            LiveCase("llama2_13b-inf-tp4-a100", "llama2_13b", 1, 2048, Mode.INF, Plan.TP, 4, "NVIDIA_A100-SXM4-40GB", True),
            LiveCase("gpt2_large-train-1024-4-dp4", "gpt2_large", 4, 1024, Mode.TRAIN, Plan.DP, 4, "NVIDIA_A100-SXM4-40GB"),
            LiveCase("gpt2_large-train-1024-4-tp4", "gpt2_large", 4, 1024, Mode.TRAIN, Plan.TP, 4, "NVIDIA_A100-SXM4-40GB"),
            LiveCase("gpt2_large-train-1024-4-pp4_1", "gpt2_large", 4, 1024, Mode.TRAIN, Plan.PP, 4, "NVIDIA_A100-SXM4-40GB")]


def multi_gpu_skip_reason(needed: int) -> str | None:
    have = gpu_count()
    return None if have >= needed else f"needs {needed} GPUs, this machine has {have}"


def author_label(device_name: str, scenario_name: str) -> float | None:
    """The authors' measured e2e latency (ms) for the same GPU/config, if the release has it."""
    try:
        from neusight_core import paths
        p = Path(paths.labels_dir()) / device_name / f"{scenario_name}.json"
        return float(json.loads(p.read_text())["e2e_latency"]) if p.exists() else None
    except Exception:  # noqa: BLE001
        return None


def label_gap(measured_ms, label_ms, threshold_pct: float | None = None) -> dict:
    """Our measurement vs the authors' label for the same GPU/config; further apart than ``threshold_pct`` (default
    ``targets.yaml`` live.label_gap_pct, 15 %) = the software stack differs."""
    from neusight_core.studies import error_metric, targets
    threshold_pct = targets.section("live")["label_gap_pct"] if threshold_pct is None else threshold_pct
    gap = float(error_metric.ape(label_ms, measured_ms)) if (measured_ms is not None and label_ms) else None
    return {"author_label_ms": label_ms, "label_gap_pct": gap,
            "flag_stack_differs": None if gap is None else bool(gap > threshold_pct)}


def write_json(output_dir, name: str, body: dict) -> Path:
    from neusight_core.data import datafile
    from neusight_core import paths
    p = paths.out_dir(output_dir) / f"{name}.json"
    p.write_text(json.dumps(datafile.jsonable(body), indent=2, allow_nan=False))
    return p


def detected_to_dict(d: DetectedDevice) -> dict:
    x = asdict(d) if d.device is None else {**{k: v for k, v in asdict(d).items() if k != "device"},
                                           "device": asdict(d.device) if hasattr(d.device, "__dataclass_fields__") else str(d.device)}
    x["estimated_fields"] = list(d.estimated_fields)
    return x


# ---------------------------------------------------------------- the notebook's driver
def run_live(output_dir, quick: bool = False, models=None, batches=None, time_budget_s: float = 3600,
             target_gpu: str = "NVIDIA_H100_80GB_HBM3", precision: str = Precision.FP32, timer=None,
             llama_precision: str = Precision.BF16) -> dict:
    """Every section of notebooks/05_live_gpu: measure what the machine allows, predict the rest.

    ``precision`` is that of the paper's models (fp32 = the paper's protocol); ``llama_precision`` that
    of the Llama-2 scenarios (bf16 by default, as people run them; "fp32" = the paper's protocol),
    predicted with ``dtype=llama_precision`` and measured in it. Every model scenario carries the
    predicted memory (``predicted_mem_*``, without optimizer state: the measured step has no optimizer step)
    and, on a GPU, ``measured_peak_gib`` (``torch.cuda.max_memory_allocated`` of the run: weights + one step).

    Without a GPU every measured field is null with ``skipped_reason``; predictions are made for
    ``target_gpu`` and labelled prediction-only. Writes live_*.json, fusion_*.json, parallel_*.json.
    """
    from neusight_core.studies import error_metric
    budget = TimeBudget(time_budget_s)
    skip = no_gpu_reason()
    props = local_properties()
    det = identify(props) if props else None
    # An unknown local GPU is predicted with its derived catalogue entry (the warning names the
    # estimated fields); without a GPU, predictions are for target_gpu.
    dev_name = det.name if det and det.known else target_gpu
    dev_arg = det.device if det and not det.known and det.device is not None else dev_name
    if dev_arg is not dev_name:
        dev_name = dev_arg.name
    head = {"device": detected_to_dict(det) if det else None, "predicted_for": dev_name,
            "prediction_only": det is None, "precision": precision,
            "precision_label": "paper protocol (FP32, TF32 off)" if precision == Precision.FP32 else f"extension: {precision}",
            "protocol": f"{WARMUP} warm-up, {RUNS} timed runs, mean of {FASTEST} fastest (CUDA events)",
            "software": software_versions(), "skipped_reason": skip}
    cfg = HarnessConfig(precision=precision)
    if not skip:
        set_precision(precision)

    # kernels
    k = pd.concat([kernel_sweep(quick), conv_kernel_sweep(quick)], ignore_index=True)
    k = skipped_measurements(k, skip) if skip else measure_kernels(k, timer, cfg, section_budget(budget, "kernels"))
    pred, why = predict_live_kernels(k, dev_arg, quick=quick)
    k["pred_ms"] = pred if pred is not None else None
    k["pred_reason"] = why
    if pred is not None:
        k["ape"] = [error_metric.ape(m, p) if m is not None and not pd.isna(m) else None for m, p in zip(k["measured_ms"], pred)]
    write_json(output_dir, "live_kernels", {**head, "rows": k.to_dict(orient="records")})

    def _models(scen, name, prec=precision, section=None):
        rows = []
        sbudget = section_budget(budget, section) if section else budget
        mcfg = cfg if prec == precision else HarnessConfig(precision=prec)
        for s in scen:
            # optimizer "none": the measured training step has no optimizer step (the paper's protocol), so its
            # peak memory holds no optimizer state; the predicted memory is that of the same step
            p, why = predict_case(s, dev_arg if not s.gpu else s.gpu, quick=quick,
                                   **({"parallel": s.parallel, "gpus": s.gpus} if s.parallel else {}),
                                   **({"past": s.past} if s.past else {}), dtype=prec, optimizer="none")
            mskip = skip or (multi_gpu_skip_reason(s.gpus) if s.gpus > 1 else None)
            if not mskip and s.gpus > 1:
                mskip = "multi-GPU measurement (torch.distributed, one process per GPU) not implemented in this version"
            meas, layers, peak = None, None, None
            if not mskip:
                layers = 8 if s.model == "llama2_70b" else None
                if prec != precision:
                    set_precision(prec)
                mm = measure_model(s.model, s.batch, s.tracer_size, s.mode, timer, mcfg, sbudget, num_layers=layers,
                                   past=s.past)
                peak = None if layers else last_peak_memory_gib   # a cut 70B model's memory is not the model's
                if prec != precision:
                    set_precision(precision)
                meas = mm.mean_ms if mm.status == "OK" else None
                mskip = None if mm.status == "OK" else f"{mm.status}: {mm.reason}"
            full = meas * 80 / layers if (meas is not None and layers) else meas
            rows.append({**asdict(s), "precision": prec, "predicted": p, "predicted_reason": why, "measured_ms": full,
                         "measured_layers": layers, "measured_peak_gib": peak, "skipped_reason": mskip,
                         **label_gap(full, author_label(dev_name if not s.gpu else s.gpu, s.name))})
        write_json(output_dir, name, {**head, "rows": rows})
        return rows

    paper = _models(paper_scenarios(models, batches, quick), "live_models", section="paper")
    llama = _models(llama_scenarios(quick), "live_llama", llama_precision, section="llama")
    vision = _models(vision_scenarios(quick), "live_vision", section="vision")
    fus = []
    fbudget = section_budget(budget, "fusion")
    for s in paper_scenarios(models, batches, quick):
        if s.mode != Mode.INF:
            continue
        pe, w1 = predict_case(s, dev_arg, fusion=False, quick=quick)
        pf, w2 = predict_case(s, dev_arg, fusion=True, quick=quick)
        me = mc = None
        if not skip:
            me = measure_model(s.model, s.batch, s.tracer_size, s.mode, timer, cfg, fbudget)
            mc = measure_model(s.model, s.batch, s.tracer_size, s.mode, timer, cfg, fbudget, compile=True)
        fus.append({**asdict(s), "pred_eager": pe, "pred_fused": pf, "predicted_reason": w1 or w2,
                    "measured_eager_ms": me.mean_ms if me else None, "measured_compile_ms": mc.mean_ms if mc else None,
                    "skipped_reason": skip or "; ".join(f"{x.status}: {x.reason}" for x in (me, mc) if x.status != "OK") or None,
                    "author_label_fusion_ms": author_label(dev_name, s.name + "-fusion")})
    write_json(output_dir, "fusion_live", {**head, "rows": fus})
    par = _models(parallel_scenarios(), "parallel_live")
    return {"head": head, "kernels": k, "paper": pd.DataFrame(paper), "llama": pd.DataFrame(llama),
            "vision": pd.DataFrame(vision),
            "fusion": pd.DataFrame(fus), "parallel": pd.DataFrame(par), "skip": skip}
