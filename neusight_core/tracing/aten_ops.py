"""Which aten op is which kernel: the tracer's vocabulary of ops (no kernel, GEMM, softmax, norms, element-wise,
reductions, copies, convolutions) and the kernel row of one op (``classify``; ``conv_rows`` for convolutions).
``trace.py`` records the ops a model dispatches and asks this module what each one launches on a GPU.
"""
from __future__ import annotations

import math
import re

import torch

from neusight_core.question import schema
from neusight_core.question.schema import OpClass

NO_CONV = (math.nan,) * len(schema.CONV_COLUMNS)   # the conv parameters of a non-CONV row

# Ops that launch no kernel: views/metadata, allocation without initialisation, host syncs.
NO_KERNEL = {
    "view", "_unsafe_view", "reshape", "_reshape_alias", "t", "transpose", "permute", "expand",
    "expand_as", "unsqueeze", "squeeze", "slice", "select", "as_strided", "alias", "detach",
    "split", "split_with_sizes", "unbind", "chunk", "narrow", "empty", "empty_like",
    "empty_strided", "new_empty", "new_empty_strided", "_local_scalar_dense", "lift_fresh",
    "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size", "diagonal",
    "unfold", "view_as", "set_", "resize_", "_has_compatible_shallow_copy_type", "t_",
    "transpose_", "unsqueeze_", "squeeze_", "as_strided_", "_unsafe_index_put_",
    "is_nonzero", "item", "numpy_T", "movedim", "_to_copy_noop", "view_as_complex", "view_as_real",
    "_conj", "conj",
}
GEMM = {"mm": OpClass.LINEAR, "addmm": OpClass.LINEAR, "bmm": OpClass.BMM, "baddbmm": OpClass.BMM}
# One kernel for every expert of a mixture-of-experts layer: Hugging Face's default experts implementation
# (``grouped_mm``, transformers 5) runs each projection of all experts as one grouped GEMM (``grouped_gemm``).
GROUPED_OPS = {"_grouped_mm", "grouped_mm"}
SOFTMAX = {"_softmax", "_safe_softmax", "_log_softmax", "_softmax_backward_data",
           "_log_softmax_backward_data"}
LAYERNORM = {"native_layer_norm", "native_layer_norm_backward"}
# Element-wise ops -> the predictor's sub-op vocabulary (SPEC 3.1: add, mul, div, pow, tanh, relu,
# gelu; "u" = with a scalar). Ops outside that vocabulary map to the nearest one by work per
# element (one read, one write, one cheap transcendental or arithmetic op per element).
BINARY = {"add": "add", "sub": "add", "rsub": "add", "mul": "mul", "div": "div", "floor_divide": "div", "pow": "pow",
          "maximum": "add", "minimum": "add", "add_": "add", "sub_": "add", "mul_": "mul",
          "div_": "div", "pow_": "pow", "addcmul": "mul", "addcdiv": "div", "lerp": "add",
          "masked_fill": None}
UNARY = {"tanh": "tanh", "relu": "relu", "gelu": "gelu", "silu": "gelu", "sigmoid": "tanh",
         "exp": "tanh", "log": "tanh", "log1p": "tanh", "softplus": "tanh", "softplus_backward": "tanh", "erf": "tanh", "sqrt": "powu", "rsqrt": "powu",
         "reciprocal": "divu", "neg": "mulu", "abs": "mulu", "clamp": "relu", "clamp_min": "relu",
         "clamp_max": "relu", "threshold": "relu", "gelu_backward": "gelu", "tanh_backward": "tanh",
         "threshold_backward": "relu", "silu_backward": "gelu", "sigmoid_backward": "tanh",
         "relu_": "relu", "tanh_": "tanh", "exp_": "tanh", "neg_": "mulu", "sqrt_": "powu",
         "rsqrt_": "powu", "clamp_": "relu", "clamp_min_": "relu", "sin": "tanh", "cos": "tanh"}
REDUCTION = {"sum", "mean", "_adaptive_avg_pool2d"}   # -> VEC add over the reduced elements
# Batch norm -> VEC "mul": a multiply-add per element once the per-channel statistics are known.
# FLOPs per element as for layer norm (SPEC 3.1: 6; the same mean / variance / normalise / affine work) in
# training, forward and backward; 2 (scale and shift with the running statistics) in inference. Not
# LAYERNORM: that class's rows are the normalised rows of H elements, a batch norm reduces one channel
# over batch x pixels (a strided reduction of up to millions of elements), a shape its data never had.
BATCHNORM = {"native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
             "cudnn_batch_norm", "miopen_batch_norm", "native_batch_norm_backward",
             "cudnn_batch_norm_backward", "miopen_batch_norm_backward"}
BATCHNORM_INFERENCE = {"_native_batch_norm_legit_no_training"}
# 2-D convolutions: forward, and the backward that computes the input and / or weight gradient
# (split into one row each, see conv_rows).
CONV = {"convolution", "convolution_backward"}
# Memory-bound ops (bytes / bandwidth in every predictor).
MEM = {
    "embedding", "embedding_dense_backward", "native_dropout", "native_dropout_backward",
    "where", "index", "index_select", "gather", "scatter", "scatter_", "scatter_add", "scatter_add_", "index_put",
    "index_put_", "index_add", "index_add_", "masked_fill", "masked_fill_", "copy_", "copy",
    "clone", "_to_copy", "contiguous", "cat", "stack", "fill_", "fill", "zero_", "zeros",
    "zeros_like", "ones", "ones_like", "full", "full_like", "new_zeros", "new_ones", "new_full",
    "arange", "tril", "triu", "eq", "ne", "lt", "gt", "le", "ge", "logical_not", "logical_and",
    "logical_or", "logical_and_", "logical_or_", "bitwise_not", "bitwise_and", "bitwise_or", "nll_loss_forward",
    "nll_loss_backward", "nll_loss2d_forward", "nll_loss2d_backward", "cumsum", "topk",
    "argmax", "argmin", "max", "min", "amax", "amin", "sort", "one_hot", "constant_pad_nd",
    "repeat", "masked_scatter", "scalar_tensor", "select_backward", "slice_backward",
    "bernoulli", "bernoulli_", "uniform_", "normal_", "rand", "randn", "rand_like", "any", "all",
    "isinf", "isnan", "sign", "_unsafe_index", "expand_copy", "nonzero", "count_nonzero",
    "lift_fresh_copy", "masked_select", "histc", "index_copy", "index_copy_", "fill_diagonal_",
    "_index_put_impl_", "split_copy", "unsqueeze_copy", "bucketize", "floor", "ceil", "round",
    "trunc", "eq_", "ne_", "native_dropout_", "squeeze_copy", "alias_copy", "unbind_copy", "polar",
    "conj_physical", "_conj_physical",
    # pooling windows: a few compares / adds per element read, memory-bound
    "max_pool2d_with_indices", "max_pool2d_with_indices_backward", "avg_pool2d", "avg_pool2d_backward",
    "_adaptive_avg_pool2d_backward",
}
# FLOPs per output element (SPEC 3.1: 1 for element-wise ops, 5 softmax, 6 layernorm).
OPS_PER_ELEMENT = {OpClass.VEC: 1, OpClass.SOFTMAX: 5, OpClass.LAYERNORM: 6}

_LAYER_RE = re.compile(r"(?:^|\.)(?:h|layers|layer|block|blocks)\.(\d+)(?:\.|$)")


_OP_NAMES: dict = {}     # op overload -> its two names (a trace asks once per dispatched op: 10^5 times)


def op_name(func) -> tuple[str, str]:
    """(packet name e.g. 'addmm', full name e.g. 'aten.addmm.default')."""
    names = _OP_NAMES.get(func)
    if names is None:
        name = func.__name__  # e.g. 'addmm.default'
        names = _OP_NAMES[func] = (name.split(".")[0], f"{func.namespace}.{name}")
    return names


def tensors_in(x) -> list:
    """The tensors in ``x`` (nested tuples, lists and dicts' values) in the order ``tree_flatten`` gives them,
    without its generality: torch's pytree took a fifth of a trace's time."""
    out: list = []
    _collect(x, out)
    return out


def call_tensors(args, kwargs) -> list:
    """``tensors_in((args, kwargs))`` of an op's call, without building the pair."""
    out: list = []
    _collect(args, out)
    if kwargs:
        _collect(kwargs, out)
    return out


def _collect(x, out: list) -> None:
    # the leaves of a container are looked at here, not in a call each: most are tensors or numbers
    if isinstance(x, torch.Tensor):
        out.append(x)
        return
    if isinstance(x, dict):
        x = x.values()
    elif not isinstance(x, (tuple, list)):
        return
    for v in x:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (tuple, list, dict)):
            _collect(v, out)


def tensor_nbytes(t: torch.Tensor) -> int:
    """Bytes the tensor occupies: broadcast (stride-0) dims are stored once, so count them once."""
    if 0 not in t.stride():
        return t.numel() * t.element_size()
    n = 1
    for s, st in zip(t.shape, t.stride()):
        if st != 0:
            n *= int(s)
    return n * t.element_size()


_DTYPE_NAMES: dict = {}     # torch.float32 -> "float32"


def dtype_name(dtype) -> str:
    """A torch dtype as the kernel table's ``dtype`` column names it."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).replace("torch.", "")
    return name


_LAYERS: dict = {}         # module name -> its layer index (asked once per kernel row)


def layer_of(module: str) -> int:
    layer = _LAYERS.get(module)
    if layer is None:
        m = _LAYER_RE.search(module)
        layer = _LAYERS[module] = int(m.group(1)) if m else -1
    return layer


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
        if GEMM[base] == OpClass.LINEAR:
            Bd, (M, N), K = 1, a.shape, b.shape[1]
        else:
            Bd, M, N = a.shape
            K = b.shape[2]
        Bd, M, N, K = int(Bd), int(M), int(N), int(K)
        return GEMM[base], "", Bd, M, N, K, nan, 2.0 * Bd * M * N * K
    if base in GROUPED_OPS:
        Bd, M, N, K, flops, _ = grouped_gemm(args)
        return OpClass.BMM, schema.GROUPED_GEMM, Bd, M, N, K, nan, flops
    numel = out.numel()
    H = int(out.shape[-1]) if out.dim() > 0 else 1
    rows = numel // H if H else 0
    if base in SOFTMAX:
        return OpClass.SOFTMAX, "", rows, nan, nan, nan, H, float(OPS_PER_ELEMENT[OpClass.SOFTMAX] * numel)
    if base in LAYERNORM:
        H = int(out.shape[-1]) if out.dim() else 1
        return OpClass.LAYERNORM, "", numel // max(H, 1), nan, nan, nan, H, float(OPS_PER_ELEMENT[OpClass.LAYERNORM] * numel)
    if base in BATCHNORM or base in BATCHNORM_INFERENCE:
        # the forward ops take (input, weight, bias, running_mean, running_var, training, ...): eval() runs
        # them with training=False, i.e. with the running statistics
        inference = base in BATCHNORM_INFERENCE or (not base.endswith("backward") and len(args) > 5
                                                    and isinstance(args[5], bool) and not args[5])
        per = 2 if inference else OPS_PER_ELEMENT[OpClass.LAYERNORM]
        return OpClass.VEC, "mul", rows, nan, nan, nan, H, float(per * numel)
    if base in REDUCTION:
        src = ins[0] if ins else out
        n_in = src.numel()
        n_out = max(numel, 1)
        return OpClass.VEC, "add", n_out, nan, nan, nan, n_in // n_out, float(n_in)
    if base in BINARY and BINARY[base] is not None:
        op = BINARY[base]
        tensor_args = [a for a in args[:2] if isinstance(a, torch.Tensor) and a.dim() > 0]
        scalar = len(tensor_args) < 2 and any(_is_scalar_arg(a) for a in args[:2])
        return OpClass.VEC, op + ("u" if scalar else ""), rows, nan, nan, nan, H, float(numel)
    if base in UNARY:
        return OpClass.VEC, UNARY[base], rows, nan, nan, nan, H, float(numel)
    if base in MEM:
        return OpClass.MEM, "", rows, nan, nan, nan, H, 0.0
    return OpClass.UNCLASSIFIED, "", rows, nan, nan, nan, H, 0.0


def grouped_gemm(args) -> tuple[int, int, int, int, float, dict]:
    """(B, M, N, K, FLOPs, {argument index: share of it read}) of one grouped GEMM (``torch._grouped_mm(a, b,
    offs)``) in the GEMM convention [M x N] @ [N x K], N the reduction.

    ``offs`` cuts one operand's token dim into G groups (experts), in sizes the routing decides at run time, which a
    trace on meta tensors does not know. Taken as balanced routing: the S routed tokens spread evenly over
    min(G, S) experts (a decode step of one token reaches top-k experts, not all of them), and only those experts'
    weights are read. The FLOPs, 2 S x (the other two dims), do not depend on the routing. The shape follows the
    output's tiles: where the groups' rows stack into one output (S, n), one GEMM of the S stacked rows (B = 1: each
    output tile multiplies by its group's weight); where each group has an output of its own, a batch of them.
    (The stacked form was chosen over a batch of min(G, S) groups of ceil(S / B) rows on the training GPUs' measured
    MoE layers, 19.8 against 26.9 % MAPE: docs/recipes.md, "Mixture of experts".) Cases, S the cut dim:
    2-D (S, k) x 3-D (G, k, n): 1, S, k, n             (the forward's projections, and backward's input gradient)
    2-D (m, S) x 2-D (S, n):    B, m, ceil(S / B), n  (backward's weight gradient: G outputs, the reduction cut)
    3-D (G, m, k) x 2-D (k, S): B, m, k, ceil(S / B)
    3-D x 3-D, no offs:         G, m, k, n            (a plain batched GEMM)"""
    a, b = args[0], args[1]
    offs = args[2] if len(args) > 2 and isinstance(args[2], torch.Tensor) else None
    if a.dim() == 3 and b.dim() == 3:
        G, m, k = (int(x) for x in a.shape)
        n = int(b.shape[2])
        return G, m, k, n, 2.0 * G * m * k * n, {}
    G = int(offs.shape[0]) if offs is not None else int((a if a.dim() == 3 else b).shape[0])
    if a.dim() == 2 and b.dim() == 3:
        S, k, n = int(a.shape[0]), int(a.shape[1]), int(b.shape[2])
        return 1, S, k, n, 2.0 * S * k * n, {1: max(1, min(G, S)) / G}
    if a.dim() == 2 and b.dim() == 2:
        m, S, n = int(a.shape[0]), int(a.shape[1]), int(b.shape[1])
        B = max(1, min(G, S))
        return B, m, -(-S // B), n, 2.0 * m * S * n, {}
    m, k, S = int(a.shape[1]), int(a.shape[2]), int(b.shape[1])        # 3-D x 2-D
    B = max(1, min(G, S))
    return B, m, k, -(-S // B), 2.0 * m * k * S, {0: B / G}


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
        rows = [("fwd", OpClass.CONV, B, M, N, K, nan, 2.0 * M * N * K, [x, w], [out], params)]
        if isinstance(bias, torch.Tensor):
            rows.append(("add", OpClass.VEC, B * cout * o, nan, nan, nan, o, float(out.numel()), [out, bias], [out],
                         NO_CONV))
        return rows
    gx, gw, gb = out
    rows = []
    if mask[0] and isinstance(gx, torch.Tensor):
        M, N, K = B * size * size, red_out, cin
        rows.append(("dgrad", OpClass.CONV, B, M, N, K, nan, 2.0 * M * N * K, [gy, w], [gx], params))
    if mask[1] and isinstance(gw, torch.Tensor):
        M, N, K = cout, B * o * o, red_in
        rows.append(("wgrad", OpClass.CONV, B, M, N, K, nan, 2.0 * M * N * K, [gy, x], [gw], params))
    if len(mask) > 2 and mask[2] and isinstance(gb, torch.Tensor):
        rows.append(("add", OpClass.VEC, cout, nan, nan, nan, B * o * o, float(gy.numel()), [gy], [gb], NO_CONV))
    return rows


# ATen's element-wise ops and copies run on one of several CUDA kernels (``gpu_kernel_impl``), and how fast depends
# on which: BF16 kernels timed alone on an H100 and an H200 (docs/tier2/2026-11-28-*-paths) ran at the memory law's
# rate when every operand was dense and laid out alike (vectorised), and at about one element per SM per cycle,
# whatever they moved, when one was broadcast or strided (the generic kernel), converted to a wider type (the
# unrolled kernel) or, for ``cat``, an input was a strided view (Llama's rotate_half). ``access`` names the path.
ACCESS_PATHS = ("strided", "upcast", "strided_cat")
_ELEMENTWISE_COPIES = {"_to_copy", "copy_", "copy", "clone", "contiguous"}


def _dense(t: torch.Tensor) -> bool:
    """Whether the tensor's elements fill its span without gaps or overlaps, in some order of its dims."""
    if t.is_contiguous():
        return True
    dims = sorted((st, s) for s, st in zip(t.shape, t.stride()) if s != 1)
    want = 1
    for st, s in dims:
        if st != want:
            return False
        want *= s
    return True


def access(base: str, op_class, ins: list, outs: list) -> str:
    """The kernel path of an element-wise, copy or ``cat`` op (``ACCESS_PATHS``; "" = vectorised, or not such an
    op): ``strided_cat`` for a ``cat`` with a non-contiguous input; ``strided`` when an operand is broadcast to the
    output's shape or the operands are not all dense with the same strides (ATen then computes each element's
    offsets); ``upcast`` when they are but an input has a narrower type than the output."""
    if not outs or op_class not in (OpClass.VEC, OpClass.MEM):
        return ""
    if base == "cat":
        return "strided_cat" if any(t.dim() > 0 and not t.is_contiguous() for t in ins) else ""
    if not (base in BINARY or base in UNARY or base in _ELEMENTWISE_COPIES):
        return ""
    out = outs[0]
    ops = [t for t in ins if t.dim() > 0] + [out]
    if any(tuple(t.shape) != tuple(out.shape) for t in ops):
        return "strided"
    if not all(t.is_contiguous() for t in ops) and not (all(_dense(t) for t in ops)
                                                         and len({tuple(t.stride()) for t in ops}) == 1):
        return "strided"
    if any(t.element_size() < out.element_size() for t in ops):
        return "upcast"
    return ""
