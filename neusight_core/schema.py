"""The kernel table's vocabulary, in one place (issue 23): op classes, precisions and element sizes.

No torch and no pandas here (numpy only), so that the CLI's parser, the sweep and the evaluation side can import it
for free. A new op class or precision is added here and nowhere else; the modules that need a subset
(the classes a predictor learns, the ones the paper's tables report) take it from the names below.
The kernel table's columns are documented in docs/interfaces.md ("Kernel table").
"""
from __future__ import annotations

import numpy as np

#: Every ``op_class`` a kernel table may hold, in the order tables and sweep columns list them.
#: MEM: copies / layout changes; COMM: collectives of a parallel plan; UNCLASSIFIED: aten ops the tracer
#: does not know (predicted as memory-bound).
#: CONV (issue 26): 2-D convolutions (forward, gradient of the input, gradient of the weight), with their
#: implicit-GEMM dims and conv parameters (docs/interfaces.md, "Kernel table").
#: ATTN (issue 25): a fused attention kernel (FlashAttention-style prefill or decode, ``sub_op``), measured in
#: NVIDIA's database (``measured_kernels``); the tracer emits it with ``attention="sdpa"`` (issue 33: one row per
#: layer and phase, ``sub_op`` prefill / decode / backward), eager attention is traced as BMM + softmax.
OP_CLASSES = ("BMM", "LINEAR", "VEC", "SOFTMAX", "LAYERNORM", "CONV", "ATTN", "MEM", "COMM", "UNCLASSIFIED")

#: The columns of a CONV row's parameters (issue 26; NaN on other rows): in- / out-channels, kernel side,
#: input side, stride, padding, groups (docs/interfaces.md, "Kernel table").
CONV_COLUMNS = ("conv_cin", "conv_cout", "conv_k", "conv_in", "conv_stride", "conv_pad", "conv_groups")

#: The columns of an ATTN row's geometry (NaN on other rows; a table without ATTN rows has none of them): query
#: tokens per sequence, keys each attends to (the KV length), query heads, KV heads (GQA), head size.
ATTN_COLUMNS = ("seq_q", "seq_kv", "heads", "kv_heads", "head_dim")

#: FLOPs of a fused attention's backward over its forward: FlashAttention-2 (Dao, 2023, section 3.2) recomputes
#: S = QK^T and runs dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q: five matrix products against the forward's
#: two. The backward's time is predicted as this many forwards of the same shape (tensor_core).
ATTN_BACKWARD_FLOPS = 2.5
#: On the lent H100 (docs/tier2/2026-11-26-h100-modern, cuDNN's kernels, batch 4 x 2,048 tokens) the backward took
#: 2.55 and 2.56 times the forward of the same shape (Llama-3.2-1B, Qwen2.5-1.5B): a check, not where 2.5 came from.

#: How a model's attention runs (issue 33): ``eager`` = the paper's (Q K^T, softmax, P V as separate kernels),
#: ``sdpa`` = one fused kernel per layer and phase (``torch.nn.functional.scaled_dot_product_attention``, what
#: Hugging Face picks by default for the models that support it).
ATTENTIONS = ("eager", "sdpa")

#: How a step is launched (issue 33): ``graph`` = the kernels back to back (CUDA graphs, torch.compile with
#: cudagraphs, serving engines): the step is the kernel sum; ``eager`` = eager PyTorch, the host dispatching each
#: kernel (``host.py``): the step is at least the host's launch time.
EXECUTIONS = ("eager", "graph")

#: The classes of the paper's kernel data and tables (Tables 3-4, Figure 7): the ones the release
#: measures and NeuSight's networks learn.
PAPER_CLASSES = ("BMM", "LINEAR", "VEC", "SOFTMAX", "LAYERNORM")

#: How the paper's tables name the classes.
CLASS_LABEL = {"BMM": "BMM", "LINEAR": "FC", "VEC": "EW", "SOFTMAX": "Softmax", "LAYERNORM": "LN", "CONV": "Conv",
               "ATTN": "Fused attention"}

#: Precisions a prediction can be made in. fp32 = the paper's setting (FP32 storage, TF32 off); tf32 keeps
#: FP32 tensors with GEMMs on TF32 tensor cores; fp16 / bf16 store 2-byte elements.
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
TENSOR_PRECISIONS = ("tf32", "fp16", "bf16")     # GEMM precisions with a tensor-core peak
HALF_PRECISIONS = ("fp16", "bf16")               # 2-byte elements
ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2}


def element_bytes(precision: str) -> int:
    """Bytes of one stored element in ``precision`` (4 for anything that is not fp16 / bf16)."""
    return ELEMENT_BYTES.get(precision, 4)


#: ``attrs["memory"]["events"]`` of a traced kernel table (docs/interfaces.md). It lives here, at the bottom,
#: because cached tables hold one: reading a cache must not import torch or the tracer.
class MemoryTimeline:
    """Allocation (+bytes) and free (-bytes) events of a trace's buffers in program order: arrays
    ``row`` (kernel row the event precedes or belongs to), ``buf`` (buffer serial), ``bytes``.
    (A class, not a dict of arrays, so that pandas can compare frame attrs.)"""

    def __init__(self, events):
        ev = np.array(events, dtype=np.int64).reshape(-1, 3)
        self.row, self.buf, self.bytes = ev[:, 0].copy(), ev[:, 1].copy(), ev[:, 2].astype(float)

    def __len__(self) -> int:
        return len(self.row)

    def __eq__(self, other) -> bool:
        return isinstance(other, MemoryTimeline) and bool(
            np.array_equal(self.row, other.row) and np.array_equal(self.buf, other.buf)
            and np.array_equal(self.bytes, other.bytes))

    def peak(self) -> float:
        return float(np.cumsum(self.bytes).max()) if len(self) else 0.0
