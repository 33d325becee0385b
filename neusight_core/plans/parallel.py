"""Parallel plans on one server: the per-GPU kernel table under DP, TP (Megatron) or PP.

``apply_plan(kernels, plan, n, micro_batches=1)`` takes a table from ``trace.trace_model`` (its
``TableInfo`` carries the config, batch, sequence and mode) and returns the kernel table ONE GPU runs,
with communication rows (``op_class == "COMM"``, ``phase == "comm"``) that carry ``comm_kind``
(``allreduce`` | ``sendrecv``), ``comm_bytes`` (bytes of the buffer each GPU contributes) and
``overlap`` (True if it may overlap backward compute). Timing them is the network model's job.

* ``dp``: the global batch is split, every GPU traces batch / n; after backward each parameter
  module's gradient (weight and bias together, as the authors' op graphs group them) is
  all-reduced, overlappable with the rest of backward (PyTorch DDP buckets do this).
* ``tp``: Megatron-LM splits (Shoeybi et al. 2019, section 3): QKV and FC1 column-parallel,
  attention output and FC2 row-parallel, heads and the FFN intermediate split by n, vocabulary-
  parallel embedding and LM head. Every kernel between a column- and its row-parallel linear
  works on 1/n of the data, except with grouped-query attention beyond as many GPUs as KV heads:
  every GPU then keeps one KV head (replicated, ``kv_ways``), so the K/V projections and the
  forward kernels on K/V work on 1/KV-heads of theirs. All-reduce of the activation after the
  attention output and FC2 in forward, and of the input gradient before QKV and FC1 in backward
  (the f/g operators); one all-reduce after the vocab-parallel embedding lookup (forward), one for
  the LM head's input gradient (backward), and three small ones of the vocab-parallel cross-entropy
  (max, sum, target logit; forward).
* ``pp``: n stages of consecutive layers (embedding on the first, final norm/head/loss on the
  last), the batch split into ``micro_batches`` micro-batches; the table is one micro-batch with a
  ``stage`` per row and a send/recv of the boundary activation (forward) and of its gradient
  (backward) between consecutive stages.
"""
from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from neusight_core.question.step import Step
from neusight_core.tracing import trace
from neusight_core.tracing import table_info
from neusight_core.plans import parallel_experts
from neusight_core.question import schema
from neusight_core.question.schema import Mode, OpClass, Plan


#: the element-wise, row-wise and memory kernels: split with the tensor they read, not as a GEMM
_ROW_CLASSES = schema.op_classes(lambda c: c.is_vector or c.is_memory)


class PlanError(ValueError):
    """A parallel plan that cannot be applied (unknown plan, n < 1, batch not divisible...)."""


# Megatron split of HF module names (suffix match on the module path).
_COLUMN = re.compile(r"(?:^|\.)(c_attn|q_proj|k_proj|v_proj|qkv_proj|query_key_value|query|key|value|"
                     r"c_fc|fc1|gate_proj|up_proj|dense_h_to_4h|wi|wi_0|wi_1|q|k|v|lm_head|decoder)$")
_ROW = re.compile(r"(?:^|\.)(attn\.c_proj|mlp\.c_proj|o_proj|out_proj|attention\.output\.dense|"
                  r"output\.dense|fc2|down_proj|dense_4h_to_h|wo|o|c_proj)$")
EMBED_MODULE = re.compile(r"(?:^|\.)(wte|embed_tokens|word_embeddings|shared|embed_in)$")
KV_MODULE = re.compile(r"(?:^|\.)(k_proj|v_proj|key|value|k|v)$")            # separate K and V projections
_FUSED_QKV = re.compile(r"(?:^|\.)(c_attn|qkv_proj|query_key_value|Wqkv)$")


def heads_of(config: dict) -> tuple[int | None, int | None]:
    """(attention heads, key/value heads) of a config dict; KV heads = heads without grouped-query attention."""
    heads = config.get("num_attention_heads") or config.get("n_head") or config.get("num_heads")
    kv = config.get("num_key_value_heads") or heads
    return (int(heads) if heads else None), (int(kv) if kv else None)


def kv_ways(config: dict, n: int) -> int:
    """Ways tensor parallelism over n GPUs splits the K/V heads: n while n <= KV heads; beyond, every GPU
    keeps one KV head (replicated n / KV-heads times, as Megatron-LM and vLLM do), so min(n, KV heads)
    for grouped-query attention (n for models without it). K/V projection weights, their GEMMs and the KV
    cache per GPU are 1 / kv_ways of the whole."""
    heads, kv = heads_of(config)
    return min(n, kv) if heads and kv and kv < heads else n


def module_kind(module: str) -> str:
    if _ROW.search(module):
        return "row"
    if _COLUMN.search(module):
        return "col"
    return ""


def _comm_row(phase_after: str, kind: str, nbytes: float, overlap: bool, module: str, layer: int,
              stage: int = 0) -> dict:
    nan = math.nan
    return {"phase": "comm", "aten_op": f"comm.{kind}", "op_class": OpClass.COMM, "sub_op": "",
            "B": nan, "M": nan, "N": nan, "K": nan, "H": nan, "flops": 0.0, "bytes_read": 0.0,
            "bytes_written": 0.0, "dtype": "float32", "module": module, "layer": layer, "count": 1,
            "comm_kind": kind, "comm_bytes": float(nbytes), "overlap": bool(overlap),
            "stage": stage, "reads": (), "writes": (), "after": phase_after}


def _elem(kernels: pd.DataFrame) -> float:
    """Bytes per element of the trace's activations/gradients (its ``TableInfo.dtype``; an fp8 step's are bf16)."""
    return float(schema.Precision(table_info.info(kernels).dtype).activations.bytes)


def _retrace(kernels: pd.DataFrame, batch: int) -> pd.DataFrame:
    a = table_info.info(kernels)
    if batch == a.batch:
        return kernels.copy()
    k = trace.trace_model(Step(model=a.config, batch=batch, seq=a.seq, mode=a.mode, dtype=a.dtype, attention=a.attention))
    if a.fused:  # a fused table stays fused at the new batch
        from neusight_core.plans import fusion

        k = fusion.fuse(k)
    return k


def _insert(k: pd.DataFrame, inserts: list[tuple[int, dict]]) -> pd.DataFrame:
    """Insert rows after the given positions (position -1 = at the start), keeping order."""
    recs = k.to_dict("records")
    by_pos: dict[int, list[dict]] = {}
    for pos, row in inserts:
        by_pos.setdefault(pos, []).append(row)
    out = list(by_pos.get(-1, []))
    for i, r in enumerate(recs):
        out.append(r)
        out.extend(by_pos.get(i, []))
    cols = list(k.columns)
    return table_info.carry(pd.DataFrame.from_records(out, columns=cols), k)


# ------------------------------------------------------------------------------------------ DP
def _dp(kernels: pd.DataFrame, n: int) -> pd.DataFrame:
    a = table_info.info(kernels)
    if a.batch % n:
        raise PlanError(f"dp{n}: global batch {a.batch} is not divisible by {n}")
    k = _retrace(kernels, a.batch // n).reset_index(drop=True)
    if a.mode != Mode.TRAIN:
        return k  # inference: each GPU serves its share of the batch, nothing to synchronise
    params = table_info.info(k).params
    groups: dict[str, int] = {}
    for name, numel in params.items():
        mod = name.rsplit(".", 1)[0]
        groups[mod] = groups.get(mod, 0) + numel
    # all-reduce a module's gradients once its last gradient kernel has run
    last: dict[str, int] = {}
    bw = k.index[k.phase.isin(["bw", "acc"])]
    for i in bw:
        m = k.at[i, "module"]
        mod = m.rsplit(".", 1)[0] if k.at[i, "phase"] == "acc" else m
        if mod in groups:
            last[mod] = i
    end = int(bw.max()) if len(bw) else len(k) - 1
    inserts = [(last.get(mod, end), _comm_row("bw", "allreduce", _elem(k) * numel, True, mod,
                                              trace.layer_of(mod)))
               for mod, numel in groups.items()]
    return _insert(k, inserts)


# ------------------------------------------------------------------------------------------ TP
def tp_split(kernels: pd.DataFrame, n: int, experts: str = Plan.TP) -> pd.DataFrame:
    """The Megatron split (module doc) of one of ``n`` GPUs; a mixture-of-experts layer's experts split ``experts``
    (``tp``: by their intermediate dim; ``ep``: by expert; ``parallel_experts``)."""
    k = kernels.copy().reset_index(drop=True)
    a = table_info.info(k)
    tokens = a.batch * a.seq
    hidden, vocab = a.hidden, a.vocab
    kinds = {m: module_kind(m) for m in k.module.unique()}
    e = _elem(k)   # bytes per element (4 in FP32, the paper's setting)
    heads, kv = heads_of(a.config)
    if kv and heads and kv < heads:     # grouped-query attention: K/V heads replicated beyond kv GPUs
        if kv % n and n % kv:
            raise PlanError(f"{experts}{n}: the {kv} key/value heads can neither be split evenly over {n} GPUs nor "
                            f"replicated evenly; use a GPU count that divides or is a multiple of {kv}")
        fused = [m for m in kinds if _FUSED_QKV.search(m)]
        if fused and n > kv:
            raise PlanError(f"{experts}{n}: {fused[0]} fuses Q, K and V of a model with {kv} key/value heads; "
                            f"splitting it over more GPUs than key/value heads is not modelled")
    kvw = kv_ways(a.config, n)

    def ways(module: str) -> int:
        """How many ways a split linear (or its parameter's row) is divided."""
        return kvw if KV_MODULE.search(module) else n

    # (in, out) of every split linear from its forward GEMM
    fw_gemm = k[(k.phase == "fw") & (k.op_class == OpClass.LINEAR)]
    shape = {}
    for m, g in fw_gemm.groupby("module"):
        if kinds.get(m):
            shape[m] = (int(g.N.iloc[0]), int(g.K.iloc[0]))
    # only modules that run a GEMM themselves are split linears (T5's "decoder" stack is not)
    kinds = {m: (kd if m in shape else "") for m, kd in kinds.items()}
    for m, (i, o) in shape.items():
        if m.endswith(("lm_head", "decoder")):
            continue  # vocabulary: Megatron pads it to a multiple of n (ceil below)
        if kinds[m] == "col" and o % ways(m):
            raise PlanError(f"{experts}{n}: {m} has {o} output features, not divisible by {ways(m)}")
        if kinds[m] == "row" and i % n:
            raise PlanError(f"{experts}{n}: {m} has {i} input features, not divisible by {n}")

    # modules whose forward element-wise/copy kernels run inside a column->row region
    inside, votes = False, {}
    for i in k.index[k.phase == "fw"]:
        m, c = k.at[i, "module"], k.at[i, "op_class"]
        if c == OpClass.LINEAR and kinds.get(m) == "col" and m in shape:
            inside = not m.endswith("lm_head") and not m.endswith("decoder")
            continue
        if c == OpClass.LINEAR and kinds.get(m) == "row":
            inside = False
            continue
        if c in schema.GEMM_CLASSES:
            votes.setdefault(m, []).append(inside)
            continue
        votes.setdefault(m, []).append(inside)
    sharded = {m for m, v in votes.items() if sum(v) * 2 > len(v)}
    split_h = {o // 1 for m, (i, o) in shape.items() if kinds[m] == "col"}

    # first kernel of the vocab-parallel loss, located before the vocabulary dims are split
    loss = k.index[(k.phase == "fw") & (k.H == vocab) & (k.op_class != OpClass.LINEAR)] if vocab else []
    recs = k.to_dict("records")
    vocab_h = {vocab} if vocab else set()
    # K/V heads replicated (n > KV heads): forward kernels on K/V (rotary embedding, the cache append) work
    # on 1/kvw of the whole, not 1/n; they are found by following the K/V projections' output buffers
    # through kernels that write no more than they read. repeat_kv's copy to the query heads (it writes
    # more than it reads) reads them at 1/kvw and writes 1/n. Backward kernels keep the 1/n split.
    kv_bufs = set()
    if kvw != n and "reads" in k.columns:
        for r in recs:
            if r["phase"] == "fw" and r["op_class"] == OpClass.LINEAR and r["module"] in shape and KV_MODULE.search(r["module"]):
                kv_bufs.update(b for b, _ in r["writes"])
    try:
        moe_rows, moe_ends = parallel_experts.split(recs, a.config, hidden, n, experts)
    except parallel_experts.ExpertSplitError as err:
        raise PlanError(str(err)) from None
    for j, r in enumerate(recs):
        if j in moe_rows:
            continue
        ph, c, m = r["phase"], r["op_class"], r["module"]
        split, d = False, n
        if c == OpClass.LINEAR and m in shape:
            fi, fo = shape[m]
            D = fo if kinds[m] == "col" else fi
            M, N = int(r["M"]), int(r["N"])
            if ph == "fw":
                pos = "K" if kinds[m] == "col" else "N"
            elif M == tokens and N != tokens:      # input gradient dY W: (T, out, in)
                pos = "N" if kinds[m] == "col" else "K"
            else:                                  # weight gradient: D sits in M or K
                pos = "M" if M == D else "K"
            r[pos] = float(math.ceil(r[pos] / ways(m)))
            # traffic of the sliced GEMM from its new dims (the unsplit operand is still read whole); an fp8 GEMM
            # reads its operands at one byte each (trace.fp8_linear_rows) and writes BF16
            e_in = schema.Precision(r["precision"]).bytes if r["precision"] == schema.Precision.FP8 else e
            bias = e_in * r["K"] if "addmm" in r["aten_op"] else 0.0
            r["bytes_read"] = e_in * (r["M"] * r["N"] + r["N"] * r["K"]) + bias
            r["bytes_written"] = e * r["M"] * r["K"]
            r["flops"] = 2.0 * r["M"] * r["N"] * r["K"]
            continue
        elif c == OpClass.BMM:
            if m in sharded:
                r["B"] = float(math.ceil(r["B"] / n))
                split = True
        elif c == OpClass.ATTN:
            # fused attention: each GPU runs its 1/n of the query heads and 1/kvw of the K/V heads;
            # FLOPs and traffic follow the query heads (the K/V part of the traffic is approximated the same way)
            h = float(r["heads"])
            r["heads"] = float(math.ceil(h / n))
            r["kv_heads"] = float(math.ceil(float(r["kv_heads"]) / kvw))
            for col in ("flops", "bytes_read", "bytes_written"):
                r[col] = r[col] * r["heads"] / h
            continue
        elif ph == "acc":
            mod, _, leaf = m.rpartition(".")
            if kinds.get(mod) == "col" or (kinds.get(mod) == "row" and leaf == "weight") or EMBED_MODULE.search(mod):
                split, d = True, ways(mod)
                _split_vec(r, d, split_h | vocab_h)
        elif c in _ROW_CLASSES:
            split = m in sharded
            if kinds.get(m) == "col" and ph == "bw":   # bias gradient of a column-parallel linear
                split, d = True, ways(m)
            if EMBED_MODULE.search(m) and "embedding_dense_backward" in r["aten_op"]:
                split = True
            if vocab and r["H"] == vocab and not EMBED_MODULE.search(m):  # vocab-parallel loss
                split = True
            kv_read = sum(x for b, x in r.get("reads") or () if b in kv_bufs) if split and ph == "fw" else 0
            if kv_read and sum(x for _, x in r["writes"]) <= sum(x for _, x in r["reads"]):  # K/V-sized
                d = kvw
                kv_bufs.update(b for b, _ in r["writes"])
            elif kv_read:                                                   # repeat_kv: K/V -> query heads
                _split_vec(r, n, split_h | vocab_h)
                r["bytes_read"] = (r["bytes_read"] - kv_read) / n + kv_read / kvw
                r["flops"], r["bytes_written"] = r["flops"] / n, r["bytes_written"] / n
                continue
            if split:
                _split_vec(r, d, split_h | vocab_h)
        if split:
            for f in ("flops", "bytes_read", "bytes_written"):
                r[f] = r[f] / d
    k = table_info.carry(pd.DataFrame.from_records(recs, columns=list(k.columns)), kernels)

    # communication
    inserts = []
    act = e * tokens * hidden
    for i in k.index[(k.phase == "fw") & (k.op_class == OpClass.LINEAR)]:
        m = k.at[i, "module"]
        if kinds.get(m) == "row" and m in shape:
            inserts.append((i, _comm_row("fw", "allreduce", e * tokens * shape[m][1], False, m,
                                         int(k.at[i, "layer"]))))
    emb = k.index[(k.phase == "fw") & k.module.map(lambda s: bool(EMBED_MODULE.search(s)))
                  & k.aten_op.str.contains("embedding")]
    if len(emb):
        inserts.append((int(emb[0]), _comm_row("fw", "allreduce", act, False, k.at[emb[0], "module"], -1)))
    if vocab and (k.module == "lm_head").any():
        if len(loss):
            for _ in range(3):
                inserts.append((int(loss[0]), _comm_row("fw", "allreduce", 4.0 * tokens, False, "loss", -1)))  # FP32 loss
    # backward: the input gradient of each column-parallel group (QKV; FC1; LM head) is reduced
    # after the group's last backward kernel
    col_bw = k[(k.phase == "bw") & k.module.map(lambda s: kinds.get(s) == "col" and s in shape)]
    for parent, g in col_bw.groupby(col_bw.module.map(_group_key)):
        layers = sorted(set(g.layer))
        for L in layers:
            gl = g[g.layer == L]
            fi = shape[gl.module.iloc[0]][0]
            inserts.append((int(gl.index.max()), _comm_row("bw", "allreduce", e * tokens * fi, False,
                                                            parent, int(L))))
    # the experts' outputs (forward) and their input gradient (backward) are partial sums over the GPUs
    inserts += [(i, _comm_row(ph, "allreduce", act, False, m, int(k.at[i, "layer"]))) for i, ph, m in moe_ends]
    out = _insert(k, inserts)
    for c in ("B", "M", "N", "K", "H"):
        out[c] = out[c].astype(float)
    return out


def _group_key(module: str) -> str:
    """Column-parallel linears that share an input form one group (q/k/v; gate/up)."""
    parent = module.rpartition(".")[0]
    leaf = module.rpartition(".")[2]
    if leaf in ("q_proj", "k_proj", "v_proj", "query", "key", "value", "q", "k", "v", "c_attn",
                "qkv_proj", "query_key_value"):
        return parent + ".attn_in"
    return parent + ".mlp_in" if leaf not in ("lm_head", "decoder") else module


def _split_vec(r: dict, n: int, split_h: set) -> None:
    """Split a vector kernel's rows (per-head data) or its last dim (FFN / vocabulary slice)."""
    H, B = r["H"], r["B"]
    if isinstance(H, float) and math.isnan(H):
        return
    if int(H) in split_h and H % n == 0 or int(H) in split_h and H > 4096:
        r["H"] = float(math.ceil(H / n))
    else:
        r["B"] = float(math.ceil(B / n))


# ------------------------------------------------------------------------------------------ PP
def _pp(kernels: pd.DataFrame, n: int, micro_batches: int) -> pd.DataFrame:
    a = table_info.info(kernels)
    if a.batch % micro_batches:
        raise PlanError(f"pp{n}: batch {a.batch} is not divisible by {micro_batches} micro-batches")
    L = a.num_layers
    if L < n:
        raise PlanError(f"pp{n}: the model has {L} layers, fewer than {n} stages")
    k = _retrace(kernels, a.batch // micro_batches).reset_index(drop=True)
    mb = table_info.info(k).batch
    layer = k.layer.to_numpy()
    stage = np.zeros(len(k), dtype=int)
    per = L / n
    for ph in ("fw", "bw", "acc"):
        idx = np.flatnonzero(k.phase.to_numpy() == ph)
        if not len(idx):
            continue
        in_layer = idx[layer[idx] >= 0]
        first = in_layer.min() if len(in_layer) else idx.max() + 1
        for i in idx:
            if layer[i] >= 0:
                stage[i] = min(int(layer[i] // per), n - 1)
            elif ph == "acc":
                m = k.at[i, "module"]
                stage[i] = 0 if EMBED_MODULE.search(m.rsplit(".", 1)[0]) or "embed" in m or "wpe" in m else n - 1
            else:
                before = i < first
                # forward: embeddings before the first layer -> stage 0, head/loss after -> last;
                # backward runs in reverse order
                stage[i] = (0 if before else n - 1) if ph == "fw" else (n - 1 if before else 0)
    k["stage"] = stage
    act = _elem(k) * mb * a.seq * a.hidden
    inserts = []
    for ph, order in (("fw", range(n - 1)), ("bw", range(n - 1, 0, -1))):
        idx = np.flatnonzero(k.phase.to_numpy() == ph)
        for s in order:
            sel = idx[stage[idx] == s]
            if len(sel):
                peer = s + 1 if ph == "fw" else s - 1
                inserts.append((int(sel.max()), _comm_row(ph, "sendrecv", act, False,
                                                          f"stage{s}->stage{peer}", -1, stage=s)))
    return _insert(k, inserts)


def apply_plan(kernels: pd.DataFrame, plan: str, n: int, micro_batches: int = 1) -> pd.DataFrame:
    """Per-GPU kernel table of ``plan`` in ``dp | tp | pp`` over ``n`` GPUs (see module doc)."""
    if plan not in schema.PLANS:
        raise PlanError(f"unknown parallel plan {plan!r}; use one of {', '.join(schema.PLANS)}")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise PlanError(f"number of GPUs must be a positive integer, got {n!r}")
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, (int, np.integer)) or micro_batches < 1:
        raise PlanError(f"micro_batches must be a positive integer, got {micro_batches!r}")
    if table_info.info_or_none(kernels) is None:
        raise PlanError("apply_plan needs a kernel table from trace.trace_model (it carries no TableInfo)")
    if plan == Plan.DP:
        out = _dp(kernels, int(n))
    elif plan in schema.TENSOR_PLANS:
        out = tp_split(kernels, int(n), experts=plan)
    else:
        out = _pp(kernels, int(n), int(micro_batches))
    out = out.drop(columns=["after"], errors="ignore")
    return table_info.attach(out, table_info.info(out).replace(plan=plan, gpus=int(n),
                                                                   micro_batches=int(micro_batches)))
