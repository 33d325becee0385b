"""Measured BF16 kernels of other GPUs: NVIDIA's aiconfigurator-core database as kernel tables.

``aiconfigurator-core`` (PyPI, Apache-2.0, pinned to 0.12.0 in requirements.txt) ships measured kernel
latencies under ``aiconfigurator_core/systems/data/<system>/<op>/<framework>/<version>/*.parquet``. This
module reads them through ``importlib.resources`` (nothing is copied into the repository) and turns them
into the kernel table of ``trace.trace_model`` / ``dataset.to_kernels`` (docs/interfaces.md), so that the
predictors can be trained and judged on them.

The split (fixed before anything was trained; :func:`split`):

- training: A100 SXM (80 GB), H100 SXM, H200 SXM, L40S (package systems ``a100_sxm``, ``h100_sxm``,
  ``h200_sxm``, ``l40s``);
- held out: B200, GB200 (``b200_sxm``, ``gb200``): reported, never trained, tuned or chosen on;
- sealed: B300, GB300, RTX PRO 6000 Server, B60 (``b300_sxm``, ``gb300``, ``rtx_pro_6000_server``,
  ``b60``): kept for independent checks. Every loader here refuses them (:class:`SealedGPUError`) before
  touching a file, unless called with ``allow_sealed`` set to true, which nothing in this project does;
  :func:`available` lists only that they exist.

The package's other systems (A100 PCIe, A30, H100 PCIe, L4) are outside the split and refused too. What is read:

- GEMM (``gemm/<fw>/<ver>/gemm_perf.parquet``, columns ``kernel_source, gemm_dtype, m, n, k, latency``):
  the rows with ``gemm_dtype == "bfloat16"``: unquantised BF16 ``x[m, k] @ W[n, k]^T`` through torch
  (cuBLAS). The framework's label for them is kept in ``kernel_source``: ``torch.nn.functional.linear``
  (vLLM 0.24), ``vllm_default`` (vLLM 0.14, the only BF16 GEMMs of A100 SXM in vLLM), ``sglang_torch_linear``
  / ``sglang`` (SGLang), ``torch_flow`` (TensorRT-LLM). And, for the FP8 GEMM network only, the rows with
  ``gemm_dtype == "fp8"`` (per-tensor scaled W8A8, both operands FP8 E4M3, BF16 output), precision ``fp8``;
  block-scaled ``fp8_block`` rows are read by :func:`load_gemm` when asked for (scored, never trained on). FP4 / int
  rows are not read.
- Fused attention (``attention/<fw>/<ver>/context_attention_perf.parquet`` = prefill,
  ``generation_attention_perf.parquet`` = decode; columns ``kernel_source, batch_size, isl, num_heads,
  num_key_value_heads, head_dim, attn_dtype, kv_cache_dtype, step, latency`` and, where present,
  ``window_size``, else 0: A100 SXM's SGLang and vLLM files have none): the rows with
  ``attn_dtype == "bfloat16"`` (FP8 attention is not read) and, by default, a BF16 KV cache.
  FlashAttention 2/3/4, FlashInfer, TRT-LLM and Triton kernels, named in ``kernel_source``.
- ``latency`` is in ms (a 32768 x 65536 x 12288 BF16 GEMM on H100 SXM: 60.3 -> 875 TFLOPS).
- Also BF16 -> FP8 element-wise kernels (:func:`load_quantize`, the memory law's data) and NCCL's all-reduces
  (:func:`load_allreduce`, the network model's fixed cost per all-reduce), each as its own small frame.

Kernel table (:func:`load_gemm`, :func:`load_attention`; one row per measured kernel). The columns of
``dataset.to_kernels`` (``phase`` ... ``stage``, then ``device``, ``latency_ms``, ``op``) and the device
features of ``dataset.join_device_features``, plus:

| column | meaning |
|---|---|
| ``op_class`` | ``LINEAR`` (GEMM rows) or ``ATTN`` (fused attention, new class; predictors do not handle it yet) |
| ``sub_op`` | ATTN: ``prefill`` (context attention) or ``decode`` (generation attention); LINEAR: ``""`` |
| ``op`` | ``linear`` or ``attention`` |
| ``aten_op`` | ``aten.mm.default`` (LINEAR), ``aten._scaled_dot_product_flash_attention.default`` (ATTN) |
| ``B``, ``M``, ``N``, ``K`` | LINEAR: B = 1, M = m (tokens), N = k (the reduction), K = n (out features); ATTN: B = batch, M/N/K NaN |
| ``H`` | NaN |
| ``flops`` | LINEAR 2mnk; ATTN 4 x batch x heads x head_dim x (query, key) pairs (:func:`attention_pairs`) |
| ``bytes_read``, ``bytes_written`` | each tensor once, BF16 2 B: LINEAR 2(mk + kn) and 2mn; ATTN Q, K, V read and O written (see :func:`attention_kernels`) |
| ``dtype``, ``precision`` | ``bfloat16``, ``bf16`` (the predictors then use the dense BF16 tensor-core peak) |
| ``device`` | catalogue name (``devices.get_device``), e.g. ``NVIDIA_H100_80GB_HBM3`` |
| ``latency_ms`` | measured latency, ms |
| ``system``, ``role`` | the package's system name (``h100_sxm``) and ``training`` / ``held_out`` |
| ``framework``, ``version`` | from the path, e.g. ``vllm``, ``0.24.0`` |
| ``kernel_source`` | the package's kernel label (above) |
| ATTN only: ``seq_q``, ``seq_kv`` | query tokens per sequence (``isl``) and keys in its context (``isl + step``) |
| ATTN only: ``heads``, ``kv_heads``, ``head_dim``, ``window``, ``kv_dtype`` | query / KV heads, head size, sliding window (0 = none), KV-cache dtype |

A missing package, a changed layout (no data folder, no file for a GPU, a missing column, an unreadable
file) or a refused GPU is one line: :class:`MeasuredDataError` (:class:`SealedGPUError` for sealed GPUs). Values
are checked too: ``measured_checks.validate``.
"""
from __future__ import annotations

import importlib.metadata
import importlib.resources
from pathlib import Path

import numpy as np
import pandas as pd

from neusight_core.data.measured_checks import MeasuredDataError, validate
from neusight_core.data import dataset, devices
from neusight_core.question.schema import OpClass, Precision

PACKAGE = "aiconfigurator_core"
DISTRIBUTION = "aiconfigurator-core"
PINNED_VERSION = "0.12.0"

#: the split, as the package names its systems
TRAINING = ("a100_sxm", "h100_sxm", "h200_sxm", "l40s")
HELD_OUT = ("b200_sxm", "gb200")
SEALED = ("b300_sxm", "gb300", "rtx_pro_6000_server", "b60")
#: package system -> catalogue name (devices.yaml / the release); sealed GPUs have none, by design
CATALOGUE = {"a100_sxm": "NVIDIA_A100-SXM4-80GB", "h100_sxm": "NVIDIA_H100_80GB_HBM3", "h200_sxm": "NVIDIA_H200",
             "l40s": "NVIDIA_L40S", "b200_sxm": "NVIDIA_B200", "gb200": "NVIDIA_GB200"}
# names of sealed GPUs, refused before anything is looked up (a prefix match: "B300 SXM6 AC" is B300 too)
_SEALED_KEYS = ("b300", "gb300", "rtxpro6000", "b60")

GEMM_FILE = "gemm_perf.parquet"
ATTENTION_FILES = {"prefill": "context_attention_perf.parquet", "decode": "generation_attention_perf.parquet"}
GEMM_COLUMNS = ("kernel_source", "gemm_dtype", "m", "n", "k", "latency")
ATTENTION_COLUMNS = ("kernel_source", "batch_size", "isl", "num_heads", "num_key_value_heads", "head_dim",
                     "attn_dtype", "kv_cache_dtype", "step", "latency")
#: read when present, else this value (A100 SXM's SGLang 0.5.10 and vLLM 0.14 files predate sliding windows)
ATTENTION_OPTIONAL = {"window_size": 0}
ATTENTION_ATEN = "aten._scaled_dot_product_flash_attention.default"
#: the package's name for per-tensor FP8 (E4M3) data: the same word as our precision's
DB_FP8 = Precision.FP8.value
DB_DTYPE_BYTES = {"bfloat16": 2.0, DB_FP8: 1.0}
#: what a file that fails ``measured_checks.validate`` asks for
REINSTALL = (f"the file is damaged or not {DISTRIBUTION} {PINNED_VERSION}'s: reinstall it (pip install "
             f"--force-reinstall {DISTRIBUTION}=={PINNED_VERSION})")
ATTENTION_EXTRA = ("seq_q", "seq_kv", "heads", "kv_heads", "head_dim", "window", "kv_dtype")
#: BF16 -> FP8 quantisation of an m x k matrix (``quantize/<fw>/<ver>/``): one element-wise kernel per row
QUANTIZE_FILE = "scale_matrix_perf.parquet"
QUANTIZE_COLUMNS = ("kernel_source", "m", "k", "quant_dtype", "latency")
#: the single-pass kernels: PyTorch's own (``torch_ops``) and vLLM's static quantiser. SGLang's is left out: it
#: moves 3 B per element at 0.34 TB/s on the H100 SXM at the largest sizes (10 % of the bandwidth, where the
#: other two reach 3.0 TB/s), so it does work its bytes do not show.
QUANTIZE_SOURCES = ("torch_ops", "static_scaled_fp8_quant")
#: NCCL's collectives on 2, 4 and 8 GPUs of one server (``comm/nccl/<ver>/``); ``message_size`` counts elements
NCCL_FILE = "nccl_perf.parquet"
NCCL_COLUMNS = ("op_name", "nccl_dtype", "num_gpus", "message_size", "latency")


class SealedGPUError(MeasuredDataError):
    """A sealed GPU was asked for: its data is kept for independent checks and never read here."""


# ---------------------------------------------------------------- the package and the split
def package_version() -> str | None:
    """Installed aiconfigurator-core version, or None when it is not installed."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def _layout_hint() -> str:
    return f"aiconfigurator-core {package_version()} installed, {PINNED_VERSION} pinned: the package layout changed?"


def data_root(root: str | Path | None = None) -> Path:
    """``aiconfigurator_core/systems/data`` of the installed package (``root``: a folder laid out the same way)."""
    if root is not None:
        return Path(root)
    try:
        base = importlib.resources.files(PACKAGE)
    except ModuleNotFoundError:
        raise MeasuredDataError(f"{DISTRIBUTION} is not installed: pip install -r requirements.txt (pins "
                                f"{DISTRIBUTION}=={PINNED_VERSION}; scripts/bootstrap.sh does it)") from None
    d = base / "systems" / "data"
    if not isinstance(d, Path) or not d.is_dir():
        raise MeasuredDataError(f"{d}: no systems/data folder in {PACKAGE} ({_layout_hint()})")
    return d


def unavailable(root: str | Path | None = None) -> str | None:
    """Why the database cannot be read here (the one line of :func:`data_root`'s error: the optional package is
    not installed, or its layout changed), or None. Asked before training anything that needs it."""
    try:
        data_root(root)
    except MeasuredDataError as e:
        return str(e)
    return None


def split() -> dict:
    """The split: ``training`` and ``held_out`` as catalogue names, ``sealed`` as package system names."""
    return {"training": tuple(CATALOGUE[s] for s in TRAINING), "held_out": tuple(CATALOGUE[s] for s in HELD_OUT),
            "sealed": SEALED}


def role(system: str) -> str:
    """``training`` | ``held_out`` | ``sealed`` | ``unused`` (in the package, outside the split)."""
    return ("training" if system in TRAINING else "held_out" if system in HELD_OUT
            else "sealed" if system in SEALED else "unused")


def _is_sealed(name: str) -> bool:
    k = devices.normalise_name(name)                       # the catalogue's lookup key: case, spaces, - and _ ignored
    k = k[len("nvidia"):] if k.startswith("nvidia") else k
    return k.startswith(_SEALED_KEYS)


def resolve(gpu: str, allow_sealed: bool = False) -> str:
    """Package system name of ``gpu`` (system name, or what the GPU catalogue resolves: name, alias, display name).

    Sealed GPUs raise :class:`SealedGPUError` unless ``allow_sealed``; GPUs outside the split raise
    :class:`MeasuredDataError`. Nothing is read."""
    gpu = str(gpu)
    if gpu in SEALED or _is_sealed(gpu):
        if not allow_sealed:
            raise SealedGPUError(f"GPU {gpu!r} is sealed (kept for independent checks): its measured "
                                 f"kernels are never read here")
        return next((s for s in SEALED if devices.normalise_name(s) == devices.normalise_name(gpu)), gpu)
    if gpu in CATALOGUE:
        return gpu
    try:         # any catalogue name, alias or display name: one meaning per name (devices.yaml), no list of our own
        name = devices.get_device(gpu).name
    except LookupError:
        name = None
    for s, n in CATALOGUE.items():
        if n == name:
            return s
    raise MeasuredDataError(f"GPU {gpu!r} is not in the measured kernels' split (training: {', '.join(TRAINING)}; held out: "
                            f"{', '.join(HELD_OUT)}); the package's other GPUs are not used")


def system_names(gpus, allow_sealed: bool) -> list[str]:
    """``"training"`` | ``"held_out"`` | a GPU name | a list of them -> package system names (checked first)."""
    if isinstance(gpus, str):
        gpus = {"training": TRAINING, "held_out": HELD_OUT}.get(gpus, [gpus])
    out = [resolve(g, allow_sealed) for g in gpus]
    if not out:
        raise MeasuredDataError("no GPU asked for")
    return list(dict.fromkeys(out))


def _version_key(v: str):
    from packaging.version import InvalidVersion, Version
    try:
        return (1, Version(v), v)
    except InvalidVersion:
        return (0, None, v)


def available(root: str | Path | None = None) -> pd.DataFrame:
    """What the package holds, one row per (system, op, framework, version) of GEMM and attention files:
    ``system``, ``device`` (catalogue name, "" outside the split), ``role``, ``op`` (``gemm`` | ``attention``),
    ``framework``, ``version``, ``files`` (parquet names). A sealed system is one row (role ``sealed``, op /
    framework / version "") and its folder is not opened."""
    base = data_root(root)
    rows = []
    for sysdir in sorted(p for p in base.iterdir() if p.is_dir()):
        s = sysdir.name
        r = role(s)
        if r == "sealed":
            rows.append({"system": s, "device": "", "role": r, "op": "", "framework": "", "version": "", "files": ""})
            continue
        for op in ("gemm", "attention"):
            for fw in sorted(p for p in (sysdir / op).glob("*") if p.is_dir()):
                for ver in sorted((p for p in fw.iterdir() if p.is_dir()), key=lambda p: _version_key(p.name)):
                    names = sorted(f.name for f in ver.glob("*.parquet"))
                    if names:
                        rows.append({"system": s, "device": CATALOGUE.get(s, ""), "role": r, "op": op,
                                     "framework": fw.name, "version": ver.name, "files": ", ".join(names)})
    if not rows:
        raise MeasuredDataError(f"{base}: no GPU folders ({_layout_hint()})")
    return pd.DataFrame(rows)


def kernel_files(base: Path, system: str, op: str, filename: str, frameworks, versions) -> list[tuple[str, str, Path]]:
    """(framework, version, file) of one system and op: each framework's newest version (``versions="latest"``),
    every version (``"all"``) or the listed ones."""
    sysdir = base / system
    if not sysdir.is_dir():
        raise MeasuredDataError(f"{sysdir}: no measured data for {system} ({_layout_hint()})")
    out = []
    for fw in sorted(p for p in (sysdir / op).glob("*") if p.is_dir()):
        if frameworks is not None and fw.name not in frameworks:
            continue
        vers = sorted((p for p in fw.iterdir() if (p / filename).is_file()), key=lambda p: _version_key(p.name))
        if versions == "latest":
            vers = vers[-1:]
        elif versions != "all":
            vers = [v for v in vers if v.name in set(versions)]
        out += [(fw.name, v.name, v / filename) for v in vers]
    if not out:
        want = "" if frameworks is None else f" for framework(s) {', '.join(frameworks)}"
        raise MeasuredDataError(f"{sysdir / op}: no {filename}{want} ({_layout_hint()})")
    return out


def read_table(path: Path, columns, optional=None) -> pd.DataFrame:
    """The parquet file's ``columns`` (any missing: one line naming the file and them) and those of
    ``optional`` ({column: value when absent}) it has."""
    import pyarrow.parquet as pq
    try:
        names = pq.read_schema(path).names
    except Exception as e:                       # pyarrow raises its own error kinds for damaged files
        raise MeasuredDataError(f"{path}: cannot read ({_first_line(e)})") from None
    missing = [c for c in columns if c not in names]
    if missing:
        raise MeasuredDataError(f"{path}: missing column(s) {', '.join(missing)} ({_layout_hint()})")
    optional = optional or {}
    try:
        df = pd.read_parquet(path, columns=list(columns) + [c for c in optional if c in names])
    except Exception as e:
        raise MeasuredDataError(f"{path}: cannot read ({_first_line(e)})") from None
    for c, v in optional.items():
        if c not in df:
            df[c] = v
    return df


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


# ---------------------------------------------------------------- rows -> kernel table
def kernel_frame(op: str, op_class: str, sub_op, B, M, N, K) -> pd.DataFrame:
    """The kernel-table columns of ``dataset.to_kernels`` for these rows (FLOPs and bytes set by the caller)."""
    n = len(B)
    proc = pd.DataFrame({"op": op, "op_class": op_class, "sub_op": sub_op, "B": B, "M": M, "N": N, "K": K,
                         "H": np.full(n, np.nan)}, index=pd.RangeIndex(n))
    return dataset.to_kernels(proc)


def _provenance(out: pd.DataFrame, latency, system: str, framework: str, version: str, kernel_source,
                precision: str = Precision.BF16) -> pd.DataFrame:
    out["dtype"] = "bfloat16"          # the output's type: BF16 for the FP8 GEMMs too
    out["precision"] = precision
    out["device"] = CATALOGUE.get(system, system)
    out["latency_ms"] = np.asarray(latency, float)
    out["system"] = system
    out["role"] = role(system)
    out["framework"] = framework
    out["version"] = version
    out["kernel_source"] = np.asarray(kernel_source, object)
    return out


#: the block-scaled FP8 GEMMs (DeepSeek-style 128-wide scales), read only to be scored
FP8_BLOCK = "fp8_block"


def gemm_kernels(raw: pd.DataFrame, system: str, framework: str = "", version: str = "",
                 gemm_dtype: str = "bfloat16") -> pd.DataFrame:
    """``gemm_dtype`` rows (``bfloat16``, ``fp8`` or ``fp8_block``) of a ``gemm_perf.parquet`` frame -> kernel table (no
    device features).

    The package measures ``y[m, n] = x[m, k] @ W[n, k]^T``; the kernel table writes GEMMs [M x N] @ [N x K]
    with N the reduction: M = m, N = k, K = n, B = 1. FLOPs 2mnk; bytes: x and W read (2 B each element in
    BF16, 1 B in FP8), y written (BF16, 2 B)."""
    raw = raw[raw["gemm_dtype"] == gemm_dtype].reset_index(drop=True)
    m, n, k = (raw[c].to_numpy(float) for c in ("m", "n", "k"))
    out = kernel_frame("linear", OpClass.LINEAR, "", np.ones(len(raw)), m, k, n)
    e = DB_DTYPE_BYTES[DB_FP8 if gemm_dtype == FP8_BLOCK else gemm_dtype]
    out["flops"] = 2.0 * m * n * k
    out["bytes_read"] = e * (m * k + k * n)
    out["bytes_written"] = DB_DTYPE_BYTES["bfloat16"] * m * n
    prec = Precision.BF16 if gemm_dtype == "bfloat16" else Precision.FP8
    return _provenance(out, raw["latency"], system, framework, version, raw["kernel_source"], prec)


def _causal_prefix_pairs(n, w):
    """(query, key) pairs of the first ``n`` positions of a causal mask with sliding window ``w`` (0 = none):
    position p (0-based) sees min(p + 1, w) keys, so the sum is n(n+1)/2 while n <= w and
    w(w+1)/2 + (n - w) w after."""
    n = np.asarray(n, float)
    w = np.asarray(w, float)
    full = n * (n + 1) / 2
    win = w * (w + 1) / 2 + (n - w) * w
    return np.where((w <= 0) | (n <= w), full, win)


def attention_pairs(seq_q, seq_kv, window):
    """(query, key) pairs a causal attention computes when ``seq_q`` new tokens follow ``seq_kv - seq_q``
    cached ones (all positions masked causally, a key at most ``window`` positions back when window > 0):
    pairs(first seq_kv positions) - pairs(first seq_kv - seq_q). Prefill of s tokens: s(s+1)/2 (no
    window); decode (seq_q = 1): min(seq_kv, window or seq_kv)."""
    seq_q = np.asarray(seq_q, float)
    seq_kv = np.asarray(seq_kv, float)
    return _causal_prefix_pairs(seq_kv, window) - _causal_prefix_pairs(seq_kv - seq_q, window)


def attention_kernels(raw: pd.DataFrame, kind: str, system: str, framework: str = "",
                      version: str = "", kv_dtypes=("bfloat16",)) -> pd.DataFrame:
    """BF16 rows of a ``context_attention_perf.parquet`` (``kind="prefill"``) or
    ``generation_attention_perf.parquet`` (``"decode"``) frame -> kernel table, op class ATTN.

    Shapes: batch b, ``seq_q = isl`` query tokens per sequence, ``seq_kv = isl + step`` keys (the package
    adds ``step``, the tokens already in the KV cache, to ``isl``: 0 in every prefill file, 2^j - 1 in the
    decode files, so decode contexts are powers of two), h = ``num_heads`` query heads, h_kv =
    ``num_key_value_heads``, d = ``head_dim`` (V has d too), w = ``window_size`` (0 = full causal).

    FLOPs, the FlashAttention count (Dao et al., FlashAttention-2, section 4: 4 x seqlen^2 x head_dim x
    heads per sequence, halved for causal): every (query, key) pair costs a d-long dot product for S = QK^T
    (2d FLOPs: d multiplies, d adds) and a d-long multiply-add for O += P V (2d FLOPs), so
    FLOPs = 4 x b x h x d x pairs, with pairs = :func:`attention_pairs` (exact causal count s(s+1)/2 for a
    prefill of s tokens where the papers write s^2/2; softmax exponentials and rescaling are not counted,
    as in FlashAttention). GQA does not change it (each query head still sees every key).

    Bytes, each tensor once (FlashAttention's point: S and P never reach DRAM): Q read b x seq_q x h x d and
    O written b x seq_q x h x d elements (BF16, 2 B); K and V read b x keys x h_kv x d elements each at the
    KV-cache element size (2 B BF16, 1 B FP8), keys = the keys any query sees = seq_kv without a window,
    else min(seq_kv, seq_q - 1 + w) (decode: min(seq_kv, w)). The softmax statistics (b x h x seq_q floats)
    are not counted."""
    if kind not in ATTENTION_FILES:
        raise ValueError(f"kind must be one of {', '.join(ATTENTION_FILES)}, got {kind!r}")
    keep = (raw["attn_dtype"] == "bfloat16") & raw["kv_cache_dtype"].isin(list(kv_dtypes))
    raw = raw[keep].reset_index(drop=True)
    b, isl, step, h, hkv, d, w = (raw[c].to_numpy(float) for c in (
        "batch_size", "isl", "step", "num_heads", "num_key_value_heads", "head_dim", "window_size"))
    seq_q, seq_kv = isl, isl + step
    nan = np.full(len(raw), np.nan)
    out = kernel_frame("attention", OpClass.ATTN, kind, b, nan, nan, nan)
    out["aten_op"] = ATTENTION_ATEN
    e = DB_DTYPE_BYTES["bfloat16"]
    kv_e = raw["kv_cache_dtype"].map(DB_DTYPE_BYTES).to_numpy(float)
    keys = np.where(w > 0, np.minimum(seq_kv, seq_q - 1 + w), seq_kv)
    out["flops"] = 4.0 * b * h * d * attention_pairs(seq_q, seq_kv, w)
    out["bytes_read"] = e * b * seq_q * h * d + kv_e * 2.0 * b * keys * hkv * d
    out["bytes_written"] = e * b * seq_q * h * d
    out = _provenance(out, raw["latency"], system, framework, version, raw["kernel_source"])
    for col, v in zip(ATTENTION_EXTRA, (seq_q, seq_kv, h, hkv, d, w, raw["kv_cache_dtype"].to_numpy(object))):
        out[col] = v
    return out


# ---------------------------------------------------------------- loaders
def _finish(parts: list, what: str, systems, features: bool) -> pd.DataFrame:
    empty = [s for s in systems if not any(len(p) and p["system"].iloc[0] == s for p in parts)]
    if empty:
        raise MeasuredDataError(f"no {what} rows for {', '.join(empty)} in the files asked for")
    df = pd.concat([p for p in parts if len(p)], ignore_index=True)
    return dataset.join_device_features(df) if features else df


def load_gemm(gpus="training", frameworks=None, versions="latest", allow_sealed: bool = False,
              root: str | Path | None = None, features: bool = True, gemm_dtype: str = "bfloat16") -> pd.DataFrame:
    """Measured BF16 GEMMs of ``gpus`` (``"training"``, ``"held_out"``, a GPU name or a list) as a kernel
    table (module docstring). ``frameworks``: None (all) or names (``vllm``, ``sglang``, ``trtllm``);
    ``versions``: ``"latest"`` (each framework's newest), ``"all"`` or a list. ``features`` adds the
    catalogue's device features (``dataset.join_device_features``). Sealed GPUs raise before any file is
    opened. ``gemm_dtype``: the package's rows read (``bfloat16``, ``fp8``, ``fp8_block``)."""
    systems = system_names(gpus, allow_sealed)
    base = data_root(root)
    parts = []
    for s in systems:
        for fw, ver, f in kernel_files(base, s, "gemm", GEMM_FILE, frameworks, versions):
            parts.append(validate(gemm_kernels(read_table(f, GEMM_COLUMNS), s, fw, ver, gemm_dtype), f, REINSTALL))
    return _finish(parts, f"{gemm_dtype} GEMM", systems, features)


def quantize_kernels(raw: pd.DataFrame, system: str, framework: str = "", version: str = "") -> pd.DataFrame:
    """``QUANTIZE_SOURCES`` rows of a ``scale_matrix_perf.parquet`` frame -> kernel table, op class VEC (no device
    features): x[m, k] BF16 read (2 B an element), times a scale, written as FP8 (1 B); B = m rows of H = k
    elements, 1 FLOP an element. A memory-bound element-wise kernel of a BF16 model, measured."""
    raw = raw[raw["kernel_source"].isin(QUANTIZE_SOURCES) & (raw["quant_dtype"] == DB_FP8)].reset_index(drop=True)
    m, k = (raw[c].to_numpy(float) for c in ("m", "k"))
    nan = np.full(len(raw), np.nan)
    out = kernel_frame("mul", OpClass.VEC, "mulu", m, nan, nan, nan)
    out["H"] = k
    out["flops"] = m * k
    out["bytes_read"] = DB_DTYPE_BYTES["bfloat16"] * m * k
    out["bytes_written"] = DB_DTYPE_BYTES[DB_FP8] * m * k
    return _provenance(out, raw["latency"], system, framework, version, raw["kernel_source"])


def load_quantize(gpus="training", allow_sealed: bool = False, root: str | Path | None = None) -> pd.DataFrame:
    """Measured BF16 -> FP8 element-wise kernels (:func:`quantize_kernels`, each framework's newest version) of
    ``gpus`` as a kernel table. A GPU without FP8 has no such file (the A100 SXM): it is skipped, not an error,
    unless no GPU asked for has one. Checked: every latency positive and finite. Not ``measured_checks.validate``,
    whose bandwidth bound does not hold here: an input that fits the L2 is read from it, up to 7 x faster than
    DRAM allows on the L40S."""
    systems = system_names(gpus, allow_sealed)
    base = data_root(root)
    parts = []
    for s in systems:
        if not (base / s / "quantize").is_dir():
            continue
        for fw, ver, f in kernel_files(base, s, "quantize", QUANTIZE_FILE, None, "latest"):
            q = quantize_kernels(read_table(f, QUANTIZE_COLUMNS), s, fw, ver)
            lat = q["latency_ms"].to_numpy(float)
            if len(q) and not (np.isfinite(lat) & (lat > 0)).all():
                raise MeasuredDataError(f"{f}: {int((~(np.isfinite(lat) & (lat > 0))).sum())} rows without a positive "
                                        f"finite latency; {REINSTALL}")
            parts.append(q)
    if not any(len(p) for p in parts):
        raise MeasuredDataError(f"no BF16 -> FP8 element-wise kernels for {', '.join(systems)} ({_layout_hint()})")
    return pd.concat([p for p in parts if len(p)], ignore_index=True)


def load_allreduce(gpus="training", allow_sealed: bool = False, root: str | Path | None = None) -> pd.DataFrame:
    """NCCL's measured all-reduces of 2-byte elements (``half``; each GPU's newest NCCL version) of ``gpus`` whose
    catalogue entry has a GPU-to-GPU link (NVLink; the L40S, PCIe only, is skipped): ``device`` (catalogue name),
    ``link_gbs``, ``gpus``, ``bytes`` each GPU contributes, ``latency_ms``."""
    base = data_root(root)
    parts = []
    for s in system_names(gpus, allow_sealed):
        link = devices.get_device(CATALOGUE[s]).link_gbs if s in CATALOGUE else None
        if link is None or not (base / s / "comm" / "nccl").is_dir():
            continue
        _, _, f = kernel_files(base, s, "comm", NCCL_FILE, ("nccl",), "latest")[0]
        d = read_table(f, NCCL_COLUMNS)
        d = d[(d["op_name"] == "all_reduce") & (d["nccl_dtype"] == "half")]
        if len(d) == 0 or not (np.isfinite(lat := d["latency"].to_numpy(float)) & (lat > 0)).all():
            raise MeasuredDataError(f"{f}: no all-reduce rows with a positive finite latency; {REINSTALL}")
        parts.append(pd.DataFrame({"device": CATALOGUE[s], "link_gbs": float(link), "gpus": d["num_gpus"].to_numpy(int),
                                   "bytes": 2.0 * d["message_size"].to_numpy(float), "latency_ms": lat}))
    if not parts:
        raise MeasuredDataError(f"no NCCL all-reduce measurements of an NVLink GPU among {gpus} ({_layout_hint()})")
    return pd.concat(parts, ignore_index=True)


def load_attention(gpus="training", kinds=("prefill", "decode"), frameworks=None, versions="latest",
                   kv_dtypes=("bfloat16",), allow_sealed: bool = False, root: str | Path | None = None,
                   features: bool = True) -> pd.DataFrame:
    """Measured BF16 fused attention (``kinds``: prefill = context, decode = generation) of ``gpus`` as a
    kernel table, op class ATTN (arguments as :func:`load_gemm`; ``kv_dtypes``: KV-cache dtypes kept,
    ``bfloat16`` and/or ``fp8``)."""
    systems = system_names(gpus, allow_sealed)
    if isinstance(kinds, str):
        kinds = (kinds,)
    bad = [k for k in kinds if k not in ATTENTION_FILES]
    if bad:
        raise MeasuredDataError(f"attention kinds must be prefill and/or decode, got {', '.join(map(repr, bad))}")
    base = data_root(root)
    parts = []
    for s in systems:
        for kind in kinds:
            for fw, ver, f in kernel_files(base, s, "attention", ATTENTION_FILES[kind], frameworks, versions):
                raw = read_table(f, ATTENTION_COLUMNS, ATTENTION_OPTIONAL)
                parts.append(validate(attention_kernels(raw, kind, s, fw, ver, kv_dtypes), f, REINSTALL))
    return _finish(parts, "BF16 attention", systems, features)


# ---------------------------------------------------------------- the rows the tensor-core networks train on
#: which of the package's files a GPU's rows come from: GEMM, per GPU the framework with the most BF16
#: rows (ties: this order): torch's cuBLAS linear in vLLM 0.24 on H100/H200/L40S/B200/GB200, SGLang 0.5.10 on
#: A100 SXM (its vLLM 0.14 file has 9,240 shapes, SGLang's 35,742); attention: vLLM's FlashAttention
#: (FA2 on A100 SXM and L40S, FA3 / FA4 on H100 and H200; FlashInfer / TRT-LLM kernels on B200 / GB200)
GEMM_FRAMEWORKS = ("vllm", "sglang", "trtllm")
ATTN_FRAMEWORKS = ("vllm",)


def fp8_systems(gpus) -> list[str]:
    """The systems of ``gpus`` whose catalogue GPU has FP8 tensor cores (A100 SXM has none, nor FP8 rows)."""
    return [s for s in system_names(gpus, False) if devices.get_device(CATALOGUE[s]).has_tensor_peak(Precision.FP8)]


def gemm_rows(gpus, gemm_dtype: str = "bfloat16") -> pd.DataFrame:
    """Measured GEMMs (``gemm_dtype``) of ``gpus`` (names of this module or "training" / "held_out"), one file per
    GPU: the framework with the most BF16 rows (the same file for every precision). Block-scaled rows (``fp8_block``)
    of the GPUs whose file has them (L40S's, SGLang's, has none)."""
    parts = []
    for s in system_names(gpus, False) if gemm_dtype == "bfloat16" else fp8_systems(gpus):
        df = load_gemm(s, frameworks=GEMM_FRAMEWORKS)
        counts = df.groupby("framework").size()
        best = max(GEMM_FRAMEWORKS, key=lambda f: (counts.get(f, 0), -GEMM_FRAMEWORKS.index(f)))
        if gemm_dtype != "bfloat16":
            try:
                df = load_gemm(s, frameworks=(best,), gemm_dtype=gemm_dtype)
            except MeasuredDataError:
                if gemm_dtype != FP8_BLOCK:
                    raise
                continue
        parts.append(df[df["framework"] == best])
    return pd.concat(parts, ignore_index=True)


def attention_rows(gpus, kinds=("prefill", "decode")) -> pd.DataFrame:
    """Measured BF16 fused attention of ``gpus`` from the files ``ATTN_FRAMEWORKS`` names."""
    return load_attention(gpus, kinds=kinds, frameworks=ATTN_FRAMEWORKS)


def training_kernels(networks) -> pd.DataFrame:
    """The training GPUs' measured BF16 kernels of the tensor-core ``networks`` (``GEMM``, ``ATTN_prefill``,
    ``ATTN_decode``: ``tensor_core.NETWORKS``; ``GEMM_fp8``: their measured per-tensor FP8 GEMMs), never a held-out or
    sealed GPU's (``split``): what the trainer hands to those networks' ``fit``."""
    parts = []
    if "GEMM" in networks:
        parts.append(gemm_rows("training"))
    if "GEMM_fp8" in networks:
        parts.append(gemm_rows("training", DB_FP8))
    kinds = [n.split("_")[1] for n in networks if n.startswith("ATTN_")]
    if kinds:
        parts.append(attention_rows("training", tuple(kinds)))
    return pd.concat(parts, ignore_index=True)
