"""The kernel table's vocabulary, in one place (issues 23, 35): op classes and precisions as enums that carry their
attributes, and the column groups of a kernel table.

No torch and no pandas here (numpy only), so that the CLI's parser, the sweep and the evaluation side can import it
for free. A new op class or precision is added here and nowhere else; a module that needs a subset asks a member's
attribute (``OpClass.is_gemm``, ``Precision.is_half``) or takes one of the derived tuples below, never a list of
names of its own (tests/test_vocabulary.py fails on an op-class or precision literal outside this module,
and on an option's word, ``Mode`` to ``Comm`` below, where the literal means the option).
The members are ``str`` (``StrEnum``): a kernel table's ``op_class`` and ``precision`` cells are plain strings and
compare equal to them, hash like them, print and format as them (``repr`` too, so messages read as before).
The kernel table's columns are documented in docs/interfaces.md ("Kernel table").
"""
from __future__ import annotations

from enum import StrEnum

import numpy as np


class _Word(StrEnum):
    """A word of the vocabulary: its ``repr`` is its text's, so messages read as they did with plain strings."""

    def __repr__(self) -> str:
        return repr(self.value)


class OpClass(_Word):
    """Every ``op_class`` a kernel table may hold, in the order tables and sweep columns list them.

    MEM: copies / layout changes; COMM: collectives of a parallel plan; UNCLASSIFIED: aten ops the tracer does not
    know (predicted as memory-bound). CONV: 2-D convolutions (forward, gradient of the input, gradient of
    the weight), with their implicit-GEMM dims and conv parameters. ATTN: a fused attention kernel
    (FlashAttention-style prefill or decode, ``sub_op``), measured in NVIDIA's database (``measured_kernels``); the
    tracer emits it with ``attention="sdpa"`` (one row per layer and phase, ``sub_op`` prefill / decode /
    backward), eager attention is traced as BMM + softmax."""
    BMM = "BMM"
    LINEAR = "LINEAR"
    VEC = "VEC"
    SOFTMAX = "SOFTMAX"
    LAYERNORM = "LAYERNORM"
    CONV = "CONV"
    ATTN = "ATTN"
    MEM = "MEM"
    COMM = "COMM"
    UNCLASSIFIED = "UNCLASSIFIED"

    @property
    def is_gemm(self) -> bool:
        """A matrix product NeuSight decomposes into output tiles (m x n x k): BMM, LINEAR."""
        return self in (OpClass.BMM, OpClass.LINEAR)

    @property
    def is_vector(self) -> bool:
        """An element-wise or row-wise kernel, bounded by memory: VEC, SOFTMAX, LAYERNORM."""
        return self in (OpClass.VEC, OpClass.SOFTMAX, OpClass.LAYERNORM)

    @property
    def is_row_tiled(self) -> bool:
        """A row-wise kernel: one row (H elements) per tile: SOFTMAX, LAYERNORM."""
        return self in (OpClass.SOFTMAX, OpClass.LAYERNORM)

    @property
    def is_memory(self) -> bool:
        """A copy or an unknown op, predicted as bytes over the bandwidth: MEM, UNCLASSIFIED."""
        return self in (OpClass.MEM, OpClass.UNCLASSIFIED)

    @property
    def on_matrix_units(self) -> bool:
        """Its FLOPs run on the GEMM / tensor-core units, so the matrix peak bounds it: BMM, LINEAR, CONV, ATTN."""
        return self.is_gemm or self in (OpClass.CONV, OpClass.ATTN)

    @property
    def in_paper(self) -> bool:
        """A class of the paper's kernel data and tables (Tables 3-4, Figure 7): the ones the release measures and
        NeuSight's networks learn."""
        return self.is_gemm or self.is_vector

    @property
    def label(self) -> str:
        """How the paper's tables name the class (FC, EW, LN, ...); the other classes by their name."""
        return {"LINEAR": "FC", "VEC": "EW", "SOFTMAX": "Softmax", "LAYERNORM": "LN", "CONV": "Conv",
                "ATTN": "Fused attention"}.get(self.value, self.value)


class Precision(_Word):
    """Precisions a prediction can be made in. fp32 = the paper's setting (FP32 storage, TF32 off); tf32 keeps FP32
    tensors with GEMMs on TF32 tensor cores; fp16 / bf16 store 2-byte elements. fp8 (E4M3) = FP8 weights and
    GEMMs (W8A8: both operands quantised to one byte, BF16 output) in a BF16 model: the linear layers' GEMMs run
    on FP8 tensor cores, attention and the memory-bound kernels in BF16, as vLLM's and TensorRT-LLM's FP8
    checkpoints run (vLLM docs, "FP8 W8A8": "only the weights and activations of the linear layers are
    quantized"); its step is traced in ``activations`` (bf16) and its LINEAR rows relabelled."""
    FP32 = "fp32"
    TF32 = "tf32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"

    @property
    def bytes(self) -> int:
        """Bytes of one stored element (of a weight, for fp8)."""
        return 1 if self is Precision.FP8 else 2 if self.is_half else 4

    @property
    def activations(self) -> "Precision":
        """The precision a step in this precision traces its model and keeps its activations in: bf16 for fp8
        (only its linear layers' GEMMs run in FP8), itself otherwise."""
        return Precision.BF16 if self is Precision.FP8 else self

    @property
    def is_half(self) -> bool:
        """2-byte elements: fp16, bf16."""
        return self in (Precision.FP16, Precision.BF16)

    @property
    def has_tensor_peak(self) -> bool:
        """GEMMs run on tensor cores with a peak of their own (``devices.yaml`` ``tensor_tflops``): tf32, fp16, bf16."""
        return self is not Precision.FP32

    @property
    def torch_dtype(self) -> str:
        """The torch dtype its tensors are stored in (a name: this module imports no torch)."""
        return {"fp16": "float16", "bf16": "bfloat16", "fp8": "float8_e4m3fn"}.get(self.value, "float32")


def op_classes(where=lambda c: True) -> tuple:
    """The op-class names (plain strings) for which ``where(OpClass)`` holds, in table order."""
    return tuple(c.value for c in OpClass if where(c))


def precisions(where=lambda p: True) -> tuple:
    """The precision names (plain strings) for which ``where(Precision)`` holds, in table order."""
    return tuple(p.value for p in Precision if where(p))


#: Every op class, in table order (plain strings: the CLI's choices and the sweep's columns read them).
OP_CLASSES = op_classes()
#: The classes of the paper's kernel data and tables.
PAPER_CLASSES = op_classes(lambda c: c.in_paper)
#: How the paper's tables name the classes.
CLASS_LABEL = {c.value: c.label for c in OpClass if c.in_paper or c in (OpClass.CONV, OpClass.ATTN)}
#: The matrix products NeuSight tiles (BMM, LINEAR), and with the convolutions' implicit GEMM (+ CONV).
GEMM_CLASSES = op_classes(lambda c: c.is_gemm)
IGEMM_CLASSES = op_classes(lambda c: c.is_gemm or c is OpClass.CONV)
#: Every precision; the tensor-core ones; the 2-byte ones; bytes per element.
PRECISIONS = precisions()
TENSOR_PRECISIONS = precisions(lambda p: p.has_tensor_peak)
HALF_PRECISIONS = precisions(lambda p: p.is_half)
#: The precisions of a step whose activations, attention and memory-bound kernels are 2-byte (fp16, bf16, fp8).
HALF_ACTIVATIONS = precisions(lambda p: p.activations.is_half)
ELEMENT_BYTES = {p.value: p.bytes for p in Precision}

#: ``sub_op`` of a grouped GEMM row (op class BMM): one kernel for the experts of a mixture-of-experts layer, taken as
#: balanced routing (``aten_ops.grouped_gemm``); predicted as a dense GEMM over the stacked tokens, an extrapolation.
GROUPED_GEMM = "grouped"

#: The kernel table's first columns, in order (``trace.trace_model`` fills them; docs/interfaces.md, "Kernel table").
KERNEL_COLUMNS = ["phase", "aten_op", "op_class", "sub_op", "B", "M", "N", "K", "H", "flops",
           "bytes_read", "bytes_written", "dtype", "module", "layer", "count",
           "comm_kind", "comm_bytes", "overlap", "stage"]

#: The columns of a CONV row's parameters (NaN on other rows): in- / out-channels, kernel side,
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

class Mode(_Word):
    """What a step is: ``inf`` (a forward pass: a prefill, or with a KV cache a decode step) or ``train`` (forward,
    loss and backward)."""
    INF = "inf"
    TRAIN = "train"


class Plan(_Word):
    """How a run is split over GPUs: data, tensor or pipeline parallelism, or expert parallelism (``ep``: tensor
    parallelism whose mixture-of-experts layers spread their experts over the GPUs instead of slicing each expert;
    ``parallel_experts.py``)."""
    DP = "dp"
    TP = "tp"
    PP = "pp"
    EP = "ep"

    @property
    def splits_tensors(self) -> bool:
        """Every layer's tensors are split over the GPUs (the heads must divide evenly): tp, ep."""
        return self in (Plan.TP, Plan.EP)


class Attention(_Word):
    """How a model's attention runs: ``eager`` = the paper's (Q K^T, softmax, P V as separate kernels), ``sdpa`` = one
    fused kernel per layer and phase (``torch.nn.functional.scaled_dot_product_attention``, what Hugging Face picks
    by default for the models that support it)."""
    EAGER = "eager"
    SDPA = "sdpa"


class Execution(_Word):
    """How a step is launched: ``graph`` = the kernels back to back (CUDA graphs, torch.compile with cudagraphs,
    serving engines): the step is the kernel sum; ``eager`` = eager PyTorch, the host dispatching each kernel
    (``host.py``): the step is at least the host's launch time."""
    EAGER = "eager"
    GRAPH = "graph"


class Grads(_Word):
    """Where a training step's weight gradients start: ``fresh`` = none (``zero_grad(set_to_none=True)``, PyTorch's
    default since 2.0 and Hugging Face's Trainer: backward writes each gradient); ``accumulate`` = kept from the step
    before, as in the authors' measured loop, so backward adds each new gradient into it (one more kernel per
    parameter, reading and writing every gradient: 14 % of a Llama-2-7B training step on an H100)."""
    FRESH = "fresh"
    ACCUMULATE = "accumulate"


class KVCache(_Word):
    """How a decode step's KV cache takes the step's new keys and values: ``append`` = Hugging Face's DynamicCache,
    which concatenates them onto the cache into a new tensor (the whole cache is copied every step: 4.6 of 15.0 ms,
    predicted, of a batch-32 Llama-3-8B BF16 decode step at 1,536 cached tokens on an H100); ``paged`` = a serving
    engine's preallocated cache (vLLM's PagedAttention, Kwon et al. SOSP 2023; TensorRT-LLM's and SGLang's paged
    caches), into which the step writes only its new tokens' keys and values."""
    APPEND = "append"
    PAGED = "paged"


class ServingEngine(_Word):
    """The serving engine of a ``serve`` question (``cost/serving.py``). All three run decode steps as CUDA graphs on a
    paged KV cache with fused norms and activations, batch continuously and split the model by tensor parallelism;
    what differs between them is fitted per engine on its development rows (the constants in
    ``cost/serving_constants.yaml``, with the rows they came from), as their schedulers differ: vLLM V1 and SGLang
    chunk prefills into the decode iterations by default, TensorRT-LLM batches whole prompts in flight
    (docs/serving.md)."""
    VLLM = "vllm"
    SGLANG = "sglang"
    TRTLLM = "trtllm"


class Comm(_Word):
    """How a collective is timed (``network.py``): ``nccl`` = the link's bandwidth plus NCCL's measured fixed cost per
    all-reduce; ``bandwidth`` = the link's bandwidth alone, the authors' model (the paper's reproduction keeps it)."""
    NCCL = "nccl"
    BANDWIDTH = "bandwidth"


def words(enum) -> tuple:
    """The texts of an enum's members, in order (the CLI's choices, the messages' lists)."""
    return tuple(m.value for m in enum)


ATTENTIONS = words(Attention)
MODES = words(Mode)
PLANS = words(Plan)
TENSOR_PLANS = tuple(p.value for p in Plan if p.splits_tensors)
EXECUTIONS = words(Execution)
GRADS = words(Grads)
COMMS = words(Comm)
KV_CACHES = words(KVCache)
SERVING_ENGINES = words(ServingEngine)


def element_bytes(precision: str) -> int:
    """Bytes of one stored element in ``precision`` (4 for anything that is not fp16 / bf16)."""
    return ELEMENT_BYTES.get(precision, 4)


#: ``TableInfo.memory["events"]`` of a traced kernel table (docs/interfaces.md). It lives here, at the bottom,
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
