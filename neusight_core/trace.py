"""Tracing: a Hugging Face model config becomes a kernel table (docs/interfaces.md, "Kernel table").

How it works
------------
The model is built from its config under ``torch.device("meta")``: no weights are allocated and
nothing is downloaded. A ``TorchDispatchMode`` then watches every aten op that the eager PyTorch
program dispatches while it runs the forward pass (and, for training, the loss and ``backward()``).
Each op that launches a kernel on a GPU becomes one row of the table.

Why capture real aten ops instead of the authors' rules (one traced layer replicated, backward
derived by rules such as "linear -> two GEMMs")? The captured ops are what autograd actually
launches for this version of ``transformers``/``torch`` (e.g. GELU-tanh backward, tied-embedding
gradient sums, the loss), so nothing depends on hand-written rules staying in sync with the model
code; SPEC section 3.3 prefers it. Meta tensors make it cheap: shapes propagate, no arithmetic runs.

Module attribution: forward ops take the innermost module from a stack maintained by module
forward hooks. Backward ops run inside the autograd engine where no module is active, so in
training a ``TorchFunctionMode`` stamps each autograd node created in the forward pass with its
module (``node.metadata``), and the dispatch mode reads it from the node being executed.
"""
from __future__ import annotations

import contextlib
import math
import re
import time
import weakref
from collections import Counter

import numpy as np
import pandas as pd
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

COLUMNS = ["phase", "aten_op", "op_class", "sub_op", "B", "M", "N", "K", "H", "flops",
           "bytes_read", "bytes_written", "dtype", "module", "layer", "count",
           "comm_kind", "comm_bytes", "overlap", "stage"]
# Extra columns after COLUMNS: `reads` / `writes` = tuples of (buffer key, bytes) per kernel, the
# data dependencies fusion.fuse needs (a key names one tensor buffer within one trace), and
# `precision` (fp32 | tf32 | fp16 | bf16): the arithmetic the kernel runs in, which picks the GEMM peak.
# Then CONV_COLUMNS (issue 26, below): the parameters of a 2-D convolution, NaN on every other row.

# Precision of a trace (``trace_model(..., dtype=)``) -> storage dtype of the model's tensors.
# tf32 = FP32 tensors, GEMMs on TF32 tensor cores; fp32 = the paper's setting (TF32 off).
TORCH_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_DTYPE_PRECISION = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}



# configs by name or path live in configs.py (no torch: a trace-cache hit reads them); re-exported
from neusight_core import configs  # noqa: E402
from neusight_core import schema  # noqa: E402
from neusight_core.configs import OUR_CONFIGS_DIR, TraceError, available_configs, load_config  # noqa: E402,F401

CONV_COLUMNS = list(schema.CONV_COLUMNS)    # the conv parameters of CONV rows, NaN elsewhere (issue 26)
_NO_CONV = (math.nan,) * len(CONV_COLUMNS)
ATTN_COLUMNS = list(schema.ATTN_COLUMNS)    # the geometry of fused-attention rows (issue 33), NaN elsewhere
_NO_ATTN = (math.nan,) * len(ATTN_COLUMNS)
#: FLOPs of a fused attention's backward over its forward: FlashAttention-2 (Dao, 2023, section 3.2) recomputes
#: S = QK^T and runs dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q: five matrix products against the forward's
#: two. The backward's time is predicted as this many forwards of the same shape (tensor_core.ATTN_BACKWARD_FACTOR).
ATTN_BACKWARD_FLOPS = 2.5


# The release's BERT config names BertLMHeadModel, but the authors' op graphs (and so the measured
# labels) show a sequence classifier in inference (`bert_pooler_dense`, `classifier` with 2 labels)
# and the pre-training heads in training (`cls_predictions_decoder`, `cls_seq_relationship`).
AUTHORS_HEADS = {"BertLMHeadModel": {"inf": "BertForSequenceClassification", "train": "BertForPreTraining"}}


def _model_class(cfg, mode: str | None = None):
    import transformers

    archs = list(getattr(cfg, "architectures", None) or [])
    if mode and archs and archs[0] in AUTHORS_HEADS:
        archs = [AUTHORS_HEADS[archs[0]][mode]] + archs
    for arch in archs:
        cls = getattr(transformers, arch, None)
        if cls is not None:
            return cls
    for auto in (transformers.AutoModelForCausalLM, transformers.AutoModelForSeq2SeqLM,
                 transformers.AutoModelForMaskedLM, transformers.AutoModel):
        try:
            return auto._model_mapping[type(cfg)]
        except KeyError:
            continue
    raise TraceError(f"unsupported model type {cfg.model_type!r}: no transformers model class for it")


def _max_positions(cfg) -> int | None:
    for k in ("n_positions", "max_position_embeddings"):
        v = getattr(cfg, k, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


# --------------------------------------------------------------------------------------------
# op classification
# --------------------------------------------------------------------------------------------
# Ops that launch no kernel: views/metadata, allocation without initialisation, host syncs.
NO_KERNEL = {
    "view", "_unsafe_view", "reshape", "_reshape_alias", "t", "transpose", "permute", "expand",
    "expand_as", "unsqueeze", "squeeze", "slice", "select", "as_strided", "alias", "detach",
    "split", "split_with_sizes", "unbind", "chunk", "narrow", "empty", "empty_like",
    "empty_strided", "new_empty", "new_empty_strided", "_local_scalar_dense", "lift_fresh",
    "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size", "diagonal",
    "unfold", "view_as", "set_", "resize_", "_has_compatible_shallow_copy_type", "t_",
    "transpose_", "unsqueeze_", "squeeze_", "as_strided_", "_unsafe_index_put_",
    "is_nonzero", "item", "numpy_T", "movedim", "_to_copy_noop",
}
GEMM = {"mm": "LINEAR", "addmm": "LINEAR", "bmm": "BMM", "baddbmm": "BMM"}
SOFTMAX = {"_softmax", "_safe_softmax", "_log_softmax", "_softmax_backward_data",
           "_log_softmax_backward_data"}
LAYERNORM = {"native_layer_norm", "native_layer_norm_backward"}
# Element-wise ops -> the predictor's sub-op vocabulary (SPEC 3.1: add, mul, div, pow, tanh, relu,
# gelu; "u" = with a scalar). Ops outside that vocabulary map to the nearest one by work per
# element (one read, one write, one cheap transcendental or arithmetic op per element).
BINARY = {"add": "add", "sub": "add", "rsub": "add", "mul": "mul", "div": "div", "pow": "pow",
          "maximum": "add", "minimum": "add", "add_": "add", "sub_": "add", "mul_": "mul",
          "div_": "div", "pow_": "pow", "addcmul": "mul", "addcdiv": "div", "lerp": "add",
          "masked_fill": None}
UNARY = {"tanh": "tanh", "relu": "relu", "gelu": "gelu", "silu": "gelu", "sigmoid": "tanh",
         "exp": "tanh", "log": "tanh", "erf": "tanh", "sqrt": "powu", "rsqrt": "powu",
         "reciprocal": "divu", "neg": "mulu", "abs": "mulu", "clamp": "relu", "clamp_min": "relu",
         "clamp_max": "relu", "threshold": "relu", "gelu_backward": "gelu", "tanh_backward": "tanh",
         "threshold_backward": "relu", "silu_backward": "gelu", "sigmoid_backward": "tanh",
         "relu_": "relu", "tanh_": "tanh", "exp_": "tanh", "neg_": "mulu", "sqrt_": "powu",
         "rsqrt_": "powu", "clamp_": "relu", "clamp_min_": "relu", "sin": "tanh", "cos": "tanh"}
REDUCTION = {"sum", "mean", "_adaptive_avg_pool2d"}   # -> VEC add over the reduced elements
# Batch norm (issue 26) -> VEC "mul": a multiply-add per element once the per-channel statistics are known.
# FLOPs per element as for layer norm (SPEC 3.1: 6; the same mean / variance / normalise / affine work) in
# training, forward and backward; 2 (scale and shift with the running statistics) in inference. Not
# LAYERNORM: that class's rows are the normalised rows of H elements, a batch norm reduces one channel
# over batch x pixels (a strided reduction of up to millions of elements), a shape its data never had.
BATCHNORM = {"native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
             "cudnn_batch_norm", "miopen_batch_norm", "native_batch_norm_backward",
             "cudnn_batch_norm_backward", "miopen_batch_norm_backward"}
BATCHNORM_INFERENCE = {"_native_batch_norm_legit_no_training"}
# 2-D convolutions (issue 26): forward, and the backward that computes the input and / or weight gradient
# (split into one row each, see conv_rows).
CONV = {"convolution", "convolution_backward"}
# Memory-bound ops (bytes / bandwidth in every predictor).
MEM = {
    "embedding", "embedding_dense_backward", "native_dropout", "native_dropout_backward",
    "where", "index", "index_select", "gather", "scatter", "scatter_add", "index_put",
    "index_put_", "index_add", "index_add_", "masked_fill", "masked_fill_", "copy_", "copy",
    "clone", "_to_copy", "contiguous", "cat", "stack", "fill_", "fill", "zero_", "zeros",
    "zeros_like", "ones", "ones_like", "full", "full_like", "new_zeros", "new_ones", "new_full",
    "arange", "tril", "triu", "eq", "ne", "lt", "gt", "le", "ge", "logical_not", "logical_and",
    "logical_or", "bitwise_not", "bitwise_and", "bitwise_or", "nll_loss_forward",
    "nll_loss_backward", "nll_loss2d_forward", "nll_loss2d_backward", "cumsum", "topk",
    "argmax", "argmin", "max", "min", "amax", "amin", "sort", "one_hot", "constant_pad_nd",
    "repeat", "masked_scatter", "scalar_tensor", "select_backward", "slice_backward",
    "bernoulli", "bernoulli_", "uniform_", "normal_", "rand", "randn", "rand_like", "any", "all",
    "isinf", "isnan", "sign", "_unsafe_index", "expand_copy", "nonzero", "count_nonzero",
    "lift_fresh_copy", "masked_select", "index_copy", "index_copy_", "fill_diagonal_",
    "_index_put_impl_", "split_copy", "unsqueeze_copy", "bucketize", "floor", "ceil", "round",
    "trunc", "eq_", "ne_", "native_dropout_", "squeeze_copy", "alias_copy", "unbind_copy",
    # pooling windows (issue 26): a few compares / adds per element read, memory-bound
    "max_pool2d_with_indices", "max_pool2d_with_indices_backward", "avg_pool2d", "avg_pool2d_backward",
    "_adaptive_avg_pool2d_backward",
}
# FLOPs per output element (SPEC 3.1: 1 for element-wise ops, 5 softmax, 6 layernorm).
OPS_PER_ELEMENT = {"VEC": 1, "SOFTMAX": 5, "LAYERNORM": 6}

_LAYER_RE = re.compile(r"(?:^|\.)(?:h|layers|layer|block|blocks)\.(\d+)(?:\.|$)")


def _op_name(func) -> tuple[str, str]:
    """(packet name e.g. 'addmm', full name e.g. 'aten.addmm.default')."""
    name = func.__name__  # e.g. 'addmm.default'
    return name.split(".")[0], f"{func.namespace}.{name}"


def _nbytes(t: torch.Tensor) -> int:
    """Bytes the tensor occupies: broadcast (stride-0) dims are stored once, so count them once."""
    n = 1
    for s, st in zip(t.shape, t.stride()):
        if st != 0:
            n *= int(s)
    return n * t.element_size()


def layer_of(module: str) -> int:
    m = _LAYER_RE.search(module)
    return int(m.group(1)) if m else -1


def _is_scalar_arg(a) -> bool:
    return isinstance(a, (int, float, bool)) or (isinstance(a, torch.Tensor) and a.dim() == 0)


def classify(base: str, args, kwargs, outs: list[torch.Tensor], ins: list[torch.Tensor]):
    """Return (op_class, sub_op, B, M, N, K, H, flops) for one captured op, or None (no kernel)."""
    nan = math.nan
    if base in NO_KERNEL:
        return None
    if not outs:
        # e.g. in-place ops return their input, which is in outs; ops returning nothing are
        # bookkeeping (record_stream, ...): no kernel.
        return None
    out = outs[0]
    if base in GEMM:
        if base in ("mm", "bmm"):
            a, b = args[0], args[1]
        else:                        # addmm(bias, a, b), baddbmm(c, a, b)
            a, b = args[1], args[2]
        if GEMM[base] == "LINEAR":
            Bd, (M, N), K = 1, a.shape, b.shape[1]
        else:
            Bd, M, N = a.shape
            K = b.shape[2]
        Bd, M, N, K = int(Bd), int(M), int(N), int(K)
        return GEMM[base], "", Bd, M, N, K, nan, 2.0 * Bd * M * N * K
    numel = out.numel()
    H = int(out.shape[-1]) if out.dim() > 0 else 1
    rows = numel // H if H else 0
    if base in SOFTMAX:
        return "SOFTMAX", "", rows, nan, nan, nan, H, float(OPS_PER_ELEMENT["SOFTMAX"] * numel)
    if base in LAYERNORM:
        H = int(out.shape[-1]) if out.dim() else 1
        return "LAYERNORM", "", numel // max(H, 1), nan, nan, nan, H, float(OPS_PER_ELEMENT["LAYERNORM"] * numel)
    if base in BATCHNORM or base in BATCHNORM_INFERENCE:
        # the forward ops take (input, weight, bias, running_mean, running_var, training, ...): eval() runs
        # them with training=False, i.e. with the running statistics
        inference = base in BATCHNORM_INFERENCE or (not base.endswith("backward") and len(args) > 5
                                                    and isinstance(args[5], bool) and not args[5])
        per = 2 if inference else OPS_PER_ELEMENT["LAYERNORM"]
        return "VEC", "mul", rows, nan, nan, nan, H, float(per * numel)
    if base in REDUCTION:
        src = ins[0] if ins else out
        n_in = src.numel()
        n_out = max(numel, 1)
        return "VEC", "add", n_out, nan, nan, nan, n_in // n_out, float(n_in)
    if base in BINARY and BINARY[base] is not None:
        op = BINARY[base]
        tensor_args = [a for a in args[:2] if isinstance(a, torch.Tensor) and a.dim() > 0]
        scalar = len(tensor_args) < 2 and any(_is_scalar_arg(a) for a in args[:2])
        return "VEC", op + ("u" if scalar else ""), rows, nan, nan, nan, H, float(numel)
    if base in UNARY:
        return "VEC", UNARY[base], rows, nan, nan, nan, H, float(numel)
    if base in MEM:
        return "MEM", "", rows, nan, nan, nan, H, 0.0
    return "UNCLASSIFIED", "", rows, nan, nan, nan, H, 0.0


def _square(v) -> int | None:
    """One int from an int or a list of equal ints (stride, padding, ...), else None."""
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return int(v[0]) if v and all(int(x) == int(v[0]) for x in v) else None


def conv_rows(base: str, args, out) -> list[tuple] | None:
    """The CONV rows of one ``aten.convolution`` / ``aten.convolution_backward`` (docs/interfaces.md):
    a list of (sub_op, op_class, B, M, N, K, H, flops, tensors read, tensors written, conv params), or None
    for a convolution outside the contract (not 2-D, transposed, dilated, non-square kernel, image or
    stride), which the caller keeps as UNCLASSIFIED.

    Implicit GEMM dims in the release convention ([M x N] @ [N x K], N the reduction), o = output side:
    fwd   M = B o^2,  N = Cin k^2 / g,  K = Cout   (reads input + weight, writes output)
    dgrad M = B i^2,  N = Cout k^2 / g, K = Cin    (reads grad-output + weight, writes grad-input)
    wgrad M = Cout,   N = B o^2,        K = Cin k^2 / g (reads grad-output + input, writes grad-weight)
    flops = 2 M N K. For a strided conv the dgrad GEMM over every input pixel counts stride^2 times the
    multiply-adds that reach a non-zero (the implicit GEMM's own work, which the measured kernels do too).
    A bias is one more VEC row each way: PyTorch adds it to the forward's output with its own element-wise
    kernel (``_convolution``: cuDNN's conv, then ``add_``), and its gradient is a per-channel sum of grad-output."""
    nan = math.nan
    if base == "convolution":
        x, w, bias, stride, pad, dil, transposed, _, groups = args[:9]
    else:
        gy, x, w, _, stride, pad, dil, transposed, _, groups, mask = args[:11]
    if (x.dim() != 4 or transposed or w.shape[2] != w.shape[3] or x.shape[2] != x.shape[3]
            or _square(dil) != 1 or _square(stride) is None or _square(pad) is None):
        return None
    B, cin, size = int(x.shape[0]), int(x.shape[1]), int(x.shape[2])
    cout, k, g = int(w.shape[0]), int(w.shape[2]), int(groups)
    s, p = _square(stride), _square(pad)
    o = (size + 2 * p - k) // s + 1
    params = (float(cin), float(cout), float(k), float(size), float(s), float(p), float(g))
    red_in, red_out = cin * k * k // g, cout * k * k // g
    if base == "convolution":
        M, N, K = B * o * o, red_in, cout
        rows = [("fwd", "CONV", B, M, N, K, nan, 2.0 * M * N * K, [x, w], [out], params)]
        if isinstance(bias, torch.Tensor):
            rows.append(("add", "VEC", B * cout * o, nan, nan, nan, o, float(out.numel()), [out, bias], [out],
                         _NO_CONV))
        return rows
    gx, gw, gb = out
    rows = []
    if mask[0] and isinstance(gx, torch.Tensor):
        M, N, K = B * size * size, red_out, cin
        rows.append(("dgrad", "CONV", B, M, N, K, nan, 2.0 * M * N * K, [gy, w], [gx], params))
    if mask[1] and isinstance(gw, torch.Tensor):
        M, N, K = cout, B * o * o, red_in
        rows.append(("wgrad", "CONV", B, M, N, K, nan, 2.0 * M * N * K, [gy, x], [gw], params))
    if len(mask) > 2 and mask[2] and isinstance(gb, torch.Tensor):
        rows.append(("add", "VEC", cout, nan, nan, nan, B * o * o, float(gy.numel()), [gy], [gb], _NO_CONV))
    return rows


# --------------------------------------------------------------------------------------------
# capture
# --------------------------------------------------------------------------------------------
class _Recorder(TorchDispatchMode):
    """Records one row per kernel and the memory timeline of the buffers the ops allocate.

    Buffers are storages (views share their base's). Each gets a serial number when first seen; a
    ``weakref.finalize`` on the storage notes when Python frees it, exactly as eager PyTorch would
    free the GPU memory (meta storages hold no memory, but their lifetimes are the real ones: saved
    tensors live until backward consumes them, temporaries die when the last reference goes). A
    storage an op returns that none of its inputs has is a new allocation. ``mem_events`` lists
    (row, buffer, +bytes | -bytes) in program order, ``row`` = index of the kernel row the event
    precedes or belongs to (allocations of no-kernel ops such as ``empty`` go with the next row).
    """

    def __init__(self, params_by_id: dict[int, str]):
        super().__init__()
        self.rows: list[tuple] = []
        self._serial: dict[int, int] = {}      # storage _cdata -> serial number while it lives
        self._alloc: dict[int, int] = {}       # serial -> bytes, buffers allocated while recording
        self._next_serial = 0
        self.mem_events: list[tuple[int, int, int]] = []
        self.closed = False
        self.module_stack: list[str] = ["loss"]  # base entry: ops outside the model (the loss)
        self.phase = "fw"
        self.params_by_id = params_by_id
        self.unclassified: Counter = Counter()
        self.skipped: Counter = Counter()
        self.scalar_queries: Counter = Counter()  # .item() calls answered, by dtype

    # ------------------------------------------------------------ buffers and memory
    def _key(self, t: torch.Tensor) -> int:
        """Serial number of the tensor's storage, unique within the trace (never reused)."""
        st = t.untyped_storage()
        cd = st._cdata
        k = self._serial.get(cd)
        if k is None:
            k = self._serial[cd] = self._next_serial
            self._next_serial += 1
            weakref.finalize(st, self._freed, cd, k)
        return k

    def _freed(self, cdata: int, key: int) -> None:
        if self._serial.get(cdata) == key:
            del self._serial[cdata]
        if not self.closed and key in self._alloc:
            self.mem_events.append((len(self.rows), key, -self._alloc[key]))

    def track(self, tensors) -> tuple[int, tuple]:
        """Count already existing tensors (the KV cache) as allocated now: (bytes, buffer keys)."""
        total, keys = 0, []
        for t in tensors:
            k = self._key(t)
            if k not in self._alloc:
                b = int(t.untyped_storage().nbytes())
                self._alloc[k] = b
                total += b
                keys.append(k)
                self.mem_events.append((len(self.rows), k, b))
        return total, tuple(keys)

    def _note_allocations(self, outs, ins) -> None:
        in_keys = {self._key(t) for t in ins}
        for t in outs:
            k = self._key(t)
            if k in in_keys or k in self._alloc:
                continue
            b = int(t.untyped_storage().nbytes())
            self._alloc[k] = b
            self.mem_events.append((len(self.rows), k, b))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        base, full = _op_name(func)
        if base in ("_local_scalar_dense", "is_nonzero"):
            # .item() on a meta tensor has no value. transformers 5 calls it once, in mask
            # pre-processing: `(packed_sequence_mask[:, -1] == 0).all()` in
            # find_packed_sequence_indices, which is True for real unpadded, unpacked input
            # (position ids 0..s-1 in every row). Answering True for booleans takes that real
            # path; numbers get 0. Every answer is counted in attrs["scalar_queries"].
            t = args[0]
            self.scalar_queries[str(t.dtype).replace("torch.", "")] += 1
            if t.dtype == torch.bool:
                return True
            return 0.0 if t.dtype.is_floating_point else 0
        out = func(*args, **kwargs)
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        self._note_allocations(outs, ins)
        if base in CONV and outs:
            conv = conv_rows(base, args, out)
            if conv is not None:
                self._add_conv_rows(full, conv)
                return out
        c = classify(base, args, kwargs, outs, ins)
        if c is None:
            self.skipped[full] += 1
            return out
        op_class, sub_op, Bd, M, N, K, H, flops = c
        if op_class == "UNCLASSIFIED":
            self.unclassified[full] += 1
        phase, module = self._where()
        # in-place / out= ops: the written tensor is also an input; count it once as written
        out_ids = {id(t) for t in outs}
        if base == "copy_":
            read_t = [args[1]] if isinstance(args[1], torch.Tensor) else []
        else:
            read_t = [t for t in ins if id(t) not in out_ids or base.endswith("_")]
        # (buffer key, bytes) of every tensor read / written: fusion.py uses them to drop the
        # traffic of intermediates. Views share their base's storage, hence the storage key (a
        # serial number, so a freed storage's key is never reused; no reference is held, so
        # AccumulateGrad still steals gradients and lifetimes stay those of eager PyTorch).
        self._append(phase, module, full, op_class, sub_op, (Bd, M, N, K, H), flops, read_t, outs,
                     _NO_CONV + _NO_ATTN)
        return out

    def _append(self, phase, module, full, op_class, sub_op, dims, flops, read_t, write_t, extra) -> None:
        """One kernel row; its dtype is that of its first output."""
        reads = tuple((self._key(t), _nbytes(t)) for t in read_t)
        writes = tuple((self._key(t), _nbytes(t)) for t in write_t)
        self.rows.append((phase, full, op_class, sub_op, *dims, flops,
                          sum(b for _, b in reads), sum(b for _, b in writes),
                          str(write_t[0].dtype).replace("torch.", ""), module, layer_of(module),
                          reads, writes) + extra)

    def _where(self) -> tuple[str, str]:
        """(phase, module) of the op being dispatched (backward: from the autograd node)."""
        phase, module = self.phase, self.module_stack[-1]
        if phase == "bw":
            node = torch._C._current_autograd_node()
            if node is not None:
                if type(node).__name__ == "AccumulateGrad":
                    return "acc", self.params_by_id.get(id(node.variable), "")
                module = node.metadata.get("module", "loss")
        return phase, module

    def _add_conv_rows(self, full: str, conv: list[tuple]) -> None:
        """One row per CONV kernel of ``conv_rows`` (a backward launch gives its dgrad and wgrad rows)."""
        phase, module = self._where()
        for sub_op, cls, Bd, M, N, K, H, flops, read_t, write_t, params in conv:
            self._append(phase, module, full, cls, sub_op, (Bd, M, N, K, H), flops, read_t, write_t,
                         tuple(params) + _NO_ATTN)

    def add_attention(self, sub_op: str, q, k, v, read_t, write_t, causal: bool) -> None:
        """One fused-attention row (``attention="sdpa"``): q (batch, heads, seq_q, d), k / v (batch, kv_heads,
        seq_kv, d). FLOPs as ``measured_kernels.attention_kernels`` counts them (4 b h d x the (query, key)
        pairs, causal or full), times ``ATTN_BACKWARD_FLOPS`` for the backward."""
        b, h, sq, d = (int(x) for x in q.shape)
        hkv, skv = int(k.shape[1]), int(k.shape[2])
        pairs = (skv * (skv + 1) / 2 - (skv - sq) * (skv - sq + 1) / 2) if causal else float(sq * skv)
        flops = 4.0 * b * h * d * pairs * (ATTN_BACKWARD_FLOPS if sub_op == "backward" else 1.0)
        phase, module = self._where()
        nan = math.nan
        self._append(phase, module, "aten._scaled_dot_product_flash_attention.default", "ATTN", sub_op,
                     (b, nan, nan, nan, nan), flops, read_t, write_t, _NO_CONV + (sq, skv, h, hkv, d))


class _FusedAttentionFn(torch.autograd.Function):
    """A fused attention kernel on meta tensors: the output (and the softmax statistics a FlashAttention forward
    keeps for its backward, FP32 per query and head) are allocated as a GPU would, one ATTN row is recorded per
    forward and one per backward, and no S x S score matrix ever exists."""

    @staticmethod
    def forward(ctx, q, k, v, rec, causal):
        o = q.new_empty(q.shape[:-1] + (v.shape[-1],))
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        rec.add_attention("prefill" if q.shape[2] > 1 else "decode", q, k, v, [q, k, v], [o, lse], causal)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.rec, ctx.causal = rec, causal
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        ctx.rec.add_attention("backward", q, k, v, [q, k, v, o, do, lse], [dq, dk, dv], ctx.causal)
        return dq, dk, dv, None, None


class _FusedAttention(TorchFunctionMode):
    """``attention="sdpa"`` (issue 33): every ``F.scaled_dot_product_attention`` call is one fused kernel
    (``_FusedAttentionFn``). On meta tensors PyTorch would otherwise run its math fallback (Q K^T, softmax,
    P V as separate ops), which is eager attention again. Causal: the call says so, or the model is a causal
    LM that passes its causal mask as a tensor."""

    def __init__(self, rec: _Recorder, causal_lm: bool):
        super().__init__()
        self.rec, self.causal_lm = rec, causal_lm

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not torch.nn.functional.scaled_dot_product_attention:
            return func(*args, **kwargs)
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
        a = dict(zip(names, args), **kwargs)
        q, k, v = a["query"], a["key"], a["value"]
        causal = bool(a.get("is_causal")) or (a.get("attn_mask") is not None and self.causal_lm)
        return _FusedAttentionFn.apply(q, k, v, self.rec, causal)


def _cuda_dropout(input, p=0.5, training=True, inplace=False):
    """Dropout as eager PyTorch runs it on a GPU.

    ``F.dropout`` picks its implementation by device: on CUDA one fused ``native_dropout`` kernel
    (and ``native_dropout_backward``), elsewhere -- including meta -- bernoulli_ + div_ + mul. We
    trace on meta but predict GPUs, so we call the CUDA path's op directly.
    """
    if not training or p == 0:
        return input
    return torch.native_dropout(input, p, True)[0]


class _NodeTagger(TorchFunctionMode):
    """Stamp every autograd node created in forward with the module that created it."""

    def __init__(self, module_stack: list[str]):
        super().__init__()
        self.module_stack = module_stack

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.dropout:
            out = _cuda_dropout(*args, **kwargs)
        else:
            out = func(*args, **kwargs)
        mod = self.module_stack[-1]
        # A composite function (matmul, linear, ...) creates several nodes; only the last is on
        # the output. Walk back through untagged nodes: everything older is already tagged, so
        # each node is visited about once over the whole forward pass.
        todo = [t.grad_fn for t in tree_flatten(out)[0]
                if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        while todo:
            fn = todo.pop()
            if fn is None or "module" in fn.metadata or type(fn).__name__ == "AccumulateGrad":
                continue
            fn.metadata["module"] = mod
            todo.extend(nf for nf, _ in fn.next_functions)
        return out


def _install_module_hooks(model, stack: list[str]):
    handles = []
    for name, mod in model.named_modules():
        def pre(m, a, name=name):
            stack.append(name)

        def post(m, a, o):
            stack.pop()

        handles.append(mod.register_forward_pre_hook(pre))
        handles.append(mod.register_forward_hook(post, always_call=True))
    return handles


def switch_routing_stand_in(model) -> int:
    """Replace Switch Transformers' data-dependent expert dispatch with an even spread.

    On meta tensors the router's argmax has no value, so which token goes to which expert is
    unknown (upstream indexes with it and fails). Stand-in, stated here where it is made: every
    expert receives min(ceil(seq / num_experts), expert_capacity) tokens of each sequence, i.e.
    tokens are spread evenly over the experts and each expert is filled up to its capacity (64 in
    the authors' switchxl4 config; with seq 512 and 4 experts every expert runs 64 x batch tokens,
    the same GEMM shapes as in the authors' op graph). Tokens over capacity pass through unchanged,
    as upstream does. Returns the number of patched MLPs.
    """
    try:
        from transformers.models.switch_transformers import modeling_switch_transformers as sw
    except ImportError:
        return 0
    n = 0
    for mod in model.modules():
        if isinstance(mod, sw.SwitchTransformersSparseMLP):
            mod.forward = _make_switch_forward(mod)
            n += 1
    return n


def _make_switch_forward(mlp):
    def forward(hidden_states):
        b, s, d = hidden_states.shape
        # the router still runs (classifier GEMM, softmax, argmax/one-hot/cumsum bookkeeping)
        _, router_probs, _ = mlp.router(hidden_states)
        e = mlp.router.num_experts
        per_seq = configs.switch_tokens_per_expert(s, e, mlp.router.expert_capacity)
        flat = hidden_states.reshape(-1, d)
        final = torch.zeros_like(flat)
        weights = router_probs.max(dim=-1).values.reshape(-1, 1)
        for i in range(e):
            # tokens of expert i: a block of per_seq positions in every sequence
            idx = (torch.arange(per_seq, device=flat.device)[None, :]
                   + (torch.arange(b, device=flat.device)[:, None] * s + i * per_seq)).reshape(-1)
            cur = flat.index_select(0, idx)
            y = mlp.experts[f"expert_{i}"](cur) * weights.index_select(0, idx)
            final = final.index_add(0, idx, y)
        return final.reshape(b, s, d)
    return forward


def _inputs(model, cfg, batch: int, seq: int, train: bool, dtype=torch.float32) -> dict:
    if configs.is_image_model(cfg):
        # image models (issue 26): a batch of square images, seq = their side; the classification head's
        # loss takes one class label per image
        kw = {"pixel_values": torch.zeros((batch, int(cfg.num_channels), seq, seq), dtype=dtype, device="meta")}
        if train:
            kw["labels"] = torch.zeros((batch,), dtype=torch.long, device="meta")
        return kw
    ids = torch.zeros((batch, seq), dtype=torch.long, device="meta")
    kw = {"input_ids": ids}
    if getattr(cfg, "is_encoder_decoder", False):
        kw["decoder_input_ids"] = ids
    if train:
        kw["labels"] = ids
        name = type(model).__name__
        if name.endswith("ForSequenceClassification"):
            kw["labels"] = torch.zeros((batch,), dtype=torch.long, device="meta")
        if name.endswith("ForPreTraining"):
            kw["next_sentence_label"] = torch.zeros((batch,), dtype=torch.long, device="meta")
    return kw


def _filled_cache(cfg, batch: int, past: int, dtype=torch.float32):
    """A transformers DynamicCache holding ``past`` tokens of meta K/V for every layer."""
    from transformers import DynamicCache
    if getattr(cfg, "is_encoder_decoder", False) or cfg.model_type in ("bert",):
        raise TraceError(f"a KV cache needs a decoder-only model, not {cfg.model_type!r}")
    heads = getattr(cfg, "num_attention_heads", None) or getattr(cfg, "n_head")
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or hidden_size(cfg) // heads
    cache = DynamicCache(config=cfg)
    for i in range(num_layers(cfg)):
        k = torch.empty((batch, kv_heads, past, head_dim), device="meta", dtype=dtype)
        cache.update(k, torch.empty_like(k), i)
    return cache


def build_model(cfg, mode: str | None = None, dtype: str = "fp32", attention: str = "eager"):
    """The model of ``cfg`` on the meta device: FP32 (or ``dtype``), eager (or ``attention``) attention, no KV
    cache."""
    cls = _model_class(cfg, mode)
    cfg.use_cache = False
    try:
        cfg._attn_implementation = attention
    except Exception:  # noqa: BLE001 - older/newer config APIs; the kwarg below also sets it
        pass
    tdt = TORCH_DTYPES[dtype]
    with torch.device("meta"):
        try:
            model = cls._from_config(cfg, attn_implementation=attention, dtype=tdt)
        except ValueError as e:
            if attention == "eager":
                raise
            raise TraceError(f"{cfg.model_type} has no fused attention ({attention}) in transformers: use "
                             f"--attention eager ({str(e).splitlines()[0][:120]})") from None
    if getattr(model, "loss_type", "") is None:
        # transformers finds no loss in names like GPT2LMHeadModel and falls back to the causal-LM
        # loss with a warning on every process; say so explicitly (same loss, no warning).
        model.loss_type = "ForCausalLM"
    return model.float() if tdt == torch.float32 else model.to(tdt)


def trace_model(config_or_name, batch: int, seq: int, mode: str = "inf",
                accumulate_grads: bool = True, authors_heads: bool = True, past: int = 0,
                dtype: str = "fp32", attention: str = "eager") -> pd.DataFrame:
    """Kernel table of one forward pass (``inf``) or forward + loss + backward (``train``).

    ``accumulate_grads``: in training, parameters already hold a gradient (as in the authors'
    measured loop, whose labels carry an accumulation latency), so autograd adds each new
    gradient into it: one ``acc`` kernel per parameter. False = gradients start as None
    (``zero_grad(set_to_none=True)``), and no accumulation kernels appear.

    ``authors_heads``: use the task heads the authors traced (see ``AUTHORS_HEADS``) instead of
    the config's ``architectures``.

    ``past`` (extension, inference of decoder-only models): a KV cache already holding ``past``
    tokens, so ``seq`` new tokens attend to ``past + seq`` keys; ``seq=1`` is one decode step.
    The cache is filled before recording (it exists before the step); the step's own cache
    append (a ``cat`` per layer, as HF's eager decode runs it) is recorded.

    Image models (``configs.is_image_model``: ResNet, ViT; issue 26) take ``pixel_values`` of shape
    (batch, channels, seq, seq): ``seq`` is the image side in pixels (``attrs["image_size"]``; 0 for text
    models). A ViT is built for that side (``image_size`` set in its config, so its position embeddings
    have one entry per patch, as when fine-tuning at a new resolution). No KV cache for them.

    ``dtype`` (fp32 | tf32 | fp16 | bf16): the precision the model runs in. fp32 is the paper's
    (FP32 tensors, TF32 off); fp16/bf16 build the model in that dtype, so every tensor's bytes follow
    it (ops the model code runs in FP32, e.g. softmax or RMSNorm upcasts, stay FP32); tf32 keeps FP32
    tensors and marks FP32 GEMMs ``precision == "tf32"`` (tensor cores). The ``precision`` column
    holds each kernel's arithmetic; predictors take the GEMM peak from it. Precisions other than
    fp32 are an extension: the predictors were trained and validated on FP32 kernels.

    ``attention`` (eager | sdpa, issue 33): eager is the paper's (Q K^T, softmax and P V as separate kernels, the
    S x S scores in memory); sdpa builds the model with fused attention, as Hugging Face does by default, and each
    attention call is one ATTN row (``sub_op`` prefill when more than one query token, decode for one, backward
    for its gradient) with the ``ATTN_COLUMNS`` geometry; no S x S tensor is allocated.

    Memory (``attrs["memory"]``, see :class:`_Recorder`): ``activation_peak_bytes`` = the peak of
    the bytes of buffers allocated while running (activations, saved tensors, temporaries, new
    gradients), over the whole forward (+ backward); ``kv_cache_bytes`` = the KV cache the step
    starts from (``past`` > 0; its growth during the step is part of the activations);
    ``events`` = the timeline (arrays ``row``, ``buf``, ``bytes``) that ``memory.py`` rescales for
    parallel plans. Weights, existing gradients and optimizer state are not in it (``memory.py``).

    The frame's ``attrs`` hold ``unclassified`` (aten op -> count), ``skipped`` (no-kernel ops),
    ``model``, ``batch``, ``seq``, ``mode``, ``num_layers``, ``dtype``, ``memory`` and ``trace_s``.
    """
    for nm, v in (("batch", batch), ("seq", seq)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
            raise TraceError(f"{nm} must be a positive integer, got {v!r}")
    if mode not in ("inf", "train"):
        raise TraceError(f"mode must be 'inf' or 'train', got {mode!r}")
    if isinstance(past, bool) or not isinstance(past, (int, np.integer)) or past < 0:
        raise TraceError(f"past must be a non-negative integer, got {past!r}")
    if past and mode != "inf":
        raise TraceError("a KV cache (past > 0) is for inference only")
    if dtype not in schema.PRECISIONS:
        raise TraceError(f"dtype must be one of {', '.join(schema.PRECISIONS)}, got {dtype!r}")
    if attention not in schema.ATTENTIONS:
        raise TraceError(f"attention must be one of {', '.join(schema.ATTENTIONS)}, got {attention!r}")
    t0 = time.perf_counter()
    cfg = load_config(config_or_name)
    image = configs.is_image_model(cfg)
    if image:
        if past:
            raise TraceError(f"a KV cache (past > 0) is for text decoders, not the image model {cfg.model_type!r}")
        if hasattr(cfg, "image_size"):
            cfg.image_size = int(seq)
    maxpos = _max_positions(cfg)
    if maxpos is not None and seq + past > maxpos:
        raise TraceError(f"seq {seq + past} exceeds the model's {maxpos} positions ({cfg.model_type})")
    train = mode == "train"
    model = build_model(cfg, mode if authors_heads else None, dtype, attention)
    model.train(train)  # dropout kernels only in training (eval() makes dropout an identity)
    switch_routing_stand_in(model)
    params = dict(model.named_parameters())
    if train and accumulate_grads:
        for p in params.values():
            p.grad = torch.empty_like(p)
    rec = _Recorder({id(p): n for n, p in params.items()})
    handles = _install_module_hooks(model, rec.module_stack)
    kw = _inputs(model, cfg, int(batch), int(seq), train, TORCH_DTYPES[dtype])
    kv_bytes, kv_bufs = 0, ()
    if past:
        cache = _filled_cache(cfg, int(batch), int(past), TORCH_DTYPES[dtype])
        kv_bytes, kv_bufs = rec.track(_cache_tensors(cache))
        kw.update(past_key_values=cache, use_cache=True)
        del cache
    fused = (_FusedAttention(rec, type(model).__name__.endswith("ForCausalLM") or bool(getattr(cfg, "is_decoder", 0))
                             or cfg.model_type in ("gpt2", "opt", "llama", "qwen2"))
             if attention == "sdpa" else contextlib.nullcontext())
    try:
        with torch.autograd.set_grad_enabled(train), fused:
            if train:
                with _NodeTagger(rec.module_stack), rec:
                    out = model(**kw)
                    loss = out.loss if getattr(out, "loss", None) is not None else out[0].float().mean()
                with rec:
                    rec.phase = "bw"
                    loss.backward()
            else:
                # no_grad, not inference_mode: under inference_mode composite ops (matmul,
                # layer_norm, ...) reach the dispatch mode undecomposed
                with torch.no_grad(), rec:
                    model(**kw)
    except TraceError:
        raise
    except Exception as e:  # noqa: BLE001 - any failure of the model code becomes one clear line
        msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        what = (f"pixel_values of shape ({batch}, {getattr(cfg, 'num_channels', 3)}, {seq}, {seq})" if image
                else f"input_ids of shape ({batch}, {seq})")
        raise TraceError(f"cannot trace {cfg.model_type!r} ({cfg.name_or_path}) with {what}: "
                         f"{type(e).__name__}: {msg}") from None
    finally:
        for h in handles:
            h.remove()
    kw.clear()
    out = loss = None  # noqa: F841 - the step's outputs die here, as in a serving/training loop
    rec.closed = True
    memory = _memory_summary(rec, kv_bytes, kv_bufs)
    if rec.unclassified:
        import warnings

        warnings.warn(f"{sum(rec.unclassified.values())} kernels of aten ops without an op class kept as "
                      f"UNCLASSIFIED (memory-bound): {dict(rec.unclassified)}", stacklevel=2)
    df = pd.DataFrame.from_records(rec.rows, columns=COLUMNS[:15] + ["reads", "writes"] + CONV_COLUMNS + ATTN_COLUMNS)
    attn = df[ATTN_COLUMNS].astype(float) if (df["op_class"] == "ATTN").any() else None
    df["count"] = 1
    df["comm_kind"] = ""
    df["comm_bytes"] = 0.0
    df["overlap"] = False
    df["stage"] = 0
    conv = df[CONV_COLUMNS].astype(float)
    df = df[COLUMNS + ["reads", "writes"]]
    for c in ("B", "M", "N", "K", "H", "flops", "bytes_read", "bytes_written"):
        df[c] = df[c].astype(float)
    df["precision"] = df["dtype"].map(_DTYPE_PRECISION).fillna("fp32")
    if dtype == "tf32":   # cuDNN convolutions use TF32 tensor cores when allowed, as cuBLAS GEMMs do
        df.loc[df["op_class"].isin(["BMM", "LINEAR", "CONV"]) & (df["precision"] == "fp32"), "precision"] = "tf32"
    df[CONV_COLUMNS] = conv
    if attn is not None:      # only tables with fused attention carry its columns (eager tables are unchanged)
        df[ATTN_COLUMNS] = attn
    df.attrs.update(config=dict(cfg.to_dict(), name=cfg.name_or_path), hidden=hidden_size(cfg), vocab=int(getattr(cfg, "vocab_size", 0) or 0),
                    params={n: int(p.numel()) for n, p in params.items()},
                    model=cfg.name_or_path or cfg.model_type, model_class=type(model).__name__,
                    batch=int(batch), seq=int(seq), past=int(past), dtype=dtype, attention=attention, memory=memory,
                    image_size=int(seq) if image else 0,
                    mode=mode, num_layers=num_layers(cfg), unclassified=dict(rec.unclassified),
                    skipped=dict(rec.skipped), scalar_queries=dict(rec.scalar_queries),
                    trace_s=time.perf_counter() - t0)
    return df


def _cache_tensors(cache) -> list:
    """The K/V tensors a transformers cache holds (DynamicCache of transformers 4.x or 5.x)."""
    out = []
    for layer in getattr(cache, "layers", None) or []:
        out += [t for t in (getattr(layer, "keys", None), getattr(layer, "values", None)) if isinstance(t, torch.Tensor)]
    if not out:
        for name in ("key_cache", "value_cache"):
            out += [t for t in getattr(cache, name, []) if isinstance(t, torch.Tensor)]
    return out




def _memory_summary(rec: _Recorder, kv_bytes: int, kv_bufs: tuple) -> dict:
    tl = schema.MemoryTimeline(rec.mem_events)
    return {"activation_peak_bytes": max(tl.peak(), kv_bytes) - kv_bytes, "kv_cache_bytes": float(kv_bytes),
            "kv_bufs": kv_bufs, "rows": len(rec.rows), "events": tl}


def hidden_size(cfg) -> int:
    for k in ("hidden_size", "n_embd", "d_model"):
        v = getattr(cfg, k, None)
        if isinstance(v, int):
            return v
    return 0


def num_layers(cfg) -> int:
    for k in ("num_hidden_layers", "n_layer", "num_layers"):
        v = getattr(cfg, k, None)
        if isinstance(v, int):
            return v + (getattr(cfg, "num_decoder_layers", 0) or 0 if k == "num_layers" else 0)
    return 0


def attention_mask_ops(kernels: pd.DataFrame) -> np.ndarray:
    """Rows that apply an attention mask: a forward binary element-wise add inside a transformer layer whose
    shape is that layer's attention scores (the rows x length of a softmax of the same layer), i.e. the mask
    added to the scores (for Switch / T5 the mask and the position bias in one add). The model-level ops that
    build the mask once from the input are not counted: they touch batch x seq elements, not the scores."""
    k = kernels
    soft = k[(k["op_class"] == "SOFTMAX") & (k["phase"] == "fw")]
    scores = set(zip(soft["layer"], soft["B"], soft["H"]))
    cand = ((k["op_class"] == "VEC") & (k["sub_op"] == "add") & (k["phase"] == "fw") & (k["layer"] >= 0)).to_numpy()
    return cand & np.fromiter((key in scores for key in zip(k["layer"], k["B"], k["H"])), bool, len(k))


def summarize(kernels: pd.DataFrame, by=("phase", "op_class")) -> pd.DataFrame:
    """Kernel count, FLOPs and bytes per group (``count`` weights each row)."""
    k = kernels.assign(n=kernels["count"], f=kernels["flops"] * kernels["count"],
                       b=(kernels["bytes_read"] + kernels["bytes_written"]) * kernels["count"])
    return (k.groupby(list(by), observed=True)[["n", "f", "b"]].sum()
            .rename(columns={"n": "kernels", "f": "flops", "b": "bytes"}).reset_index())
