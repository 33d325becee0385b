"""Kernel datasets of the release: training records rebuilt from ``train/collect/``, and the test sets.

The release ships processed training sets only for element-wise ops, softmax and layernorm; BMM and
LINEAR must be rebuilt from the raw per-GPU files ``data/dataset/train/collect/<op>/p2.1.0/<GPU>.csv``.
We rebuild *every* op from the raw files the same way, so all classes share one code path.

Processed frame (:func:`load_collect`), one row per measured kernel:

| column | meaning |
|---|---|
| ``op`` | the release's op name (``bmm``, ``linear``, ``add``, ``addu``, ..., ``softmax``, ``ln``) |
| ``op_class`` | ``BMM``, ``LINEAR``, ``VEC``, ``SOFTMAX``, ``LAYERNORM`` (kernel-table classes) |
| ``sub_op`` | VEC: the op name; else ``""`` |
| ``device`` | catalogue name of the GPU (release file stem, e.g. ``Tesla_V100-PCIE-32GB``) |
| ``latency_ms`` | measured latency of the op (all its kernels), ms |
| ``kernel`` | profiler name of the (first) kernel |
| ``n_kernels`` | kernels the op launched (LINEAR with split-K launches a reduction kernel too) |
| ``grid`` | blocks launched (Grid x * y * z) |
| ``B``, ``M``, ``N``, ``K`` | GEMM dims, [M x N] @ [N x K], N the reduction dim (B = 1 for LINEAR) |
| ``H`` | vector ops: row length (``B`` rows) |
| ``tile_m``, ``tile_k`` | GEMM output tile: from the kernel name (``sgemm_AxB``: A along K, B along M, as the grid shows; ``tilesizeAxB`` / ``_MTAxB``: A along M) |
| ``tile`` | vector ops: elements per tile; element-wise ops ceil(B*H / grid) rounded up to a power of two, softmax/layernorm H (one row per tile) |
| device features | ``num_sm``, ``fp32_gflops``, ``fp32_vec_gflops``, ``mem_bw_gbs``, ``mem_gb``, ``l2_mb`` of the catalogue entry |
| ``conv_cin``, ``conv_cout``, ``conv_k``, ``conv_in``, ``conv_stride``, ``conv_pad``, ``conv_groups`` | CONV rows (:func:`load_conv`): the convolution's parameters; ``M``, ``N``, ``K`` its implicit GEMM (:func:`conv_gemm`) |

:func:`to_kernels` maps any of these frames onto the kernel-table columns of ``trace.trace_model``
(docs/interfaces.md), keeping ``device``, ``latency_ms`` and the tiles, so predictors see the same
columns in training, in the kernel-level evaluation and on traced models.

Convolutions: :func:`load_conv` reads the release's forward FP32 convolution records
(``collect/conv/p2.1.0``; GPUs P4, P100, V100, T4 and A100-80GB PCIe -- not the same five as the other
ops) into the same frame with ``op_class == "CONV"``, ``sub_op == "fwd"``. They are kept out of
:func:`load_collect` (whose frame, cache and quick subset stay as they were) and joined by
:func:`training_data`.
"""
from __future__ import annotations

import functools
import hashlib
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from neusight_core.data import datafile, devices
from neusight_core import paths
from neusight_core.question import schema
from neusight_core.question.schema import OpClass

TRAIN_OPS = ("bmm", "linear", "add", "addu", "mul", "mulu", "div", "divu", "pow", "powu",
             "relu", "gelu", "tanh", "softmax", "ln")
VEC_OPS = TRAIN_OPS[2:13]
UNARY_VEC_OPS = ("addu", "mulu", "divu", "powu", "relu", "gelu", "tanh")
OP_CLASS = {"bmm": OpClass.BMM, "linear": OpClass.LINEAR, "softmax": OpClass.SOFTMAX, "ln": OpClass.LAYERNORM,
            **{op: OpClass.VEC for op in VEC_OPS}}
# FLOPs per output element (SPEC 3.1)
OPS_PER_OUTPUT = {**{op: 1.0 for op in VEC_OPS}, "softmax": 5.0, "ln": 6.0}
ATEN_OP = {OpClass.BMM: "aten.bmm.default", OpClass.LINEAR: "aten.mm.default", OpClass.SOFTMAX: "aten._softmax.default",
           OpClass.LAYERNORM: "aten.native_layer_norm.default"}
VEC_ATEN = {"add": "aten.add.Tensor", "mul": "aten.mul.Tensor", "div": "aten.div.Tensor",
            "pow": "aten.pow.Tensor_Tensor", "addu": "aten.add.Tensor", "mulu": "aten.mul.Tensor",
            "divu": "aten.div.Tensor", "powu": "aten.pow.Tensor_Scalar", "relu": "aten.relu.default",
            "gelu": "aten.gelu.default", "tanh": "aten.tanh.default"}
TEST_FILES = ("bmm", "linear", "vec")        # vec.csv = elem.csv + ln.csv + softmax.csv
DEVICE_FEATURES = ("num_sm", "fp32_gflops", "fp32_vec_gflops", "mem_bw_gbs", "mem_gb", "l2_mb")
CONV_OP = "conv"
# the release's conv columns (``Kernel_Szie`` sic); groups are not recorded: every record is a dense conv
CONV_RAW = {"Input_Channel": "conv_cin", "Output_Channel": "conv_cout", "Kernel_Szie": "conv_k",
            "Input_Size": "conv_in", "Stride": "conv_stride", "Padding": "conv_pad"}
CONV_SUB_OPS = ("fwd", "dgrad", "wgrad")
CONV_ATEN = {"fwd": "aten.convolution.default", "dgrad": "aten.convolution_backward.default",
             "wgrad": "aten.convolution_backward.default"}


class DatasetError(ValueError):
    """A kernel dataset file that is missing or cannot be used (one line naming it)."""


# ---------------------------------------------------------------- reading raw files
def collect_dir() -> Path:
    return paths.data_dir() / "dataset" / "train" / "collect"


def test_dir() -> Path:
    return paths.data_dir() / "dataset" / "test"


def collect_files(ops=TRAIN_OPS) -> list[Path]:
    """The raw per-GPU measurement files of ``ops`` (training GPUs only, by construction of the release)."""
    paths.require_release()
    files = []
    for op in ops:
        d = collect_dir() / op / "p2.1.0"
        found = sorted(d.glob("*.csv"))
        if not found:
            raise DatasetError(f"{d}: no raw kernel measurements for op {op!r}")
        files += found
    return files


def checksum(files) -> str:
    """sha256 over the names and bytes of ``files`` (what a trained predictor's weights came from).
    Memoised per process on each file's path, size and modification time (a prediction asks for it
    to check saved weights; reading the files every time cost seconds)."""
    files = [Path(f) for f in files]
    return _checksum(tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files))


@functools.lru_cache(maxsize=8)
def _checksum(stamps: tuple) -> str:
    # kept with the traces too (same stamps, same answer): hashing every training file cost a new process's first
    # question 0.08 s with the files in the page cache and about 1 s from a cold disk
    from neusight_core.tracing import trace_cache

    def build() -> pd.DataFrame:
        h = hashlib.sha256()
        for f, _, _ in stamps:
            h.update(Path(f).name.encode())
            h.update(Path(f).read_bytes())
        return pd.DataFrame({"sha256": [h.hexdigest()]})
    return str(trace_cache.cached({"kind": "data-checksum", "stamps": [list(x) for x in stamps]}, build)["sha256"].iloc[0])


def training_checksum(quick: bool = False, seed: int = 0, quick_rows: int = 4000) -> str:
    """The ``checksum`` that ``training_data`` with the same arguments carries, without loading the data."""
    digest = checksum(collect_files() + conv_files())
    if quick:
        digest = hashlib.sha256(f"{digest}:quick:{quick_rows}:{seed}".encode()).hexdigest()
    return digest


def _parse_gemm_tiles(kernel: pd.Series) -> pd.DataFrame:
    """(tile_m, tile_k) of GEMM kernels from their names.

    cuBLAS ``*sgemm_AxB*`` (maxwell/volta/ampere/cutlass): A tiles the output's K side, B its M side
    (checked against the launch grid on the training data: ceil(K/A) * ceil(M/B) = grid x * grid y in
    every maxwell/volta/ampere record); ``tilesizeAxB`` (sm80 xmma) and AMD ``_MTAxB`` are M-first.
    """
    k = kernel.str.lower()
    sg = k.str.extract(r"sgemm_(\d+)x(\d+)").astype(float)
    ts = k.str.extract(r"(?:tilesize|_mt)(\d+)x(\d+)").astype(float)
    tile_m = sg[1].fillna(ts[0])
    tile_k = sg[0].fillna(ts[1])
    return pd.DataFrame({"tile_m": tile_m, "tile_k": tile_k})


def _device_name(display: str) -> str:
    return devices.get_device(display).name


def process(raw: pd.DataFrame, source: str = "") -> pd.DataFrame:
    """Turn release-format kernel rows (raw collect or test files) into the processed frame."""
    need = {"OPName", "Latency", "Device", "Kernel Name", "Grid x", "Grid y", "Grid z", "B"}
    missing = need - set(raw.columns)
    if missing:
        raise DatasetError(f"{source}: missing column(s) {', '.join(sorted(missing))}")
    unknown = set(raw["OPName"]) - set(OP_CLASS)
    if unknown:
        raise DatasetError(f"{source}: unknown op(s) {', '.join(sorted(unknown))}")
    out = pd.DataFrame({
        "op": raw["OPName"].astype(str),
        "op_class": raw["OPName"].map(OP_CLASS),
        "sub_op": np.where(raw["OPName"].isin(VEC_OPS), raw["OPName"], ""),
        "device": raw["Device"].map({d: _device_name(d) for d in raw["Device"].unique()}),
        "latency_ms": raw["Latency"].astype(float),
        "kernel": raw["Kernel Name"].astype(str),
        "n_kernels": (raw["Kernels"].astype(str).str.count(";") if "Kernels" in raw else 1),
        "grid": (raw["Grid x"] * raw["Grid y"] * raw["Grid z"]).astype(float),
    })
    for c in ("B", "M", "N", "K", "H"):
        out[c] = raw[c].astype(float) if c in raw else np.nan
    gemm = out["op_class"].isin(schema.GEMM_CLASSES)
    tiles = _parse_gemm_tiles(out["kernel"])
    out["tile_m"] = np.where(gemm, tiles["tile_m"], np.nan)
    out["tile_k"] = np.where(gemm, tiles["tile_k"], np.nan)
    if (gemm & out["tile_m"].isna()).any():
        bad = out.loc[gemm & out["tile_m"].isna(), "kernel"].iloc[0]
        raise DatasetError(f"{source}: cannot read a GEMM tile from kernel name {bad!r}")
    elem = out["B"] * out["H"]
    per_block = np.ceil(elem / out["grid"].clip(lower=1))
    vec_tile = 2.0 ** np.ceil(np.log2(per_block.clip(lower=1)))
    row_op = out["op"].isin(["softmax", "ln"])
    out["tile"] = np.where(row_op, out["H"], np.where(gemm, np.nan, vec_tile))
    return join_device_features(out)


def join_device_features(df: pd.DataFrame) -> pd.DataFrame:
    """Add the catalogue's numbers of each row's ``device`` (DEVICE_FEATURES columns)."""
    feats = {n: devices.get_device(n) for n in df["device"].unique()}
    for c in DEVICE_FEATURES:
        df[c] = df["device"].map({n: float(getattr(d, c)) for n, d in feats.items()})
    return df


def _read_csv(f: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(f)
    except (OSError, pd.errors.ParserError, UnicodeDecodeError) as e:
        raise DatasetError(f"{f}: cannot read ({str(e).splitlines()[0]})") from None


def _cache_path(kind: str, digest: str) -> Path:
    return paths.trained_dir() / "datasets" / f"{kind}_{digest[:16]}.npz"


def load_collect(ops=TRAIN_OPS, cache: bool = True) -> pd.DataFrame:
    """Processed training records of the 5 training GPUs for ``ops`` (cached by data checksum).

    The cache, ``trained_dir()/datasets/collect_<checksum[:16]>.npz``, is data-only
    (``datafile.write_frame``: no pickle, a SHA-256 of the content, the raw files' checksum as its
    meta); one that cannot be read, was changed or belongs to other raw files is ignored with one
    warning line and rebuilt. Caches of earlier versions (``collect_*.pkl``) are never read."""
    files = collect_files(ops)
    digest = checksum(files)
    cp = _cache_path("collect", digest)
    if cache and cp.is_file():
        try:
            df, meta = datafile.read_frame(cp)
            if meta != {"checksum": digest}:
                raise datafile.DataFileError("made from other raw files")
            return df
        except datafile.DataFileError as e:
            warnings.warn(f"dataset cache: ignoring damaged {cp.name} ({e}); rebuilding it", datafile.CacheWarning,
                          stacklevel=2)
    parts = [process(_read_csv(f), str(f)) for f in files]
    df = pd.concat(parts, ignore_index=True)
    train_names = {d.name for d in devices.training_devices("NVIDIA")}
    if not set(df["device"]) <= train_names:
        raise DatasetError(f"{collect_dir()}: records of non-training GPUs {set(df['device']) - train_names}")
    if cache:
        datafile.write_frame(cp, df, meta={"checksum": digest})
    return df


# ---------------------------------------------------------------- convolutions
def conv_files() -> list[Path]:
    """The release's raw forward-convolution records, one file per GPU (P4, P100, V100, T4, A100-80GB PCIe)."""
    return collect_files((CONV_OP,))


def conv_out(size, k, stride, pad):
    """Output height (= width) of a square convolution: floor((in + 2 pad - k) / stride) + 1."""
    return np.floor((np.asarray(size, float) + 2 * np.asarray(pad, float) - k) / stride) + 1


def conv_gemm(B, cin, cout, k, size, stride, pad, groups, sub_op, elem_bytes=4.0) -> dict:
    """The implicit GEMM of a convolution kernel in the release convention ([M x N] @ [N x K], N the
    reduction; docs/interfaces.md "CONV rows"), its FLOPs (2 M N K) and its bytes, each tensor moved once:
    fwd reads input + weight and writes the output (M = B out^2, N = cin k^2 / groups, K = cout); dgrad reads
    grad-output + weight and writes grad-input (M = B in^2, N = cout k^2 / groups, K = cin); wgrad reads
    grad-output + input and writes grad-weight (M = cout, N = B out^2, K = cin k^2 / groups).
    Every argument may be an array (one value per row); returns arrays M, N, K, flops, bytes_read,
    bytes_written, out."""
    B, cin, cout, k, size, groups = (np.asarray(x, float) for x in (B, cin, cout, k, size, groups))
    sub = np.asarray(sub_op, dtype=object)
    bad = ~np.isin(sub, CONV_SUB_OPS)
    if bad.any():
        raise DatasetError(f"conv sub_op must be one of {', '.join(CONV_SUB_OPS)}, not {sub[bad][0]!r}")
    out = conv_out(size, k, stride, pad)
    if (out < 1).any() or (np.stack([B, cin, cout, k, size, groups]) < 1).any():
        raise DatasetError("conv parameters must be >= 1 and give an output of at least one pixel")
    x_elems, w_elems, y_elems = B * cin * size ** 2, cout * cin / groups * k ** 2, B * cout * out ** 2
    fwd, dgrad = sub == "fwd", sub == "dgrad"
    M = np.where(fwd, B * out ** 2, np.where(dgrad, B * size ** 2, cout))
    N = np.where(fwd, cin * k ** 2 / groups, np.where(dgrad, cout * k ** 2 / groups, B * out ** 2))
    K = np.where(fwd, cout, np.where(dgrad, cin, cin * k ** 2 / groups))
    rd = np.where(fwd, x_elems + w_elems, np.where(dgrad, y_elems + w_elems, y_elems + x_elems))
    wr = np.where(fwd, y_elems, np.where(dgrad, x_elems, w_elems))
    return {"M": M, "N": N, "K": K, "flops": 2.0 * M * N * K, "bytes_read": elem_bytes * rd,
            "bytes_written": elem_bytes * wr, "out": out}


def process_conv(raw: pd.DataFrame, source: str = "") -> pd.DataFrame:
    """Release-format convolution records (``OPName == "conv"``) as the processed frame: ``op_class``
    CONV, ``sub_op`` fwd (the release measures forward convolutions only), the conv parameters and their
    implicit-GEMM M, N, K. No tile: the kernels are cuDNN's (implicit GEMM, Winograd, FFT) and their
    names' ``AxB`` do not describe an implicit-GEMM tiling (the recipe's ``conv_tile``, predictors/neusight.py)."""
    need = {"OPName", "Latency", "Device", "Kernel Name", "Grid x", "Grid y", "Grid z", "B", *CONV_RAW}
    missing = need - set(raw.columns)
    if missing:
        raise DatasetError(f"{source}: missing column(s) {', '.join(sorted(missing))}")
    if set(raw["OPName"]) != {CONV_OP}:
        raise DatasetError(f"{source}: not convolution records (ops {', '.join(sorted(map(str, set(raw['OPName']))))})")
    out = pd.DataFrame({
        "op": CONV_OP, "op_class": OpClass.CONV, "sub_op": "fwd",
        "device": raw["Device"].map({d: _device_name(d) for d in raw["Device"].unique()}),
        "latency_ms": raw["Latency"].astype(float),
        "kernel": raw["Kernel Name"].astype(str),
        "n_kernels": (raw["Kernels"].astype(str).str.count(";") if "Kernels" in raw else 1),
        "grid": (raw["Grid x"] * raw["Grid y"] * raw["Grid z"]).astype(float),
        "B": raw["B"].astype(float),
    })
    for src, col in CONV_RAW.items():
        out[col] = raw[src].astype(float)
    out["conv_groups"] = 1.0
    g = conv_gemm(out["B"], out["conv_cin"], out["conv_cout"], out["conv_k"], out["conv_in"], out["conv_stride"],
                  out["conv_pad"], out["conv_groups"], np.full(len(out), "fwd", dtype=object))
    out["M"], out["N"], out["K"], out["H"] = g["M"], g["N"], g["K"], np.nan
    out["tile_m"] = out["tile_k"] = out["tile"] = np.nan
    return join_device_features(out)


def load_conv() -> pd.DataFrame:
    """The release's convolution records of every GPU that has them, processed (:func:`process_conv`)."""
    cols = ["OPName", "Latency", "Device", "Kernel Name", "Kernels", "Grid x", "Grid y", "Grid z", "B", *CONV_RAW]
    parts = []
    for f in conv_files():
        try:
            raw = pd.read_csv(f, usecols=lambda c: c in cols)
        except (OSError, pd.errors.ParserError, UnicodeDecodeError, ValueError) as e:
            raise DatasetError(f"{f}: cannot read ({str(e).splitlines()[0]})") from None
        parts.append(process_conv(raw, str(f)))
    return pd.concat(parts, ignore_index=True)


def load_test(files=TEST_FILES) -> pd.DataFrame:
    """The release's kernel-level test sets (all NVIDIA GPUs, transformer-derived shapes), processed."""
    paths.require_release()
    parts = []
    for name in files:
        f = test_dir() / f"{name}.csv"
        if not f.is_file():
            raise DatasetError(f"{f}: test set missing")
        parts.append(process(_read_csv(f), str(f)))
    return pd.concat(parts, ignore_index=True)


# ---------------------------------------------------------------- kernel-table view
def to_kernels(df: pd.DataFrame) -> pd.DataFrame:
    """Map processed dataset rows onto the kernel-table columns of ``trace.trace_model``.

    FLOPs and bytes follow SPEC 3.1: GEMM 2BMNK FLOPs, A and B read once and C written once (FP32);
    element-wise ops 1 FLOP per output, 1 (scalar/unary) or 2 (binary) inputs read, the output written;
    softmax 5 and layernorm 6 FLOPs per output, the input read and the output written (layernorm also
    reads its weight and bias); convolutions (CONV) as :func:`conv_gemm`. Extra columns kept: ``device``,
    ``latency_ms``, ``op``, ``tile_m``, ``tile_k``, ``tile`` and the ``conv_*`` parameters.
    """
    cls = df["op_class"]
    gemm = cls.isin(schema.GEMM_CLASSES).to_numpy()
    B, M, N, K, H = (df[c].to_numpy(float) for c in ("B", "M", "N", "K", "H"))
    with np.errstate(invalid="ignore"):
        elem = B * H
        opo = df["op"].map(OPS_PER_OUTPUT).fillna(0).to_numpy(float)
        n_in = np.where(df["op"].isin(UNARY_VEC_OPS + ("softmax", "ln")), 1.0, 2.0)
        flops = np.where(gemm, 2.0 * B * M * N * K, opo * elem)
        rd = np.where(gemm, 4.0 * B * (M * N + N * K), 4.0 * n_in * elem
                      + np.where(df["op"].eq("ln"), 8.0 * H, 0.0))
        wr = np.where(gemm, 4.0 * B * M * K, 4.0 * elem)
    # convolutions: their implicit GEMM (M, N, K already include the batch) and each tensor moved once
    conv = cls.eq(OpClass.CONV).to_numpy()
    aten = np.where(cls.eq(OpClass.VEC), df["sub_op"].map(VEC_ATEN), cls.map(ATEN_OP))
    if conv.any():
        c = df[conv]
        g = conv_gemm(c["B"], c["conv_cin"], c["conv_cout"], c["conv_k"], c["conv_in"], c["conv_stride"],
                      c["conv_pad"], c["conv_groups"], c["sub_op"].to_numpy(object))
        M, N, K = M.copy(), N.copy(), K.copy()
        for arr, key in ((M, "M"), (N, "N"), (K, "K"), (flops, "flops"), (rd, "bytes_read"), (wr, "bytes_written")):
            arr[conv] = g[key]
        aten = np.where(conv, df["sub_op"].map(CONV_ATEN), aten)
        gemm = gemm | conv
    out = pd.DataFrame({
        "phase": "fw",
        "aten_op": aten,
        "op_class": cls.to_numpy(),
        "sub_op": df["sub_op"].to_numpy(),
        "B": B, "M": np.where(gemm, M, np.nan), "N": np.where(gemm, N, np.nan),
        "K": np.where(gemm, K, np.nan), "H": np.where(gemm, np.nan, H),
        "flops": flops, "bytes_read": rd, "bytes_written": wr, "dtype": "float32", "module": "",
        "layer": -1, "count": 1, "comm_kind": "", "comm_bytes": 0.0, "overlap": False, "stage": 0,
    }, index=df.index)
    for c in ("device", "latency_ms", "op", "tile_m", "tile_k", "tile", *schema.CONV_COLUMNS):
        if c in df:
            out[c] = df[c].to_numpy()
    return out


# ---------------------------------------------------------------- training data bundle
@dataclass
class TrainingData:
    """What a predictor's ``fit`` receives: training-GPU kernels as a kernel table plus provenance."""
    kernels: pd.DataFrame        # to_kernels(load_collect()) with device, latency_ms and tiles
    checksum: str                # sha256 of the raw files it came from
    devices: tuple               # catalogue names of the training GPUs
    quick_rows: int | None = None  # records per class of the quick subset (None: all records)
    # what a predictor's ``data_wanted`` asked for, read by the trainer (``training.data_for``); None: not asked
    measured: pd.DataFrame | None = None   # NVIDIA's measured kernels of the training GPUs (measured_kernels)
    seen_test: pd.DataFrame | None = None  # the training GPUs' rows of the release's test sets (seen_test_kernels)

    def of_class(self, *classes) -> pd.DataFrame:
        return self.kernels[self.kernels["op_class"].isin(classes)]


def training_data(quick: bool = False, seed: int = 0, quick_rows: int = 4000) -> TrainingData:
    """All training records (or, with ``quick``, a fixed random subset per op class for CI), the
    convolution records (:func:`load_conv`) after the others."""
    df = load_collect()
    # the training GPUs' convolutions only: the release measured them also on the A100-80GB, an unseen GPU
    # (its records are the held-out GPU of kernel_eval.conv_logo, never training data of a predictor)
    conv = load_conv()
    conv = conv[conv["device"].isin(set(df["device"]))]
    digest = training_checksum(quick, seed, quick_rows)
    if quick:
        rng = np.random.default_rng(seed)
        keep = [rng.choice(idx, size=min(len(idx), quick_rows), replace=False)
                for _, idx in sorted(df.groupby("op_class").indices.items())]
        df = df.iloc[np.sort(np.concatenate(keep))]
        conv = quick_conv(conv, seed, quick_rows)
    # the convolutions after every other record: the other classes keep their row order
    k = to_kernels(pd.concat([df, conv], ignore_index=True))
    return TrainingData(k, digest, tuple(sorted(k["device"].unique())), quick_rows if quick else None)


def quick_conv(conv: pd.DataFrame, seed: int = 0, quick_rows: int = 4000) -> pd.DataFrame:
    """The quick subset of convolution records: drawn from a random stream of its own, so that the other
    classes' quick subsets (and every quick predictor of those classes) are those drawn before CONV existed."""
    rng = np.random.default_rng([seed, 26])
    return conv.iloc[np.sort(rng.choice(len(conv), size=min(len(conv), quick_rows), replace=False))]


def describe_columns() -> str:
    """The processed-frame column documentation (module docstring table) for notebooks."""
    doc = __doc__ or ""
    start = doc.find("| column")
    end = doc.find("\n\n", start)
    return doc[start:end]


def test_kernels() -> pd.DataFrame:
    """The test sets as a kernel table with ``device``, ``latency_ms`` and ``seen`` (training GPU)."""
    k = to_kernels(load_test())
    train = {d.name for d in devices.training_devices("NVIDIA")}
    k["seen"] = k["device"].isin(train)
    return k


def shape_key(kernels: pd.DataFrame) -> pd.Series:
    """One string per kernel shape (op, B, M, N, K, H), the same on every GPU: the test sets measure the
    same transformer-derived shapes on each GPU, so a split by this key holds a shape out everywhere."""
    cols = [kernels[c].fillna(-1).astype(np.int64).astype(str) for c in ("B", "M", "N", "K", "H")]
    key = kernels["op"].astype(str)
    for c in cols:
        key = key + ":" + c
    return key


def held_out_shapes(kernels: pd.DataFrame, fraction: float, seed: int = 0) -> np.ndarray:
    """Boolean mask: the rows whose shape falls in a fixed random ``fraction`` of the distinct shapes."""
    keys = shape_key(kernels)
    distinct = np.sort(keys.unique())
    rng = np.random.default_rng(seed)
    out = set(distinct[rng.random(len(distinct)) < fraction])
    return keys.isin(out).to_numpy()


def seen_test_kernels(holdout: float = 0.0, holdout_seed: int = 0, part: str = "train") -> pd.DataFrame:
    """The training GPUs' rows of the kernel test sets (transformer-derived, aligned shapes) as a kernel
    table: extra training data of our recipe (``extra_training: seen_test``). With ``holdout`` > 0 a fixed
    share of the distinct shapes is held out (on every GPU): ``part="train"`` gives the rest, ``"held_out"``
    those shapes (the validation of recipes.md, ``recipe_studies.shape_holdout_check``). Never the unseen GPUs."""
    k = test_kernels()
    k = k[k["seen"]].reset_index(drop=True)
    if holdout > 0:
        out = held_out_shapes(k, holdout, holdout_seed)
        k = k[out if part == "held_out" else ~out].reset_index(drop=True)
    return k.drop(columns=["seen"])


def dataset_summary(df: pd.DataFrame) -> pd.DataFrame:
    """Rows per op class and GPU (for notebooks)."""
    return df.pivot_table(index="op_class", columns="device", values="latency_ms", aggfunc="size", fill_value=0)


__all__ = ["load_collect", "load_conv", "conv_gemm", "conv_out", "process_conv", "conv_files", "load_test", "to_kernels", "training_data", "test_kernels", "TrainingData",
           "seen_test_kernels", "held_out_shapes", "shape_key",
           "DatasetError", "process", "checksum", "describe_columns"]
