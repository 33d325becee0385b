"""How a mixture-of-experts layer's kernels split over the GPUs of the ``tp`` and ``ep`` plans (``parallel.py``).

Hugging Face runs the experts of most MoE families as grouped GEMMs (``aten_ops.grouped_gemm``: the gate and up
projections of every expert in one kernel, then the down projection) inside a module named ``...experts``; the
routed tokens are gathered into S = tokens x top-k stacked rows before them and weighted and summed after them.
Attention and the dense layers split the Megatron way in both plans; the experts split one of two ways:

* ``tp``: every GPU holds a 1/n slice of every expert's intermediate dim (gate and up column-parallel, down
  row-parallel; vLLM's and SGLang's default for MoE layers). The GEMMs and the element-wise kernels on the
  intermediate dim shrink n-fold; the kernels on the S routed rows x hidden (gathering tokens, weighting the
  experts' outputs) run whole on every GPU.
* ``ep``: every GPU holds G / n whole experts and runs the routed rows that reach them: under the tracer's balanced
  routing ceil(S / n) of the S rows over min(G / n, ceil(S / n)) reached experts (expert parallelism over the
  tensor-parallel GPUs, as vLLM's ``--enable-expert-parallel`` without data-parallel attention). Every kernel on the
  S routed rows shrinks n-fold; those on the tokens (the final sum into the hidden state) do not.

Both end with an all-reduce of the layer's output (tokens x hidden) in forward and of its input gradient in backward:
each token's expert outputs are partial sums spread over the GPUs. A shared expert (Qwen2-MoE, DeepSeek) is a plain
MLP and splits as one, with its own all-reduce (frameworks fold it into the experts' one: a small over-count).

Each GPU's grouped GEMMs are those ``aten_ops.grouped_gemm`` gives for that GPU's operands (``per_gpu``), so that
NVIDIA's measured MoE layers of each tensor- and expert-parallel degree check them (``studies/moe_eval.py``).
"""
from __future__ import annotations

import functools
import math
import re

from neusight_core.question import schema
from neusight_core.question.schema import OpClass, Plan

#: config keys of the number of routed experts and of the experts each token reaches, across the families
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
TOP_K_KEYS = ("num_experts_per_tok", "moe_topk", "top_k")
_EXPERTS = re.compile(r"(?:^|\.)experts$")


class ExpertSplitError(ValueError):
    """An MoE layer that cannot be split as asked (``parallel.PlanError`` subclasses the same base)."""


def experts_of(config: dict) -> int | None:
    """The number of routed experts a config names, or None (a dense model)."""
    for key in EXPERT_KEYS:
        v = config.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 1:
            return v
    return None


def holds_experts(module: str) -> bool:
    """Whether ``module`` is a module holding every expert's weights as stacked parameters (``...experts``)."""
    return bool(_EXPERTS.search(module))


def per_gpu(S: int, G: int, k: int, n: int, ep: int = 1, wgrad: bool = False) -> dict:
    """One GPU's grouped GEMM of S routed rows over G experts with weights k x n (tensor parallelism: k or n already
    the GPU's slice), over ``ep`` expert-parallel GPUs: G / ep experts and ceil(S / ep) rows each. Dims, FLOPs and the
    experts reached are ``aten_ops.grouped_gemm``'s for that GPU's operands (the tracer's one rule, balanced
    routing); bytes are the operands' as the tracer counts them (2-byte operands, only the reached experts' weights
    read, int32 offsets). ``wgrad``: the weight gradient, (k, S) x (S, n) into every expert's (k, n)."""
    return dict(_per_gpu(int(S), int(G), int(k), int(n), int(ep), bool(wgrad)))


@functools.lru_cache(maxsize=None)
def _per_gpu(S: int, G: int, k: int, n: int, ep: int, wgrad: bool) -> tuple:
    import torch

    from neusight_core.tracing.aten_ops import grouped_gemm
    S, G = -(-S // ep), G // ep
    meta = {"device": "meta"}
    a, b = (torch.empty(k, S, **meta), torch.empty(S, n, **meta)) if wgrad else \
        (torch.empty(S, k, **meta), torch.empty(G, k, n, **meta))
    B, M, N, K, flops, share = grouped_gemm((a, b, torch.empty(G, dtype=torch.int32, **meta)))
    read = sum(int(round(share.get(i, 1.0) * 2 * t.numel())) for i, t in enumerate((a, b))) + 4.0 * G
    written = 2.0 * G * k * n if wgrad else 2.0 * S * n
    return (("B", float(B)), ("M", float(M)), ("N", float(N)), ("K", float(K)), ("flops", float(flops)),
            ("bytes_read", float(read)), ("bytes_written", written))


def _scale(r: dict, d: int) -> None:
    """FLOPs and bytes of a kernel that works on 1/d of its data (the caller cuts its rows B or its last dim H)."""
    r["flops"], r["bytes_read"], r["bytes_written"] = r["flops"] / d, r["bytes_read"] / d, r["bytes_written"] / d


def split(recs: list[dict], config: dict, hidden: int, n: int, how: str) -> tuple[set, list[tuple]]:
    """Rewrite in place the rows of ``recs`` (a trace's records) that belong to experts modules running grouped GEMMs,
    for one of ``n`` GPUs splitting them ``how`` (``tp`` | ``ep``, the plan's name). Returns (indices rewritten,
    [(index of an experts module's last forward / backward row, phase, the module)] after which the caller inserts
    the layer's all-reduce)."""
    mods = {r["module"] for r in recs if r["sub_op"] == schema.GROUPED_GEMM and holds_experts(r["module"])}
    if not mods and any(r["op_class"] == OpClass.BMM and holds_experts(r["module"]) for r in recs):
        # Llama 4 in transformers: every expert's batched GEMM over every token, weighted by the router's scores
        raise ExpertSplitError(f"{how}{n}: the model's experts run as batched GEMMs of every expert over every token "
                               "(its Hugging Face implementation), whose split over GPUs is not modelled")
    if not mods:
        if how == Plan.EP:
            raise ExpertSplitError(f"{how}{n}: the model has no mixture-of-experts layer whose experts run as grouped "
                                   "GEMMs, nothing to spread over GPUs; use tp")
        return set(), []
    G = experts_of(config)
    if G is None:
        raise ExpertSplitError(f"{how}{n}: the config names no expert count ({', '.join(EXPERT_KEYS)})")
    if how == Plan.EP and G % n:
        raise ExpertSplitError(f"{how}{n}: the {G} experts do not spread evenly over {n} GPUs")

    def family(m: str) -> str | None:
        """The experts module a row belongs to (its own module, a child such as act_fn, or a parameter's ``acc``)."""
        for p in (m, m.rpartition(".")[0]):
            if p in mods:
                return p
        return None

    fw = [r for r in recs if r["phase"] == "fw" and r["sub_op"] == schema.GROUPED_GEMM and r["module"] in mods]
    S = int(fw[0]["M"])                                     # routed rows: the stacked forward GEMMs' M
    inter = {int(r["K"]) for r in fw if int(r["N"]) == hidden} | {int(r["N"]) for r in fw if int(r["K"]) == hidden}
    if how == Plan.TP:
        if not inter or hidden in inter:
            raise ExpertSplitError(f"{how}{n}: cannot tell the experts' intermediate dim from the hidden size "
                                   f"{hidden}; expert parallelism (ep) splits them by expert")
        bad = [i for i in inter if i % n]
        if bad:
            raise ExpertSplitError(f"{how}{n}: the experts' intermediate dim {bad[0]} is not divisible by {n}")
    done, last = set(), {}
    for i, r in enumerate(recs):
        m = family(r["module"])
        if m is None:
            continue
        done.add(i)
        if r["phase"] in ("fw", "bw"):
            last[(m, r["phase"])] = i
        if r["sub_op"] == schema.GROUPED_GEMM:
            _grouped(r, S, G, hidden, inter, n, how)
        elif r["phase"] == "acc":                          # an expert weight's gradient: 1/n of it on each GPU
            r["B"] = float(math.ceil(r["B"] / n))
            _scale(r, n)
        elif how == Plan.TP and int(_num(r["H"])) in inter:    # on the intermediate dim (activation, gate x up)
            r["H"] = float(math.ceil(r["H"] / n))
            _scale(r, n)
        elif how == Plan.EP and (_num(r["B"]) == S or (_num(r["B"]) == 1 and _num(r["H"]) == S)):   # on the routed rows
            if _num(r["B"]) == S:
                r["B"] = float(math.ceil(S / n))
            else:
                r["H"] = float(math.ceil(S / n))
            _scale(r, n)
    return done, sorted((i, ph, m) for (m, ph), i in last.items())


def _num(v) -> float:
    return -1.0 if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def _grouped(r: dict, S: int, G: int, hidden: int, inter: set, n: int, how: str) -> None:
    """One grouped GEMM row rewritten as ``per_gpu`` gives it: stacked (the forward and the input gradients: M = S)
    or the weight gradient (a batch of experts over weight dims M x K)."""
    M, N, K = int(r["M"]), int(r["N"]), int(r["K"])
    stacked = int(r["B"]) == 1 and M == S
    k, nn = (N, K) if stacked else (M, K)
    if how == Plan.TP:
        if nn in inter and k == hidden:
            nn //= n
        elif k in inter and nn == hidden:
            k //= n
        else:
            raise ExpertSplitError(f"{how}{n}: a grouped GEMM {M} x {N} x {K} of the experts matches neither their "
                                   f"hidden size {hidden} nor their intermediate dim")
    r.update(per_gpu(S, G, k, nn, n if how == Plan.EP else 1, wgrad=not stacked))
