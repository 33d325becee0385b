"""NeuSight for BF16 tensor-core kernels: GEMM and fused-attention networks trained on
NVIDIA's measured kernels of the training GPUs (``measured_kernels``: A100 SXM, H100 SXM, H200 SXM, L40S).

The paper's method (SPEC 3.1), at 2-byte elements and the dense BF16 tensor-core peak
(``Device.gemm_peak_gflops("bf16")``):

    latency = waves x tile FLOPs / (per-SM roofline throughput x u),   u = sig(g) (1 - sig(a) / waves)

computed as ``common.wave_roofline_ms / u`` (never faster than the roofline at the BF16 peak and the memory
bandwidth); u from an MLP per network on log2 per-SM inputs (``features.features``), z-scored. ``u_max``
(recipe; 1 = the paper's bound) scales u: the database times a kernel by repeated launches on the same
tensors, so operands that fit in L2 are not re-read from DRAM and some small GEMMs run faster than the DRAM
roofline (L40S, 96 MB L2: up to 2.7 times, a 16 x 51200 x 128 GEMM); u_max > 1 lets the model reach them.

Networks (``NETWORKS``): ``GEMM`` (op classes LINEAR and BMM: a BMM is B independent GEMMs, its tiles are
counted over B, so it goes through the same network; the training data holds LINEAR rows only, B = 1),
``ATTN_prefill`` and ``ATTN_decode`` (op class ATTN, ``sub_op`` prefill / decode).

Tiles and waves.

- GEMM (B, M, N, K; N the reduction): ``common.geometry`` at 2-byte elements for a tile tile_m x tile_k of
  the output. The measured database names no kernel, so the tile is not known: the recipe lists candidate
  tiles (``gemm_tiles``) and each kernel gets the one with the lowest per-SM roofline time
  waves x max(tile FLOPs / (peak / SM), tile bytes / (bandwidth / SM)) (large tiles reuse operands, small
  tiles fill more SMs: the trade-off a GEMM library's heuristic makes); one candidate = a fixed tile.
- Fused attention, in the spirit of FlashAttention (Dao et al. 2022/2023: a thread block owns a block of
  query rows of one (batch, head) and streams K and V through shared memory):
  prefill: one tile = ``block_q`` query rows of one (batch, query head):
  tiles = B x heads x ceil(seq_q / block_q); the tile reads its Q block and the K, V of the keys it sees
  (keys = seq_kv, or min(seq_kv, seq_q - 1 + window) with a sliding window) and writes its O block:
  tile bytes = 2 (2 q d) + kv_bytes x 2 x keys x d with q = min(block_q, seq_q);
  decode (one query token): one tile = the query heads of one (batch, KV head) (a GQA group shares its K/V
  read) over a slice of the keys (split-KV, FlashDecoding: with ``kv_split`` the keys are cut into
  s = max(1, min(floor(SMs x tiles_per_sm / (B x kv_heads)), ceil(keys / 256))) slices so that small batches
  fill (at most) one wave): tiles = B x kv_heads x s, tile bytes = kernel bytes / tiles;
  tile FLOPs = kernel FLOPs / tiles (``measured_kernels.attention_kernels``: 4 b h d pairs). Waves =
  ceil(tiles / (SMs x ``tiles_per_sm``)). A row without the attention columns (seq_q, seq_kv, heads,
  kv_heads, head_dim) is not handled here.

The tree baselines these networks are measured against (``ShapeTree``, shape-only and structural) are in
``trees.py``.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

import neusight_core.predictors.common as common
import neusight_core.predictors.memory_law as memory_law
from neusight_core.question import schema
from neusight_core.predictors.features import features, utilisation
from neusight_core.predictors.base import NumpyMLP, Timer, split_validation
from neusight_core.question.schema import OpClass, Precision

NETWORKS = ("GEMM", "ATTN_prefill", "ATTN_decode", "GEMM_fp8")
#: precisions whose GEMM / attention rows the networks answer (2-byte tensor-core precisions)
TRAINED_PRECISIONS = (Precision.BF16, Precision.FP16)
#: the GEMM networks: ``GEMM_fp8`` answers the fp8 GEMM rows (W8A8, per-tensor scales), trained on NVIDIA's measured
#: FP8 GEMMs of the training GPUs that have FP8 tensor cores (H100, H200, L40S), at the dense FP8 peak and one byte
#: per operand element; it shares GEMM's tiles and inputs, and GEMM's training settings where a {network: value}
#: setting of the recipe does not name it (``TensorCoreNets.value``)
GEMM_NETWORKS = ("GEMM", "GEMM_fp8")
TILE_INPUTS = ("tile_flops_per_sm_peak", "tile_bytes_per_sm_bw", "wave_bytes_per_sm_l2",
               "tile_intensity_per_ridge", "waves", "wave_bytes_per_sm_bw")

DEFAULTS = {"gemm_tiles": [[128, 128]], "splits": [1], "gemm_inputs": [], "u_max": 1.0, "block_q": 128, "tiles_per_sm": 1, "kv_split": True, "dims_input": False,
            "traced_scope": [], "members": 1, "hidden": 128, "layers": 4, "lr": 1.0e-3, "batch": 512, "epochs": 40, "loss": "ape",
            "rows_per_gpu": 8000, "val_fraction": 0.1, "quick_rows_per_gpu": 1000, "quick_epochs": 4,
            "networks": ["GEMM", "ATTN_prefill", "ATTN_decode"], "fp8_quantiser": "none"}

#: What a measured FP8 (W8A8, per-tensor) linear call runs before its GEMM: the quantisation of its BF16 activation
#: x[M, N] to FP8 (recipe key ``fp8_quantiser``), as kernels of (bytes read, bytes written) per activation element,
#: each timed by the memory law (``memory_law.time_ms``, fitted on NVIDIA's measured quantisation kernels of the
#: training GPUs). The database's FP8 GEMM latency includes it: its smallest FP8 call takes 4.5-4.6 us on H100 / H200
#: against 2.4-2.5 us in BF16, a fixed cost the GEMM itself does not have. ``static``: one kernel with a given scale
#: (reads 2 B, writes 1 B an element; vLLM's ``static_scaled_fp8_quant``); ``dynamic``: the scale computed first (a
#: max reduction reading the activation, then the quantiser: vLLM's ``dynamic_scaled_fp8_quant``); ``none``: the
#: network alone answers the whole call. A GEMM_fp8 row then takes quantiser + network time, and the network is
#: trained on the whole measured latency through that sum (``TensorCoreNets.fit``).
QUANTISERS = {"none": (), "static": ((2.0, 1.0),), "dynamic": ((2.0, 0.0), (2.0, 1.0))}


#: A fused attention's backward (``sub_op`` backward, traced with ``attention="sdpa"``), which NVIDIA's database
#: does not measure, is predicted as this many forwards of the same shape by the ATTN_prefill network: the FLOP
#: ratio of its kernels (``schema.ATTN_BACKWARD_FLOPS``, FlashAttention-2's).
ATTN_BACKWARD_FACTOR = schema.ATTN_BACKWARD_FLOPS


def attention_backward(kernels: pd.DataFrame) -> np.ndarray:
    """Per row: a fused attention's backward (predicted through its forward, ``ATTN_BACKWARD_FACTOR``)."""
    if "sub_op" not in kernels.columns:
        return np.zeros(len(kernels), bool)
    return (kernels["op_class"].to_numpy() == OpClass.ATTN) & (kernels["sub_op"].astype(str).to_numpy() == "backward")


def _backward_as_forward(kernels: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """``kernels`` with ATTN backward rows turned into the forward of their shape, and the factor per row."""
    bw = attention_backward(kernels)
    if not bw.any():
        return kernels, np.ones(len(kernels))
    k = kernels.copy()
    k.loc[bw, "sub_op"] = "prefill"
    k.loc[bw, "flops"] = k.loc[bw, "flops"] / ATTN_BACKWARD_FACTOR
    # the forward's traffic, as the tracer counts it: Q, K, V read; O and the FP32 softmax statistics written
    e = common.row_element_bytes(k)[bw]
    b, sq, skv, h, hkv, d = (k.loc[bw, c].to_numpy(float) for c in ("B",) + schema.ATTN_COLUMNS)
    k.loc[bw, "bytes_read"] = e * b * sq * h * d + 2 * e * b * skv * hkv * d
    k.loc[bw, "bytes_written"] = e * b * sq * h * d + 4.0 * b * h * sq
    return k, np.where(bw, ATTN_BACKWARD_FACTOR, 1.0)


#: the largest attention head the tracer records (Hugging Face's heads are 64-256 wide); the database's head dim 512
#: rows are latent-attention (MLA) decode kernels with the latent as the head, which no traced model runs
TRACED_MAX_HEAD_DIM = 256


def traced_scope(kernels: pd.DataFrame) -> np.ndarray:
    """Per row: a shape the tracer can emit (True for rows without attention columns). An attention row is out of
    scope with a sliding window (the tracer records none: torch's sdpa takes a window as a mask over every key, so
    the kernel sees the whole cache) or a head wider than ``TRACED_MAX_HEAD_DIM``. Recipe key ``traced_scope``: the
    networks it names train on such rows only (tried for the decode network and not adopted: docs/recipes.md,
    "Leaving them out"); the BF16 benchmarks also score these rows apart."""
    ok = np.ones(len(kernels), dtype=bool)
    if "window" in kernels.columns:
        ok &= ~(kernels["window"].fillna(0).to_numpy(float) > 0)
    if "head_dim" in kernels.columns:
        ok &= ~(kernels["head_dim"].to_numpy(float) > TRACED_MAX_HEAD_DIM)
    return ok


def training_rows(kernels: pd.DataFrame, net: str, config: dict, quick: bool, seed: int) -> pd.DataFrame:
    """The rows network ``net`` of ``config`` trains on (the networks and the tree baselines alike): its rows, in the
    tracer's scope where ``traced_scope`` names it, at most ``rows_per_gpu`` (``quick_rows_per_gpu``) per GPU."""
    df = kernels[network_of(kernels) == net]
    if net in config.get("traced_scope", []):
        df = df[traced_scope(df)]
    return subsample(df, int(setting(config, "quick_rows_per_gpu" if quick else "rows_per_gpu", net)), seed)


def setting(config: dict, key: str, net: str):
    """A config value of network ``net``: one for every network, or a {network: value} dict (GEMM_fp8 takes
    GEMM's where the dict does not name it)."""
    v = config[key]
    if not isinstance(v, dict):
        return v
    return v[net] if net in v or net not in GEMM_NETWORKS else v["GEMM"]


def network_of(kernels: pd.DataFrame) -> np.ndarray:
    """The network of each row ("" = none): GEMM for LINEAR / BMM rows in bf16 / fp16, GEMM_fp8 for those in fp8,
    ATTN_<kind> for ATTN rows in bf16 / fp16 with the attention columns."""
    n = len(kernels)
    out = np.full(n, "", dtype=object)
    if "precision" not in kernels.columns or n == 0:
        return out
    half = kernels["precision"].isin(TRAINED_PRECISIONS).to_numpy()
    cls = kernels["op_class"].to_numpy()
    gemm = np.isin(cls, schema.GEMM_CLASSES) & kernels[["B", "M", "N", "K"]].notna().all(axis=1).to_numpy()
    out[half & gemm] = "GEMM"
    out[gemm & (kernels["precision"] == Precision.FP8).to_numpy()] = "GEMM_fp8"
    if "sub_op" in kernels.columns and all(c in kernels.columns for c in schema.ATTN_COLUMNS):
        ok = half & (cls == OpClass.ATTN) & kernels[list(schema.ATTN_COLUMNS)].notna().all(axis=1).to_numpy()
        sub = kernels["sub_op"].astype(str).to_numpy()
        for kind in ("prefill", "decode"):
            out[ok & (sub == kind)] = f"ATTN_{kind}"
    return out


# ---------------------------------------------------------------- tiles and waves
def gemm_geometry(kernels: pd.DataFrame, dev: dict, tiles, splits=(1,), min_slice: int = 256) -> dict:
    """Tiles and waves of GEMM rows (B, M, N, K; N the reduction) with, per row, the candidate (tile, split)
    of lowest per-SM roofline time waves x max(tile FLOPs / (peak / SM), tile bytes / (bandwidth / SM));
    the choice itself in ``tile_m``, ``tile_k`` and ``split`` (the miss analysis groups errors by it).

    A tile tile_m x tile_k of the output over a slice N / s of the reduction (split-K, s in ``splits``, only
    while a slice keeps ``min_slice`` elements): tiles = B ceil(M / tile_m) ceil(K / tile_k) s, tile FLOPs =
    2 tile_m ceil(N / s) tile_k, tile bytes = e (tile_m n_s + n_s tile_k + tile_m tile_k) (e = 2 B at
    bf16 / fp16); s = 1 is ``common.geometry``. Without split-K a 16 x 51200 x 128 GEMM is one tile on one SM,
    and the wave roofline is 250 times the measured time on L40S: libraries split such reductions."""
    peak_sm = common.peak_gflops(kernels, dev) * 1e9 / dev["num_sm"]
    bw_sm = dev["mem_bw_gbs"] * 1e9 / dev["num_sm"]
    B = np.maximum(kernels["B"].fillna(1).to_numpy(float), 1.0)
    M, N, K = (np.maximum(kernels[c].fillna(1).to_numpy(float), 1.0) for c in ("M", "N", "K"))
    e = common.row_element_bytes(kernels)
    best, best_t = None, None
    for tm, tk in tiles:
        for s in splits:
            ns = np.ceil(N / s)
            ok = (s == 1) | (ns >= min_slice)
            n_tiles = B * np.ceil(M / tm) * np.ceil(K / tk) * s
            g = {"tiles": n_tiles, "waves": np.ceil(n_tiles / dev["num_sm"]), "tile_flops": 2.0 * tm * ns * tk,
                 "tile_bytes": e * (tm * ns + ns * tk + tm * tk), "tile_m": np.full(len(M), float(tm)),
                 "tile_k": np.full(len(M), float(tk)), "split": np.full(len(M), float(s))}
            t = np.where(ok, g["waves"] * np.maximum(g["tile_flops"] / peak_sm, g["tile_bytes"] / bw_sm), np.inf)
            if best is None:
                best, best_t = g, t
                continue
            take = t < best_t * (1 - 1e-9)          # ties keep the earlier (listed first) candidate
            best = {k: np.where(take, g[k], best[k]) for k in best}
            best_t = np.where(take, t, best_t)
    best["padded_flops"] = best["tiles"] * best["tile_flops"]
    best["bytes"] = common.total_bytes(kernels)
    best["flops"] = kernels["flops"].fillna(0).to_numpy(float)
    return best


#: The GEMM network's structural inputs (recipe key ``gemm_inputs``), each log2 unless said: what the
#: per-SM ratios of ``TILE_INPUTS`` leave implicit and a GEMM library's kernel choice and a GPU's memory system
#: act on.
GEMM_STRUCTURE = {
    # the operands and output against the L2 (< 0: the whole problem fits, repeated tiles hit L2, not DRAM)
    "l2_fit": lambda k, dev, geo: common.total_bytes(k) / (dev["l2_mb"] * 2**20),
    # how often the tiles re-read the operands (tiles x tile bytes / unique bytes): served by L2 or DRAM
    "operand_reuse": lambda k, dev, geo: geo["tiles"] * geo["tile_bytes"] / common.total_bytes(k),
    # the last wave's share of the SMs in use (linear, in (0, 1]): a tail of a few tiles idles the rest
    "last_wave_fill": lambda k, dev, geo: 2.0 ** (geo["tiles"] / (geo["waves"] * dev["num_sm"])),
    # split-K factor chosen (1 = none): a split adds a reduction of partial sums
    "split_k": lambda k, dev, geo: geo["split"],
    # the plain roofline time in microseconds: a kernel's fixed cost (launch, prologue) weighs on short ones
    "roofline_us": lambda k, dev, geo: common.roofline_ms(k, dev) * 1e3,
    # the GPU's ridge point (dense peak / bandwidth) and the kernel's FLOPs per unique byte
    "ridge": lambda k, dev, geo: common.peak_gflops(k, dev) / dev["mem_bw_gbs"],
    "flops_per_byte": lambda k, dev, geo: np.maximum(geo["flops"], 1.0) / common.total_bytes(k),
    # the kernel's own dims (a library picks its kernel by them), each GEMM of a batch
    "m": lambda k, dev, geo: k["M"].fillna(1).to_numpy(float),
    "n": lambda k, dev, geo: k["N"].fillna(1).to_numpy(float),
    "k": lambda k, dev, geo: k["K"].fillna(1).to_numpy(float),
}


def gemm_structure(kernels: pd.DataFrame, dev: dict, geo: dict, names) -> np.ndarray:
    """The ``GEMM_STRUCTURE`` inputs ``names`` of GEMM rows (``gemm_geometry``'s ``geo``), log2, one column each."""
    unknown = [n for n in names if n not in GEMM_STRUCTURE]
    if unknown:
        raise ValueError(f"tensor_core: unknown gemm_inputs {unknown}; known: {sorted(GEMM_STRUCTURE)}")
    cols = [np.asarray(GEMM_STRUCTURE[n](kernels, dev, geo), float) for n in names]
    return np.log2(np.maximum(np.stack(cols, axis=1), 1e-12)) if cols else np.zeros((len(kernels), 0))


def attention_geometry(kernels: pd.DataFrame, dev: dict, block_q: int = 128, tiles_per_sm: int = 1,
                       kv_split: bool = True, min_kv_slice: int = 256) -> dict:
    """Tiles and waves of fused-attention rows (module docstring), keys as ``common.geometry`` returns them."""
    b = np.maximum(kernels["B"].fillna(1).to_numpy(float), 1.0)
    sq, skv, h, hkv, d = (kernels[c].to_numpy(float) for c in schema.ATTN_COLUMNS)
    w = kernels["window"].fillna(0).to_numpy(float) if "window" in kernels else np.zeros(len(kernels))
    decode = (kernels["sub_op"].astype(str).to_numpy() == "decode") if "sub_op" in kernels else sq <= 1
    flops = kernels["flops"].fillna(0).to_numpy(float)
    byts = common.total_bytes(kernels)
    keys = np.where(w > 0, np.minimum(skv, sq - 1 + w), skv)
    q = np.minimum(float(block_q), sq)
    # decode: split the keys so that the (batch, KV head) pairs fill at most one wave, slices of >= min_kv_slice keys
    # (FlashDecoding; flash-attn's num_splits heuristic does the same kind of thing)
    pairs = b * hkv
    split = np.maximum(1.0, np.minimum(np.floor(dev["num_sm"] * tiles_per_sm / pairs),
                                       np.ceil(keys / min_kv_slice))) if kv_split else np.ones(len(b))
    tiles = np.where(decode, pairs * split, b * h * np.ceil(sq / block_q))
    tiles = np.maximum(tiles, 1.0)
    e = common.row_element_bytes(kernels)
    tile_bytes = np.where(decode, byts / tiles, e * 2 * q * d + e * 2 * keys * d)
    tile_flops = np.maximum(flops / tiles, 1.0)
    waves = np.ceil(tiles / (dev["num_sm"] * tiles_per_sm))
    return {"tiles": tiles, "waves": waves, "tile_flops": tile_flops, "tile_bytes": tile_bytes,
            "padded_flops": tiles * tile_flops, "bytes": byts, "flops": flops}


def shape_inputs(kernels: pd.DataFrame, dev: dict, net: str) -> np.ndarray:
    """log2 inputs of the shape-only ablation: dims, BF16 peak and bandwidth; no tiles or waves. Attention's
    dims include the sliding window (as 1 + window: 0 = none): 46 % of the training GPUs' decode rows are
    windowed variants of the same shapes, and a tree that cannot tell them apart is 120-140 % off in sample."""
    peak = common.peak_gflops(kernels, dev)
    if net in GEMM_NETWORKS:
        dims = [kernels[c].fillna(1).to_numpy(float) for c in ("B", "M", "N", "K")]
    else:
        window = kernels["window"].fillna(0).to_numpy(float) if "window" in kernels else np.zeros(len(kernels))
        dims = ([kernels["B"].fillna(1).to_numpy(float)] + [kernels[c].to_numpy(float) for c in schema.ATTN_COLUMNS]
                + [1.0 + window])
    return np.log2(np.maximum(np.stack(dims + [peak, dev["mem_bw_gbs"]], axis=1), 1e-9))


# ---------------------------------------------------------------- the networks
class TensorCoreNets:
    """The BF16 networks of a recipe's ``tensor_core:`` section (``DEFAULTS`` for what it leaves out; a
    training value, ``u_max`` or ``rows_per_gpu`` may be one value or a {network: value} dict)."""

    def __init__(self, config: dict | None = None, seed: int = 0):
        self.config = {**DEFAULTS, **(config or {})}
        self.seed = int(seed)
        self.nets: dict = {}
        self.norm: dict = {}
        self.info: dict = {}

    def value(self, key: str, net: str):
        """A config value: one for every network, or a {network: value} dict."""
        return setting(self.config, key, net)

    def geometry(self, df: pd.DataFrame, dev: dict, net: str) -> dict:
        """The tiles and waves this config gives rows of network ``net`` (GEMM: with the chosen tile and split)."""
        if net in GEMM_NETWORKS:
            return gemm_geometry(df, dev, self.config["gemm_tiles"], self.config["splits"])
        return attention_geometry(df, dev, int(self.config["block_q"]), int(self.config["tiles_per_sm"]),
                                  bool(self.config["kv_split"]))

    def gemm_choice(self, kernels: pd.DataFrame, device=None) -> pd.DataFrame:
        """Per row (GEMM rows; NaN elsewhere): the tile (tile_m, tile_k), split-K, tiles and waves chosen."""
        kernels = kernels.reset_index(drop=True)
        cols = ("tile_m", "tile_k", "split", "tiles", "waves")
        out = pd.DataFrame(np.nan, index=kernels.index, columns=list(cols))
        rows = np.flatnonzero(network_of(kernels) == "GEMM")
        if rows.size:
            dev = {k: v[rows] for k, v in common.device_arrays(kernels, device).items()}
            geo = self.geometry(kernels.iloc[rows], dev, "GEMM")
            for c in cols:
                out.loc[rows, c] = geo[c]
        return out

    def _inputs(self, df: pd.DataFrame, dev: dict, net: str):
        """(X, waves, base): log2 MLP inputs, waves and the wave roofline in ms."""
        geo = self.geometry(df, dev, net)
        X = features(df, dev, geo, TILE_INPUTS)
        names = self.value("gemm_inputs", net) if net in GEMM_NETWORKS else []
        if names:
            X = np.concatenate([X, gemm_structure(df, dev, geo, names)], axis=1)
        if self.config.get("dims_input"):
            # the kernel's own dims next to the per-SM ratios (the library picks its kernel by them)
            X = np.concatenate([X, shape_inputs(df, dev, net)[:, :-2]], axis=1)
        return X, geo["waves"], common.wave_roofline_ms(df, dev, geo)

    def quantiser(self, net: str) -> tuple:
        """The quantisation kernels ``QUANTISERS`` run before a row of network ``net`` (only GEMM_fp8 has any)."""
        kind = self.config.get("fp8_quantiser", "none") if net == "GEMM_fp8" else "none"
        if kind not in QUANTISERS:
            raise ValueError(f"tensor_core: fp8_quantiser must be one of {', '.join(QUANTISERS)}, got {kind!r}")
        return QUANTISERS[kind]

    def quantiser_ms(self, df: pd.DataFrame, device, net: str, law: dict | None) -> np.ndarray:
        """ms of the quantisation kernels before each row of ``df`` (``quantiser``; zeros without), each a BF16
        element-wise kernel over the activation (B x M x N elements, N the reduction) timed by the memory law's numbers
        ``law``; ``device`` None: the table's ``device`` column."""
        kernels = self.quantiser(net)
        if not kernels:
            return np.zeros(len(df))
        if law is None:
            raise ValueError(f"tensor_core: {net} times its activations' quantisation by the memory law; none was "
                             "handed over (load or train the predictor with predictors.get)")
        elems = np.prod([df[c].fillna(1).to_numpy(float) for c in ("B", "M", "N")], axis=0)
        base = {"op_class": OpClass.VEC, "precision": Precision.BF16}
        if device is None:
            base["device"] = df["device"].to_numpy()
        return sum(memory_law.time_ms(pd.DataFrame({**base, "bytes_read": r * elems, "bytes_written": w * elems}),
                                      device, law) for r, w in kernels)

    def _ms(self, net: str, Xs: np.ndarray, waves, base) -> np.ndarray:
        outs = [m(Xs) for m in self.nets[net]]
        return base / (float(self.value("u_max", net)) * np.mean([utilisation(o, waves) for o in outs], axis=0))

    # ------------------------------------------------------------ training
    def fit(self, kernels: pd.DataFrame, quick: bool = False, bar=None, law: dict | None = None) -> dict:
        """Train every network of the config on ``kernels`` (the training GPUs' measured kernels, which the trainer
        reads: ``measured_kernels.training_kernels``); ``quick``: ``quick_rows_per_gpu`` rows and ``quick_epochs``;
        ``law``: the memory law's numbers, for a network with a quantiser (``quantiser_ms``)."""
        import torch

        from neusight_core.predictors.nets import MLP, as_tensors, train_loop
        c = self.config
        self.info = {"quick": quick, "networks": {}}
        with Timer() as t:
            for net in c["networks"]:
                u_max = float(self.value("u_max", net))
                epochs = int(self.value("quick_epochs" if quick else "epochs", net))
                df = training_rows(kernels, net, c, quick, self.seed)
                if df.empty:
                    continue
                dev = common.device_arrays(df)
                X, waves, base = self._inputs(df, dev, net)
                y = df["latency_ms"].to_numpy(float)
                mu, sd = X.mean(0), X.std(0) + 1e-6
                self.norm[net] = (mu, sd)
                # the quantiser's share of each measured call: the network learns the GEMM beside it, scored on the
                # whole call (the loss sees quantiser + GEMM over measured, as a prediction is made)
                Xt, wt, by, qy = as_tensors((X - mu) / sd, waves, base / y, self.quantiser_ms(df, None, net, law) / y)
                val = split_validation(len(df), float(c["val_fraction"]), self.seed)
                # its own seed per network: adding or dropping a network moves no other network's RNG; members of
                # an ensemble (``members``) draw their initial weights from seeds 100 apart (member 0: the single
                # network's), the same rows and batches otherwise; their utilisations are averaged (``_ms``)
                net_seed = self.seed * 1000 + 500 + NETWORKS.index(net)
                self.nets[net], vals = [], []
                with Timer() as tn:
                    for m in range(int(self.value("members", net))):
                        torch.manual_seed(net_seed + 100 * m)
                        model = MLP(X.shape[1], 2, int(self.value("hidden", net)), int(self.value("layers", net)))

                        def ratio(idx, model=model):
                            return by[idx] / (u_max * utilisation(model(Xt[idx]), wt[idx])) + qy[idx]
                        r = train_loop(model, ratio, len(df), val, epochs, int(self.value("batch", net)),
                                       float(self.value("lr", net)), self.value("loss", net), net_seed, bar)
                        self.nets[net].append(NumpyMLP(model.state_dict()))
                        vals.append(r)
                self.info["networks"][net] = {"rows": int(len(df)), "epochs": epochs,
                                              "val_mape": vals[0]["val_mape"] if len(vals) == 1 else
                                              [v["val_mape"] for v in vals],
                                              "best_epoch": vals[0]["best_epoch"] if len(vals) == 1 else
                                              [v["best_epoch"] for v in vals],
                                              "seconds": tn.seconds, "devices": sorted(df["device"].unique())}
        self.info["train_seconds"] = t.seconds
        return self.info

    # ------------------------------------------------------------ prediction
    def handles(self, kernels: pd.DataFrame) -> np.ndarray:
        """Rows these networks answer (their network is trained; an attention backward through its forward's)."""
        nets = network_of(_backward_as_forward(kernels)[0])
        return np.isin(nets, list(self.nets))

    def predict(self, kernels: pd.DataFrame, device=None, law: dict | None = None) -> np.ndarray:
        """ms per row of the handled rows (NaN elsewhere); ``device`` None: the table's ``device`` column; ``law``: the
        memory law's numbers, for a network with a quantiser (``quantiser_ms``)."""
        kernels, factor = _backward_as_forward(kernels.reset_index(drop=True))
        out = np.full(len(kernels), np.nan)
        nets = network_of(kernels)
        dev = common.device_arrays(kernels, device)
        for net in self.nets:
            rows = np.flatnonzero(nets == net)
            if rows.size == 0:
                continue
            d = {k: v[rows] for k, v in dev.items()}
            X, waves, base = self._inputs(kernels.iloc[rows], d, net)
            mu, sd = self.norm[net]
            out[rows] = self._ms(net, (X - mu) / sd, waves, base) + self.quantiser_ms(kernels.iloc[rows], device, net, law)
        return out * factor

    # ------------------------------------------------------------ state
    def get_state(self) -> dict:
        return {"nets": {n: [m.state_dict() for m in ms] for n, ms in self.nets.items()},
                "norm": {n: {"mu": m, "sd": s} for n, (m, s) in self.norm.items()}}

    def set_state(self, state: dict) -> None:
        self.nets = {n: [NumpyMLP(sd) for sd in sds] for n, sds in state["nets"].items()}
        self.norm = {n: (np.asarray(v["mu"]), np.asarray(v["sd"])) for n, v in state["norm"].items()}


# ---------------------------------------------------------------- data
def subsample(df: pd.DataFrame, per_gpu: int, seed: int, keys=("device",), offset: int = 2025) -> pd.DataFrame:
    """At most ``per_gpu`` random rows of each group of ``keys`` (each device), fixed by ``seed`` + ``offset``, in
    their original order."""
    rng = np.random.default_rng(seed + offset)
    keep = [rng.choice(idx, size=min(len(idx), per_gpu), replace=False)
            for _, idx in sorted(df.groupby(list(keys)).indices.items())]
    if not keep:
        return df
    return df.iloc[np.sort(np.concatenate(keep))].reset_index(drop=True)


# ---------------------------------------------------------------- where a GPU lies against the training GPUs
#: the GPU figures the networks' inputs are made of (per SM where the inputs are per SM)
RANGE_FIGURES = {"dense BF16 TFLOPS per SM": lambda d: d.gemm_peak_gflops(Precision.BF16) / d.num_sm / 1e3,
                 "GB/s per SM": lambda d: d.mem_bw_gbs / d.num_sm, "SMs": lambda d: float(d.num_sm),
                 "MB of L2": lambda d: float(d.l2_mb)}


def outside_range(dev, training) -> list[str]:
    """The ``RANGE_FIGURES`` of the device ``dev`` that lie outside those of the devices ``training`` (the networks'
    training GPUs), each as "<figure> <value> (training GPUs <min>-<max>)"; [] when all lie within."""
    out = []
    for name, f in RANGE_FIGURES.items():
        v, seen = f(dev), [f(t) for t in training]
        if not min(seen) * (1 - 1e-9) <= v <= max(seen) * (1 + 1e-9):
            out.append(f"{name} {v:.3g} (training GPUs {min(seen):.3g}-{max(seen):.3g})")
    return out

