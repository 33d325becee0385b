"""Fused attention in a trace (``attention="sdpa"``): every ``F.scaled_dot_product_attention`` call
becomes one kernel row, as FlashAttention-style kernels (cuDNN's, FlashAttention's) run it on a GPU. On meta
tensors PyTorch would otherwise run its math fallback (Q K^T, softmax, P V as separate ops), which is eager
attention again."""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from neusight_core.question.schema import ATTN_BACKWARD_FLOPS


def geometry(sub_op: str, q, k, causal: bool) -> tuple[int, float, tuple]:
    """(batch, FLOPs, ``schema.ATTN_COLUMNS`` values) of one fused-attention kernel: q (batch, heads, seq_q, d),
    k (batch, kv_heads, seq_kv, d). FLOPs as ``measured_kernels.attention_kernels`` counts them (4 b h d x the
    (query, key) pairs, causal or full), times ``ATTN_BACKWARD_FLOPS`` for the backward."""
    b, h, sq, d = (int(x) for x in q.shape)
    hkv, skv = int(k.shape[1]), int(k.shape[2])
    pairs = (skv * (skv + 1) / 2 - (skv - sq) * (skv - sq + 1) / 2) if causal else float(sq * skv)
    flops = 4.0 * b * h * d * pairs * (ATTN_BACKWARD_FLOPS if sub_op == "backward" else 1.0)
    return b, flops, (sq, skv, h, hkv, d)


class FusedAttentionFn(torch.autograd.Function):
    """A fused attention kernel on meta tensors: the output (and the softmax statistics a FlashAttention forward
    keeps for its backward, FP32 per query and head) are allocated as a GPU would, one ATTN row is recorded per
    forward and one per backward, and no S x S score matrix ever exists. The output is laid out token-major
    (batch, tokens, heads, d) behind its (batch, heads, tokens, d) shape, as cuDNN's and FlashAttention's kernels
    write it: Hugging Face's ``transpose(1, 2).contiguous()`` after the call then copies nothing (the recorded
    Llama-2-7B prefill on the lent H100 ran no such copy, docs/tier2.md)."""

    @staticmethod
    def forward(ctx, q, k, v, rec, causal, packed=False):
        b, h, s = q.shape[:-1]
        o = q.new_empty((b, s, h, v.shape[-1])).transpose(1, 2)
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        # a packed one-token query (below) is one decode kernel over all query heads, as it was before the packing
        qg = q.reshape(b, h * s, 1, q.shape[-1]) if packed else q
        rec.add_attention("prefill" if qg.shape[2] > 1 else "decode", qg, k, v, [q, k, v], [o, lse], causal)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.rec, ctx.causal = rec, causal
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        ctx.rec.add_attention("backward", q, k, v, [q, k, v, o, do, lse], [dq, dk, dv], ctx.causal)
        return dq, dk, dv, None, None, None


class FusedAttention(TorchFunctionMode):
    """Every ``F.scaled_dot_product_attention`` call as one ``FusedAttentionFn`` recorded into ``rec`` (the
    tracer's recorder). Causal: the call says so (``is_causal``)."""

    def __init__(self, rec, causal_lm: bool):
        super().__init__()
        self.rec, self.causal_lm = rec, causal_lm

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not torch.nn.functional.scaled_dot_product_attention:
            return func(*args, **kwargs)
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
        a = dict(zip(names, args), **kwargs)
        q, k, v = a["query"], a["key"], a["value"]
        mask = a.get("attn_mask")
        # Causal (half the pairs) only when the call says so: with a mask (a prefill after cached tokens, a prompt
        # longer than a sliding window) PyTorch cannot run FlashAttention and its memory-efficient kernel computes
        # every (query, key) pair, masked or not. (No model here passes a mask in its validated steps.)
        causal = bool(a.get("is_causal"))
        # Hugging Face's decode step with grouped-query heads and a mask (a full sliding window, Mistral's past 4,096
        # tokens) packs the one token's query heads of each KV head into the query axis (``pack_gqa``: q of
        # (batch, kv_heads, heads / kv_heads, d)) under a mask of one query row, which no multi-token query of a
        # causal LM has: its causal mask has a row per query. That is one token's decode, not a prefill of
        # heads / kv_heads tokens (which the prefill network answered at 29x the unpacked decode step's time).
        packed = bool(self.causal_lm and mask is not None and q.shape[2] > 1 and mask.dim() >= 2
                      and mask.shape[-2] == 1)
        return FusedAttentionFn.apply(q, k, v, self.rec, causal, packed)
