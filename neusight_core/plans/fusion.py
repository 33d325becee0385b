"""Operator fusion: merge chains of element-wise / memory kernels as ``torch.compile`` would.

The release's ``-fusion`` labels were measured with ``torch.compile`` (Inductor). Inductor keeps
GEMMs as library calls (cuBLAS) and generates one kernel per group of point-wise ops, reductions
(softmax, layer norm) and copies that share an iteration space or feed each other. We reproduce
that grouping on the kernel table:

* a group starts at a fusible kernel (VEC, SOFTMAX, LAYERNORM, MEM) and grows while the next
  kernel of the same phase is fusible and either consumes a buffer the group wrote (vertical
  fusion) or has the same number of output elements as the group's first kernel (horizontal
  fusion of ops over the same iteration space, e.g. the branches of GELU-tanh);
* GEMMs, communication, unclassified ops and phase changes end a group;
* FLOPs of a group add up; bytes keep only the buffers that cross the group boundary: reads of
  buffers produced outside the group, and writes of buffers that some later kernel reads
  (including the backward pass, which reads activations saved in forward) or that are the
  group's final result. Intermediates never touch DRAM.

This needs the ``reads`` / ``writes`` columns of ``trace.trace_model``; without them the
transform falls back to adding the bytes of the group's first input and last output.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from neusight_core.tracing import table_info
from neusight_core.question import schema
from neusight_core.question.schema import OpClass

FUSIBLE = set(schema.op_classes(lambda c: c.is_vector or c is OpClass.MEM))
# a fused group takes the class of its most specific member: the predictors have one MLP per class
_CLASS_RANK = {OpClass.SOFTMAX: 3, OpClass.LAYERNORM: 2, OpClass.VEC: 1, OpClass.MEM: 0}


def _groups(k: pd.DataFrame) -> list[list[int]]:
    has_deps = "reads" in k.columns and "writes" in k.columns
    cls = k["op_class"].to_numpy()
    phase = k["phase"].to_numpy()
    numel = (k["B"].fillna(1) * k["H"].fillna(1)).to_numpy()
    reads = k["reads"].to_numpy() if has_deps else None
    writes = k["writes"].to_numpy() if has_deps else None
    groups: list[list[int]] = []
    cur: list[int] = []
    written: set = set()
    for i in range(len(k)):
        # gradient accumulation runs in the eager autograd engine, outside compiled graphs
        ok = cls[i] in FUSIBLE and phase[i] != "acc"
        if ok and cur and phase[i] == phase[cur[0]]:
            dep = has_deps and any(key in written for key, _ in reads[i])
            if dep or numel[i] == numel[cur[0]]:
                cur.append(i)
                if has_deps:
                    written.update(key for key, _ in writes[i])
                continue
        if cur:
            groups.append(cur)
        cur, written = [], set()
        if ok:
            cur = [i]
            if has_deps:
                written = {key for key, _ in writes[i]}
        else:
            groups.append([i])
    if cur:
        groups.append(cur)
    return groups


def fuse(kernels: pd.DataFrame) -> pd.DataFrame:
    """Kernel table after fusion: one row per fused group (``sub_op == "fused"`` when > 1 op).

    Adds a column ``fused_ops`` (the member aten ops joined by ``+``; the op itself for single
    kernels) so a predictor can still see what a fused kernel does.
    """
    if len(kernels) == 0:
        return kernels.assign(fused_ops=pd.Series(dtype=str))
    k = kernels.reset_index(drop=True)
    has_deps = "reads" in k.columns and "writes" in k.columns
    groups = _groups(k)
    # last kernel index that reads each buffer: decides which group outputs must be written
    last_read: dict = {}
    if has_deps:
        for i, rs in enumerate(k["reads"].to_numpy()):
            for key, _ in rs:
                last_read[key] = i
    rows = []
    for g in groups:
        if len(g) == 1:
            r = k.iloc[g[0]].to_dict()
            r["fused_ops"] = r["aten_op"]
            rows.append(r)
            continue
        sub = k.iloc[g]
        lo, hi = g[0], g[-1]
        if has_deps:
            produced: dict = {}
            rd = 0.0
            seen_in: set = set()
            for rs, ws in zip(sub["reads"], sub["writes"]):
                for key, b in rs:
                    if key not in produced and key not in seen_in:
                        seen_in.add(key)
                        rd += b
                for key, b in ws:
                    produced[key] = b
            # the group's result: the last kernel's main output (not e.g. layer-norm statistics)
            final = {key for key, _ in sub["writes"].iloc[-1][:1]}
            wr = float(sum(b for key, b in produced.items()
                           if last_read.get(key, -1) > hi or key in final))
            reads = tuple((key, b) for key, b in {kk: bb for rs in sub["reads"] for kk, bb in rs}.items()
                          if key in seen_in)
            writes = tuple((key, b) for key, b in produced.items() if last_read.get(key, -1) > hi or key in final)
        else:
            rd, wr = float(sub["bytes_read"].iloc[0]), float(sub["bytes_written"].iloc[-1])
        big = int(np.argmax((sub["B"].fillna(1) * sub["H"].fillna(1)).to_numpy()))
        cls = max(sub["op_class"], key=lambda c: _CLASS_RANK.get(c, 0))
        r = k.iloc[g[int(np.argmax([_CLASS_RANK.get(c, 0) for c in sub["op_class"]]))]
                   if cls in (OpClass.SOFTMAX, OpClass.LAYERNORM) else g[big]].to_dict()
        r.update(op_class=cls, sub_op="fused", aten_op="+".join(a.split(".")[1] for a in sub["aten_op"]),
                 flops=float(sub["flops"].sum()), bytes_read=float(rd), bytes_written=float(wr),
                 module=k.at[lo, "module"], layer=int(k.at[lo, "layer"]),
                 fused_ops="+".join(sub["aten_op"]))
        if has_deps:
            r["reads"], r["writes"] = reads, writes
        rows.append(r)
    out = pd.DataFrame.from_records(rows, columns=list(k.columns) + ["fused_ops"])
    return table_info.carry(out, kernels, fused=True)
