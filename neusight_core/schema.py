"""The kernel table's vocabulary, in one place (issue 23): op classes, precisions and element sizes.

No torch and no pandas here, so that the CLI's parser, the sweep and the evaluation side can import it
for free. A new op class or precision is added here and nowhere else; the modules that need a subset
(the classes a predictor learns, the ones the paper's tables report) take it from the names below.
The kernel table's columns are documented in docs/interfaces.md ("Kernel table").
"""
from __future__ import annotations

#: Every ``op_class`` a kernel table may hold, in the order tables and sweep columns list them.
#: MEM: copies / layout changes; COMM: collectives of a parallel plan; UNCLASSIFIED: aten ops the tracer
#: does not know (predicted as memory-bound). ATTN: a fused attention kernel (FlashAttention-style prefill or
#: decode, ``sub_op``), measured in NVIDIA's database (issue 25, ``measured_kernels``); the tracer does not
#: emit it (attention is traced as BMM + softmax).
OP_CLASSES = ("BMM", "LINEAR", "VEC", "SOFTMAX", "LAYERNORM", "MEM", "COMM", "UNCLASSIFIED", "ATTN")

#: The classes of the paper's kernel data and tables (Tables 3-4, Figure 7): the ones the release
#: measures and NeuSight's networks learn.
PAPER_CLASSES = ("BMM", "LINEAR", "VEC", "SOFTMAX", "LAYERNORM")

#: How the paper's tables name the classes.
CLASS_LABEL = {"BMM": "BMM", "LINEAR": "FC", "VEC": "EW", "SOFTMAX": "Softmax", "LAYERNORM": "LN"}
#: Labels of the classes outside the paper's tables (issue 25's fused attention).
EXTRA_LABEL = {"ATTN": "Fused attention"}

#: Precisions a prediction can be made in. fp32 = the paper's setting (FP32 storage, TF32 off); tf32 keeps
#: FP32 tensors with GEMMs on TF32 tensor cores; fp16 / bf16 store 2-byte elements.
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
TENSOR_PRECISIONS = ("tf32", "fp16", "bf16")     # GEMM precisions with a tensor-core peak
HALF_PRECISIONS = ("fp16", "bf16")               # 2-byte elements
ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2}


def element_bytes(precision: str) -> int:
    """Bytes of one stored element in ``precision`` (4 for anything that is not fp16 / bf16)."""
    return ELEMENT_BYTES.get(precision, 4)
