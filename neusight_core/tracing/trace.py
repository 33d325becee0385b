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
import functools
import json
import math
import time
import weakref
from collections import Counter

import numpy as np
import pandas as pd
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from neusight_core.question.schema import Attention, Grads, KERNEL_COLUMNS, KVCache, Mode, OpClass, Precision
from neusight_core.question.step import Step

# Extra columns after KERNEL_COLUMNS: `reads` / `writes` = tuples of (buffer key, bytes) per kernel, the
# data dependencies fusion.fuse needs (a key names one tensor buffer within one trace), and
# `precision` (fp32 | tf32 | fp16 | bf16): the arithmetic the kernel runs in, which picks the GEMM peak.
# Then schema.CONV_COLUMNS: the parameters of a 2-D convolution, NaN on every other row.

_DTYPE_PRECISION = {p.torch_dtype: p.value for p in Precision if p is p.activations and p is not Precision.TF32}


# configs by name or path live in configs.py (no torch: a trace-cache hit reads them); re-exported
from neusight_core.data import configs  # noqa: E402
from neusight_core.tracing import fused_attention, gc_pause, table_info, shape_memo
from neusight_core.question import schema
from neusight_core.data.configs import OUR_CONFIGS_DIR, TraceError, available_configs, load_config  # noqa: E402,F401
from neusight_core.tracing.aten_ops import (CONV, GROUPED_OPS, NO_CONV, tensor_nbytes, op_name, access, call_tensors,  # noqa: E402
                                   classify, conv_rows, dtype_name, grouped_gemm, layer_of, tensors_in)
# the model on the meta device; hidden_size / num_layers / load_config are re-exported (callers read them here)
from neusight_core.tracing.meta_device_model import (TORCH_DTYPES, build_model, cache_tensors, filled_cache,  # noqa: E402,F401
                                      hidden_size, model_inputs, num_layers, switch_routing_stand_in)
from neusight_core.data.configs import max_positions  # noqa: E402

_NO_ATTN = (math.nan,) * len(schema.ATTN_COLUMNS)   # the fused-attention geometry of other rows

# --------------------------------------------------------------------------------------------
# capture
# --------------------------------------------------------------------------------------------
class _Recorder(TorchDispatchMode):
    """Records one row per kernel and the memory timeline of the buffers the ops allocate.

    Buffers are storages (views share their base's). Each gets a serial number when first seen; a
    weak reference to the storage notes when Python frees it, exactly as eager PyTorch would
    free the GPU memory (meta storages hold no memory, but their lifetimes are the real ones: saved
    tensors live until backward consumes them, temporaries die when the last reference goes). A
    storage an op returns that none of its inputs has is a new allocation. ``mem_events`` lists
    (row, buffer, +bytes | -bytes) in program order, ``row`` = index of the kernel row the event
    precedes or belongs to (allocations of no-kernel ops such as ``empty`` go with the next row).
    """

    def __init__(self, params_by_id: dict[int, str], access_paths: bool = True):
        super().__init__()
        self.access_paths = access_paths        # False: each row's ``access`` is "" (an FP32 table drops the column)
        self.rows: list[tuple] = []
        self._serial: dict[int, int] = {}      # storage _cdata -> serial number while it lives
        self._refs: dict[int, weakref.ref] = {}  # serial -> weak reference to its storage, until it is freed
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
        self.memo = shape_memo.MetaMemo()          # an op seen before on the same shapes is not run again

    # ------------------------------------------------------------ buffers and memory
    def _key(self, t: torch.Tensor) -> int:
        """Serial number of the tensor's storage, unique within the trace (never reused)."""
        st = t.untyped_storage()
        cd = st._cdata
        k = self._serial.get(cd)
        if k is None:
            k = self._serial[cd] = self._next_serial
            self._next_serial += 1
            # (not weakref.finalize, whose registry kept every recorder alive as long as the model's parameters)
            self._refs[k] = weakref.ref(st, functools.partial(self._freed, cd, k))
        return k

    def _freed(self, cdata: int, key: int, _ref=None) -> None:
        self._refs.pop(key, None)
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

    def _note_allocations(self, outs, ins) -> dict:
        """Count the outputs' new storages as allocated; returns {id(tensor): buffer key} of ``ins`` and ``outs``."""
        keys, in_keys = {}, set()
        for t in ins:
            k = keys[id(t)] = self._key(t)
            in_keys.add(k)
        for t in outs:
            k = keys[id(t)] = self._key(t)
            if k in in_keys or k in self._alloc:
                continue
            b = int(t.untyped_storage().nbytes())
            self._alloc[k] = b
            self.mem_events.append((len(self.rows), k, b))
        return keys

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps the mode's dispatch in torch._disable_dynamo unless False: 4 % of a trace, which compiles nothing
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        base, full = op_name(func)
        if base in ("_local_scalar_dense", "is_nonzero"):
            # .item() on a meta tensor has no value. transformers 5 calls it once, in mask
            # pre-processing: `(packed_sequence_mask[:, -1] == 0).all()` in
            # find_packed_sequence_indices, which is True for real unpadded, unpacked input
            # (position ids 0..s-1 in every row). Answering True for booleans takes that real
            # path; numbers get 0. Every answer is counted in the TableInfo's scalar_queries.
            t = args[0]
            self.scalar_queries[dtype_name(t.dtype)] += 1
            if t.dtype == torch.bool:
                return True
            return 0.0 if t.dtype.is_floating_point else 0
        if base in GROUPED_OPS and any(t.dtype != torch.bfloat16 for t in args[:2]):
            raise TraceError("this model's mixture-of-experts layers run their experts as grouped GEMMs "
                             "(torch._grouped_mm), which this torch takes in bf16 only: use --dtype bf16")
        out = self.memo.run(func, args, kwargs)
        outs = [out] if isinstance(out, torch.Tensor) else tensors_in(out)
        ins = call_tensors(args, kwargs)
        keys = self._note_allocations(outs, ins)
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
        if op_class == OpClass.UNCLASSIFIED:
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
        # an embedding reads the rows it gathers, not its table: in BF16 / FP16 tables (a decode step's lookup of one
        # token read a 0.3-1 GB table in them); the paper's FP32 tables keep the whole table, as Tier 1 was validated
        gathered = ({id(args[0]): tensor_nbytes(outs[0])} if base == "embedding" and outs[0].element_size() == 2 else None)
        if base in GROUPED_OPS:          # only the experts the routing reaches are read (aten_ops.grouped_gemm)
            gathered = {id(args[i]): int(round(share * tensor_nbytes(args[i]))) for i, share in grouped_gemm(args)[5].items()}
        self._append(phase, module, full, op_class, sub_op, (Bd, M, N, K, H), flops, read_t, outs,
                     NO_CONV + _NO_ATTN, access(base, op_class, ins, outs) if self.access_paths else "", gathered, keys)
        return out

    def _append(self, phase, module, full, op_class, sub_op, dims, flops, read_t, write_t, extra,
                path: str = "", read_bytes: dict | None = None, keys: dict | None = None) -> None:
        """One kernel row; its dtype is that of its first output; ``path``: ``aten_ops.access``; ``read_bytes``:
        {id(tensor): bytes read of it} where that is not the whole tensor; ``keys``: {id(tensor): buffer key} known
        already (``_note_allocations``), the rest are asked of ``_key``."""
        keys, read_bytes = keys or {}, read_bytes or {}
        key = lambda t: keys[id(t)] if id(t) in keys else self._key(t)  # noqa: E731
        reads = tuple((key(t), read_bytes[id(t)] if id(t) in read_bytes else tensor_nbytes(t)) for t in read_t)
        writes = tuple((key(t), tensor_nbytes(t)) for t in write_t)
        self.rows.append((phase, full, op_class, sub_op, *dims, flops,
                          sum(b for _, b in reads), sum(b for _, b in writes),
                          dtype_name(write_t[0].dtype), module, layer_of(module),
                          reads, writes) + extra + (path,))

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
        """One fused-attention row (``attention="sdpa"``; geometry and FLOPs: ``fused_attention.geometry``)."""
        b, flops, cols = fused_attention.geometry(sub_op, q, k, causal)
        phase, module = self._where()
        nan = math.nan
        self._append(phase, module, "aten._scaled_dot_product_flash_attention.default", OpClass.ATTN, sub_op,
                     (b, nan, nan, nan, nan), flops, read_t, write_t, NO_CONV + cols)


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
        todo = [t.grad_fn for t in tensors_in(out) if t.grad_fn is not None]
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


_MODELS: dict | None = None     # while ``reusing_models`` is active: the models built so far, by what built them


@contextlib.contextmanager
def reusing_models(memo: dict | None):
    """Within: ``trace_model`` builds each model (config, head, dtype, attention) once into ``memo`` and reuses it
    (None: every trace builds its own, as outside).

    A derivation family traces one reduced model at six or more (batch, seq) points (``table_families.Family``); building it
    once cut its inference samples' time by 10-15 % (timed directly, GPT-2 Large, OPT-1.3B, Switch); training
    samples, where the backward dominates, hardly move. A reused model keeps no state from one trace to
    the next that changes its kernels: its gradients are cleared after each trace, inputs and any KV cache are new;
    and a family's check point traces a model built afresh (one more unit of layers), so a model that did keep
    such state would fail the check and fall back to real traces."""
    global _MODELS
    outer, _MODELS = _MODELS, memo
    try:
        yield
    finally:
        _MODELS = outer


def trace_model(step: Step, authors_heads: bool = True) -> pd.DataFrame:
    """Kernel table of one step (a ``question.step.Step``): one forward pass (``inf``) or forward + loss + backward
    (``train``) of ``step.model`` (a config name, a path, a config object or dict) at ``step.batch`` and
    ``step.size`` (the sequence length, or an image model's side), with its ``past``, ``dtype`` and ``attention``;
    fusion and a parallel plan are applied to the table afterwards (``plans/``).

    ``step.grads``: ``accumulate`` (the default) = in training, parameters already hold a gradient (as in the
    authors' measured loop, whose labels carry an accumulation latency), so autograd adds each new gradient into it:
    one ``acc`` kernel per parameter; ``fresh`` = gradients start as None (``zero_grad(set_to_none=True)``), and no
    accumulation kernels appear.

    ``authors_heads``: use the task heads the authors traced (see ``AUTHORS_HEADS``) instead of
    the config's ``architectures``.

    ``past`` (extension, inference of decoder-only models): a KV cache already holding ``past``
    tokens, so ``seq`` new tokens attend to ``past + seq`` keys; ``seq=1`` is one decode step.
    The cache is filled before recording (it exists before the step); the step's own cache
    append (a ``cat`` per layer, as HF's eager decode runs it) is recorded.

    Image models (``configs.is_image_model``: ResNet, ViT) take ``pixel_values`` of shape
    (batch, channels, seq, seq): ``seq`` is the image side in pixels (``TableInfo.image_size``; 0 for text
    models). A ViT is built for that side (``image_size`` set in its config, so its position embeddings
    have one entry per patch, as when fine-tuning at a new resolution). No KV cache for them.

    ``dtype`` (fp32 | tf32 | fp16 | bf16 | fp8): the precision the model runs in (fp8: a bf16 trace whose
    linear layers' GEMMs are fp8, ``fp8_linear_rows``). fp32 is the paper's
    (FP32 tensors, TF32 off); fp16/bf16 build the model in that dtype, so every tensor's bytes follow
    it (ops the model code runs in FP32, e.g. softmax or RMSNorm upcasts, stay FP32); tf32 keeps FP32
    tensors and marks FP32 GEMMs ``precision == "tf32"`` (tensor cores). The ``precision`` column
    holds each kernel's arithmetic; predictors take the GEMM peak from it. Precisions other than
    fp32 are an extension: the predictors were trained and validated on FP32 kernels.

    ``attention`` (eager | sdpa): eager is the paper's (Q K^T, softmax and P V as separate kernels, the
    S x S scores in memory); sdpa builds the model with fused attention, as Hugging Face does by default, and each
    attention call is one ATTN row (``sub_op`` prefill when more than one query token, decode for one, backward
    for its gradient) with the ``schema.ATTN_COLUMNS`` geometry; no S x S tensor is allocated.

    Memory (``TableInfo.memory``, see :class:`_Recorder`): ``activation_peak_bytes`` = the peak of
    the bytes of buffers allocated while running (activations, saved tensors, temporaries, new
    gradients), over the whole forward (+ backward); ``kv_cache_bytes`` = the KV cache the step
    starts from (``past`` > 0; its growth during the step is part of the activations);
    ``events`` = the timeline (arrays ``row``, ``buf``, ``bytes``) that ``memory.py`` rescales for
    parallel plans. Weights, existing gradients and optimizer state are not in it (``memory.py``).

    What the rows do not say is the table's ``table_info.TableInfo`` (``table_info.info(frame)``): the
    config, the step, the parameters, ``memory``, the ops left ``unclassified`` (aten op -> count), ``skipped``
    (no-kernel ops) and ``trace_s``.
    """
    config_or_name, batch, seq, mode = step.model, step.batch, step.size, step.mode
    past, dtype, attention = step.past, step.dtype, step.attention
    accumulate_grads = step.grads != Grads.FRESH
    for nm, v in (("batch", batch), ("seq", seq)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
            raise TraceError(f"{nm} must be a positive integer, got {v!r}")
    if mode not in schema.MODES:
        raise TraceError(f"mode must be 'inf' or 'train', got {mode!r}")
    if isinstance(past, bool) or not isinstance(past, (int, np.integer)) or past < 0:
        raise TraceError(f"past must be a non-negative integer, got {past!r}")
    if past and mode != Mode.INF:
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
    elif why := configs.unsupported_image_model(cfg):
        raise TraceError(why)
    maxpos = max_positions(cfg)
    if maxpos is not None and seq + past > maxpos:
        raise TraceError(f"seq {seq + past} exceeds the model's {maxpos} positions ({cfg.model_type})")
    train = mode == Mode.TRAIN
    head = mode if authors_heads else None
    key = None if _MODELS is None else (cfg.name_or_path, json.dumps(cfg.to_dict(), sort_keys=True, default=str),
                                         head, dtype, attention)
    if key is not None and key in _MODELS:
        model, cfg = _MODELS[key]          # the config as building the model left it (use_cache, dtype set)
    else:
        model = build_model(cfg, head, dtype, attention)
        if key is not None:
            _MODELS[key] = (model, cfg)
    model.train(train)  # dropout kernels only in training (eval() makes dropout an identity)
    switch_routing_stand_in(model)
    params = dict(model.named_parameters())
    if train and accumulate_grads:
        for p in params.values():
            p.grad = torch.empty_like(p)
    rec = _Recorder({id(p): n for n, p in params.items()}, access_paths=dtype in schema.HALF_ACTIVATIONS)
    kw = model_inputs(model, cfg, int(batch), int(seq), train, TORCH_DTYPES[dtype])
    kv_bytes, kv_bufs, cached = 0, (), []
    if past:        # before the module hooks: filling the cache runs the model once, which is not the step
        cache = filled_cache(cfg, int(batch), int(past), TORCH_DTYPES[dtype], model)
        kv_bytes, kv_bufs = rec.track(cache_tensors(cache))
        cached = [t.numel() * t.element_size() for t in cache_tensors(cache)]
        kw.update(past_key_values=cache, use_cache=True)
        del cache
    handles = _install_module_hooks(model, rec.module_stack)
    fused = (fused_attention.FusedAttention(rec, type(model).__name__.endswith("ForCausalLM") or bool(getattr(cfg, "is_decoder", 0))
                             or cfg.model_type in ("gpt2", "opt", "llama", "qwen2"))
             if attention == Attention.SDPA else contextlib.nullcontext())
    try:
        with torch.autograd.set_grad_enabled(train), fused, gc_pause.paused(collect_young=True):
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
        for p in params.values():     # a reused model starts the next step as a new one did: no gradients
            p.grad = None
    kw.clear()
    out = loss = None  # noqa: F841 - the step's outputs die here, as in a serving/training loop
    rec.closed = True
    memory = _memory_summary(rec, kv_bytes, kv_bufs)
    rec._refs.clear()         # its weak references' callbacks hold the recorder: freed now, not by the collector
    if rec.unclassified:
        import warnings

        warnings.warn(f"{sum(rec.unclassified.values())} kernels of aten ops without an op class kept as "
                      f"UNCLASSIFIED (memory-bound): {dict(rec.unclassified)}", stacklevel=2)
    df = pd.DataFrame.from_records(rec.rows, columns=KERNEL_COLUMNS[:15] + ["reads", "writes"] + list(schema.CONV_COLUMNS + schema.ATTN_COLUMNS) + ["access"])
    attn = df[list(schema.ATTN_COLUMNS)].astype(float) if (df["op_class"] == OpClass.ATTN).any() else None
    df["count"] = 1
    df["comm_kind"] = ""
    df["comm_bytes"] = 0.0
    df["overlap"] = False
    df["stage"] = 0
    conv, paths = df[list(schema.CONV_COLUMNS)].astype(float), df["access"]
    df = df[KERNEL_COLUMNS + ["reads", "writes"]]
    for c in ("B", "M", "N", "K", "H", "flops", "bytes_read", "bytes_written"):
        df[c] = df[c].astype(float)
    df["precision"] = df["dtype"].map(_DTYPE_PRECISION).fillna(Precision.FP32)
    if dtype == Precision.TF32:   # cuDNN convolutions use TF32 tensor cores when allowed, as cuBLAS GEMMs do
        df.loc[df["op_class"].isin(schema.IGEMM_CLASSES) & (df["precision"] == Precision.FP32), "precision"] = Precision.TF32
    if dtype == Precision.FP8:
        fp8_linear_rows(df)
    df[list(schema.CONV_COLUMNS)] = conv
    if attn is not None:      # only tables with fused attention carry its columns (eager tables are unchanged)
        df[list(schema.ATTN_COLUMNS)] = attn
    if rec.access_paths:   # ATen's kernel path, which the memory law reads (FP32 tables are unchanged)
        df["access"] = paths
    if step.kv_cache == KVCache.PAGED and past:
        paged_cache_writes(df, cached, int(past), int(seq))
    return table_info.attach(df, table_info.TableInfo(
        config=dict(cfg.to_dict(), name=cfg.name_or_path), model=cfg.name_or_path or cfg.model_type,
        model_class=type(model).__name__, batch=int(batch), seq=int(seq), past=int(past), mode=mode, dtype=dtype,
        attention=attention, image_size=int(seq) if image else 0, hidden=hidden_size(cfg),
        vocab=int(getattr(cfg, "vocab_size", 0) or 0), num_layers=num_layers(cfg),
        params={n: int(p.numel()) for n, p in params.items()}, memory=memory, unclassified=dict(rec.unclassified),
        skipped=dict(rec.skipped), scalar_queries=dict(rec.scalar_queries), trace_s=time.perf_counter() - t0))


def paged_cache_writes(df: pd.DataFrame, cached: list, past: int, seq: int) -> int:
    """A decode step on a paged KV cache (``KVCache.PAGED``), in place: each ``cat`` that appends the step's keys or
    values to a cache tensor (Hugging Face's DynamicCache: the cache is copied with the new tokens into a new tensor)
    becomes the write of the new tokens alone, as a serving engine's cache-write kernel does (vLLM's
    ``reshape_and_cache``): bytes read = bytes written = the tensor's bytes x seq / (past + seq). An append is told by
    its size: a ``cat`` whose output is, to the byte, a cache tensor grown from ``past`` to ``past + seq`` tokens
    (``cached``: the cache tensors' bytes at ``past`` tokens). Returns how many rows it rewrote."""
    grown = {b * (past + seq) // past for b in cached if b * (past + seq) % past == 0}
    rows = ((df["aten_op"] == "aten.cat.default") & df["bytes_written"].isin(grown)
            & (df["bytes_read"] == df["bytes_written"])).to_numpy()
    new = df.loc[rows, "bytes_written"] * seq / (past + seq)
    df.loc[rows, ["bytes_read", "bytes_written"]] = np.c_[new, new]
    # the buffers too (fusion reads them): the new tokens' tensor is read, the cache is not; what is written is theirs
    for i, n in zip(df.index[rows], new):
        df.at[i, "reads"] = tuple((b, x) for b, x in df.at[i, "reads"] if x <= n)
        df.at[i, "writes"] = tuple((b, n) for b, _ in df.at[i, "writes"])
    df.loc[rows, "aten_op"] = PAGED_WRITE
    if "access" in df.columns:
        df.loc[rows, "access"] = ""      # a contiguous write of the new tokens, not a cat of a strided view
    return int(rows.sum())


#: the ``aten_op`` of a paged cache's write (``paged_cache_writes``), in the tracer's "namespace.op.overload" form (fusion
#: names fused kernels by the middle part); no aten op of a Hugging Face model runs it
PAGED_WRITE = "kv.paged_write.default"


def fp8_linear_rows(df: pd.DataFrame) -> None:
    """An FP8 step (traced as BF16) in place: its transformer layers' linear GEMMs (LINEAR rows in bf16 of a layer,
    ``layer`` >= 0) become fp8 W8A8 GEMMs,
    both operands read at one byte per element (half the BF16 bytes read; a bias, if any, is counted at one byte
    too, a rounding), the output still BF16 (``dtype`` column and bytes written unchanged), as vLLM's FP8 linear
    layers run them. Attention (BMM / ATTN), the memory-bound kernels and the head's logits stay BF16. The
    activation's quantisation to FP8 before each GEMM (a small memory-bound kernel, often fused into the norm
    before it) is not added: a known under-count."""
    # the head (layer -1) stays BF16: FP8 checkpoints leave lm_head unquantised (vLLM and llm-compressor ignore it)
    rows = ((df["op_class"] == OpClass.LINEAR) & (df["precision"] == Precision.BF16) & (df["layer"] >= 0)).to_numpy()
    df.loc[rows, "precision"] = Precision.FP8
    df.loc[rows, "bytes_read"] = df.loc[rows, "bytes_read"].to_numpy(float) / Precision.BF16.bytes


def _memory_summary(rec: _Recorder, kv_bytes: int, kv_bufs: tuple) -> dict:
    tl = schema.MemoryTimeline(rec.mem_events)
    return {"activation_peak_bytes": max(tl.peak(), kv_bytes) - kv_bytes, "kv_cache_bytes": float(kv_bytes),
            "kv_bufs": kv_bufs, "rows": len(rec.rows), "events": tl}


def attention_mask_ops(kernels: pd.DataFrame) -> np.ndarray:
    """Rows that apply an attention mask: a forward binary element-wise add inside a transformer layer whose
    shape is that layer's attention scores (the rows x length of a softmax of the same layer), i.e. the mask
    added to the scores (for Switch / T5 the mask and the position bias in one add). The model-level ops that
    build the mask once from the input are not counted: they touch batch x seq elements, not the scores."""
    k = kernels
    soft = k[(k["op_class"] == OpClass.SOFTMAX) & (k["phase"] == "fw")]
    scores = set(zip(soft["layer"], soft["B"], soft["H"]))
    cand = ((k["op_class"] == OpClass.VEC) & (k["sub_op"] == "add") & (k["phase"] == "fw") & (k["layer"] >= 0)).to_numpy()
    return cand & np.fromiter((key in scores for key in zip(k["layer"], k["B"], k["H"])), bool, len(k))


def summarize(kernels: pd.DataFrame, by=("phase", "op_class")) -> pd.DataFrame:
    """Kernel count, FLOPs and bytes per group (``count`` weights each row)."""
    k = kernels.assign(n=kernels["count"], f=kernels["flops"] * kernels["count"],
                       b=(kernels["bytes_read"] + kernels["bytes_written"]) * kernels["count"])
    return (k.groupby(list(by), observed=True)[["n", "f", "b"]].sum()
            .rename(columns={"n": "kernels", "f": "flops", "b": "bytes"}).reset_index())
