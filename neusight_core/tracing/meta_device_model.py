"""The model the tracer runs: a Hugging Face config built on the meta device (no weights, nothing downloaded), in
the task head the authors traced, with the attention asked for, its inputs and KV cache as meta tensors, and
the stand-in for Switch Transformers' data-dependent routing. ``trace.py`` runs it under its recorder."""
from __future__ import annotations

import torch

from neusight_core.data import configs
from neusight_core.data.configs import TraceError
from neusight_core.question.schema import Attention, Mode, Precision

# Precision of a trace (``trace_model(..., dtype=)``) -> storage dtype of the model's tensors.
# tf32 = FP32 tensors, GEMMs on TF32 tensor cores; fp32 = the paper's setting (TF32 off); fp8 = a BF16 model
# (transformers' eager code cannot run FP8 tensors; the tracer relabels its linear layers' GEMMs).
TORCH_DTYPES = {p.value: getattr(torch, p.activations.torch_dtype) for p in Precision}


# The release's BERT config names BertLMHeadModel, but the authors' op graphs (and so the measured
# labels) show a sequence classifier in inference (`bert_pooler_dense`, `classifier` with 2 labels)
# and the pre-training heads in training (`cls_predictions_decoder`, `cls_seq_relationship`).
AUTHORS_HEADS = {"BertLMHeadModel": {Mode.INF: "BertForSequenceClassification", Mode.TRAIN: "BertForPreTraining"}}


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


def model_inputs(model, cfg, batch: int, seq: int, train: bool, dtype=torch.float32) -> dict:
    if configs.is_image_model(cfg):
        # image models: a batch of square images, seq = their side; the classification head's
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


def filled_cache(cfg, batch: int, past: int, dtype=torch.float32, model=None):
    """A transformers DynamicCache holding ``past`` tokens of meta K/V for every layer.

    What a layer caches is the model's own choice (DeepSeek V2 / V3 cache the compressed latent, one "head" of
    ``kv_lora_rank`` keys and rope-part values): with ``model``, a one-token forward on meta tensors says each
    layer's cached shapes, which are then filled to ``past`` tokens; without it, or where that forward fails,
    (batch, KV heads, past, head dim) as most decoders cache."""
    from transformers import DynamicCache
    if getattr(cfg, "is_encoder_decoder", False) or cfg.model_type in ("bert",):
        raise TraceError(f"a KV cache needs a decoder-only model, not {cfg.model_type!r}")
    heads = getattr(cfg, "num_attention_heads", None) or getattr(cfg, "n_head", None)
    cache = DynamicCache(config=cfg)
    recurrent = [type(layer).__name__ for layer in getattr(cache, "layers", None) or [] if not hasattr(layer, "update")]
    if not heads or recurrent:
        # Mamba's and linear attention's recurrent state is no cache of past tokens' keys and values
        raise TraceError(f"a decode step of {cfg.model_type!r} is not modelled: its cache holds recurrent state "
                         f"({recurrent[0] if recurrent else 'no attention layers'}), not the keys and values of past tokens")
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or hidden_size(cfg) // heads
    shapes = [((batch, kv_heads, past, head_dim),) * 2] * num_layers(cfg)
    probed = _cached_shapes(model) if model is not None else None
    if probed:
        shapes = [tuple((batch, *mid, past, last) for mid, last in layer) for layer in probed]
    for i, (k_shape, v_shape) in enumerate(shapes):
        cache.update(torch.empty(k_shape, device="meta", dtype=dtype), torch.empty(v_shape, device="meta", dtype=dtype), i)
    for layer in getattr(cache, "layers", None) or []:
        # A sliding-window layer keeps the window's last tokens as a view of everything it was given; a decode loop's
        # cache holds them in their own storage (each step's append makes a new tensor), so the memory is the window's
        for name in ("keys", "values"):
            t = getattr(layer, name, None)
            if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() > t.numel() * t.element_size():
                setattr(layer, name, t.clone())
    return cache


def build_model(cfg, mode: str | None = None, dtype: str = Precision.FP32, attention: str = Attention.EAGER):
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
            if attention == Attention.EAGER:
                raise
            raise TraceError(f"{cfg.model_type} has no fused attention ({attention}) in transformers: use "
                             f"--attention eager ({str(e).splitlines()[0][:120]})") from None
    if getattr(model, "loss_type", "") is None:
        # transformers finds no loss in names like GPT2LMHeadModel and falls back to the causal-LM
        # loss with a warning on every process; say so explicitly (same loss, no warning).
        model.loss_type = "ForCausalLM"
    return model.float() if tdt == torch.float32 else model.to(tdt)


def _cached_shapes(model) -> list | None:
    """Per layer, ((middle dims, last dim) of K, of V) that ``model`` caches, from a one-token forward at batch 1 on
    meta tensors; once per model object (a sweep traces one model at many cache lengths). None where the forward
    fails (the caller's common shapes then; the trace itself says what fails)."""
    if "_kv_cache_shapes" not in model.__dict__:
        try:
            with torch.no_grad():
                probe = model(input_ids=torch.zeros((1, 1), dtype=torch.long, device="meta"), use_cache=True)
            model.__dict__["_kv_cache_shapes"] = [tuple((tuple(t.shape[1:-2]), int(t.shape[-1]))
                                                        for t in (layer.keys, layer.values))
                                                  for layer in probe.past_key_values.layers]
        except Exception:  # noqa: BLE001 - see the docstring
            model.__dict__["_kv_cache_shapes"] = None
    return model.__dict__["_kv_cache_shapes"]


def cache_tensors(cache) -> list:
    """The K/V tensors a transformers cache holds (DynamicCache of transformers 4.x or 5.x)."""
    out = []
    for layer in getattr(cache, "layers", None) or []:
        out += [t for t in (getattr(layer, "keys", None), getattr(layer, "values", None)) if isinstance(t, torch.Tensor)]
    if not out:
        for name in ("key_cache", "value_cache"):
            out += [t for t in getattr(cache, name, []) if isinstance(t, torch.Tensor)]
    return out


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
