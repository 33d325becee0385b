"""GPU catalogue: the release's device JSONs, our spec-sheet additions and user-added GPUs.

Three sources, merged in this order (a later one may not redefine an earlier name):

1. the release's ``data/device_configs/*.json``, read at run time from the provisioned release and
   never copied (the predictors learn on exactly those numbers); ``devices.yaml`` only adds their
   aliases, link bandwidth and training flag;
2. ``devices.yaml`` ``spec_sheet:`` -- newer GPUs described from NVIDIA spec sheets (extension, with
   the source of every number);
3. user files: every ``*.json`` / ``*.yaml`` / ``*.yml`` in ``<NEUSIGHT_HOME>/user_devices/`` and in the
   files or folders listed in the environment variable ``NEUSIGHT_DEVICES`` (separated by ``os.pathsep``).
   A user file is either a release-style JSON (``{"Device": ..., "Dev_Mem": ..., ...}``, the name is the
   file stem) or a mapping ``{name: {mem_gb, mem_bw_gbs, num_sm, fp32_gflops, l2_mb, ...}}`` (``display_name``,
   what torch reports, defaults to the name with spaces)
   (optionally under a top-level ``devices:`` key); a release-style JSON may add ``link_gbs``,
   ``tensor_gflops`` and ``tensor_source`` as in ``devices.yaml``. Every numeric field must be a finite,
   positive number (not ``true``/``false``, not ``.inf``/``.nan``), counts (SMs, cores per SM) whole
   numbers; ``tensor_gflops`` maps only ``tf32``/``fp16``/``bf16``/``fp8``. Files must be UTF-8 and regular files
   (a FIFO or folder named ``*.yaml`` is refused without being read). A malformed file raises
   :class:`DeviceFileError` with one line naming the file and the problem.

Lookup (:func:`get_device`) accepts the canonical name (release file stem), the display name that
``torch.cuda.get_device_name`` reports, or an alias, ignoring case, spaces, ``-`` and ``_``.
"""
from __future__ import annotations

import difflib
import functools
import json
import math
import os
import re
from dataclasses import dataclass, asdict, field
from pathlib import Path

import pandas as pd
import yaml

from neusight_core import paths
from neusight_core.question import schema
from neusight_core.question.schema import Precision

CATALOGUE_YAML = Path(__file__).with_name("devices.yaml")
ENV_USER_DEVICES = "NEUSIGHT_DEVICES"
USER_DEVICE_SUFFIXES = (".json", ".yaml", ".yml")


class UnknownDeviceError(LookupError):
    """A GPU name that is not in the catalogue; the message lists the closest known names."""


class DeviceFileError(ValueError):
    """A device description file that cannot be used; the message is one line naming file and problem."""


@dataclass(frozen=True)
class Device:
    name: str            # canonical id = release file stem, e.g. "NVIDIA_H100_80GB_HBM3"
    display_name: str    # what torch.cuda.get_device_name reports, e.g. "NVIDIA H100 80GB HBM3"
    vendor: str          # "NVIDIA" | "AMD"
    mem_gb: float        # Dev_Mem
    mem_bw_gbs: float    # Mem_Bw, GB/s
    num_sm: int          # Num_Sm (CUs on AMD)
    core_per_sm: int
    freq_mhz: float
    fp32_gflops: float   # SingleFLOPs; AMD: SingleFLOPsMM (GEMM peak)
    fp32_vec_gflops: float  # SingleFLOPs; AMD: SingleFLOPsVEC
    l2_mb: float
    link_gbs: float | None  # NVLink/xGMI peak per GPU, GB/s, None if unknown / no such link
    training: bool       # one of the five NVIDIA training GPUs (or MI100/MI210 for AMD)
    source: str          # where the numbers come from
    # Dense (no sparsity) tensor-core / matrix-core GEMM peaks, GFLOPS, None when the GPU has no such
    # unit for that precision (its GEMMs then run at the FP32 peak). Source in ``tensor_source``.
    tf32_tensor_gflops: float | None = None
    fp16_tensor_gflops: float | None = None
    bf16_tensor_gflops: float | None = None
    fp8_tensor_gflops: float | None = None     # FP8 (E4M3) with FP32 accumulate: Ada, Hopper, Blackwell only
    tensor_source: str = ""
    # one of the paper's unseen (out-of-distribution) GPUs with labels: H100, L4, A100-80GB, MI250 (devices.yaml)
    unseen: bool = False
    # the most GPUs its link joins: 2 for an NVLink bridge (PCIe cards); None when a switch or fabric joins a server's
    # GPUs. A tensor-parallel split over more GPUs has no link to run at ``link_gbs``.
    link_gpus: int | None = None
    # the file this entry was read from (a range error at use names it: scenario.check_device)
    origin: str = ""

    def has_tensor_peak(self, precision: str) -> bool:
        """Whether the catalogue gives this GPU a dense tensor-core (AMD: matrix-core) GEMM peak for
        ``precision`` (fp32 | tf32 | fp16 | bf16 | fp8); never for fp32 (the paper's setting, TF32 off)."""
        if precision not in schema.PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(schema.PRECISIONS)}, got {precision!r}")
        return precision != Precision.FP32 and bool(getattr(self, f"{precision}_tensor_gflops", None))

    def gemm_peak_gflops(self, precision: str = Precision.FP32) -> float:
        """GEMM peak of ``precision`` (fp32 | tf32 | fp16 | bf16 | fp8): the dense tensor-core peak when the
        GPU has one for it (:meth:`has_tensor_peak`), else the FP32 (non-tensor) peak."""
        if self.has_tensor_peak(precision):
            return float(getattr(self, f"{precision}_tensor_gflops"))
        return float(self.fp32_gflops)

    def precision_note(self, precision: str) -> str:
        """One sentence when ``precision`` (not fp32) has no tensor-core peak here, so that its GEMMs are
        predicted at the FP32 peak (e.g. bf16 on a P100); "" otherwise."""
        if precision == Precision.FP32 or self.has_tensor_peak(precision):
            return ""
        return (f"{self.name} has no {precision} tensor cores in the catalogue: {precision} GEMMs use its "
                f"FP32 peak ({self.fp32_gflops:,.0f} GFLOPS)")


TENSOR_FIELDS = tuple(f"{p}_tensor_gflops" for p in schema.TENSOR_PRECISIONS)


def _tensor_fields(path, name: str, d: dict) -> dict:
    """``tensor_gflops: {tf32, fp16, bf16}`` + ``tensor_source`` of a catalogue/user entry -> Device kwargs."""
    t = d.get("tensor_gflops")
    t = {} if t is None else t
    if not isinstance(t, dict) or set(t) - set(schema.TENSOR_PRECISIONS):
        got = ", ".join(map(repr, set(t) - set(schema.TENSOR_PRECISIONS))) if isinstance(t, dict) else repr(t)
        raise DeviceFileError(f"{path}: tensor_gflops of {name!r} must map {'/'.join(schema.TENSOR_PRECISIONS)} to dense GFLOPS, got {got}")
    out = {f"{k}_tensor_gflops": _num(path, f"tensor_gflops.{k}", v) for k, v in t.items() if v is not None}
    if out and not d.get("tensor_source"):
        raise DeviceFileError(f"{path}: tensor_gflops of {name!r} needs a tensor_source (e.g. the vendor datasheet)")
    out["tensor_source"] = " ".join(str(d.get("tensor_source", "")).split())
    return out


@dataclass
class _Catalogue:
    devices: dict = field(default_factory=dict)      # name -> Device
    aliases: dict = field(default_factory=dict)      # normalised key -> name
    variants: set = field(default_factory=set)       # names never chosen from device properties
    release_found: bool = True


def normalise_name(s: str) -> str:
    """Lookup key: case, spaces, '-' and '_' do not matter."""
    return re.sub(r"[\s\-_]+", "", str(s)).lower()


# ---------------------------------------------------------------- reading the sources
_RELEASE_KEYS = ("Device", "Dev_Mem", "Mem_Bw", "Num_Sm", "Core_Per_SM", "Freq", "L2Cache")


def _num(path, key, value, kind=float):
    """A finite, positive number (``kind=int``: a whole one) of field ``key``; else one line naming file and field.
    Booleans are refused (YAML ``true`` is not 1 SM); numeric strings ("1e3", which YAML 1.1 reads as a string)
    are accepted."""
    if isinstance(value, bool):
        raise DeviceFileError(f"{path}: field {key!r} must be a number, not true/false, got {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError, OverflowError):
        raise DeviceFileError(f"{path}: field {key!r} must be a number, got {value!r}") from None
    if not math.isfinite(v):
        raise DeviceFileError(f"{path}: field {key!r} must be a finite number, got {value!r}")
    if kind is int and not v.is_integer():
        raise DeviceFileError(f"{path}: field {key!r} must be a whole number, got {value!r}")
    if not v > 0:
        raise DeviceFileError(f"{path}: field {key!r} must be positive, got {value!r}")
    return int(v) if kind is int else v


def _from_release_json(path: Path, d: dict, name: str, extra: dict, source: str) -> Device:
    """A release-format GPU description (the authors' device_configs/*.json)."""
    missing = [k for k in _RELEASE_KEYS if k not in d]
    if "SingleFLOPs" not in d and not ("SingleFLOPsMM" in d and "SingleFLOPsVEC" in d):
        missing.append("SingleFLOPs (or SingleFLOPsMM + SingleFLOPsVEC)")
    if missing:
        raise DeviceFileError(f"{path}: missing field(s) {', '.join(missing)}")
    mm = d.get("SingleFLOPsMM", d.get("SingleFLOPs"))
    vec = d.get("SingleFLOPsVEC", d.get("SingleFLOPs"))
    display = str(d["Device"])
    vendor = "AMD" if display.upper().startswith("AMD") else "NVIDIA"
    link = extra.get("link_gbs")
    return Device(
        name=name, display_name=display, vendor=vendor,
        mem_gb=_num(path, "Dev_Mem", d["Dev_Mem"]), mem_bw_gbs=_num(path, "Mem_Bw", d["Mem_Bw"]),
        num_sm=_num(path, "Num_Sm", d["Num_Sm"], int), core_per_sm=_num(path, "Core_Per_SM", d["Core_Per_SM"], int),
        freq_mhz=_num(path, "Freq", d["Freq"]), fp32_gflops=_num(path, "SingleFLOPs", mm),
        fp32_vec_gflops=_num(path, "SingleFLOPsVEC", vec), l2_mb=_num(path, "L2Cache", d["L2Cache"]),
        link_gbs=None if link is None else _num(path, "link_gbs", link),
        link_gpus=None if extra.get("link_gpus") is None else _num(path, "link_gpus", extra["link_gpus"], int),
        training=bool(extra.get("training", False)), unseen=bool(extra.get("unseen", False)),
        source=source + (f"; link: {extra['link_source']}" if extra.get("link_source") else ""),
        origin=str(path), **_tensor_fields(path, name, extra),
    )


_OWN_REQUIRED = ("mem_gb", "mem_bw_gbs", "num_sm", "fp32_gflops", "l2_mb")


def _from_own_format(path, name: str, d: dict, default_source: str, training_allowed: bool) -> Device:
    """Our field names (devices.yaml spec_sheet entries and user YAML/JSON files)."""
    if not isinstance(d, dict):
        raise DeviceFileError(f"{path}: entry {name!r} must be a mapping of fields, got {type(d).__name__}")
    missing = [k for k in _OWN_REQUIRED if k not in d]
    if missing:
        raise DeviceFileError(f"{path}: device {name!r} is missing field(s) {', '.join(missing)}")
    num_sm = _num(path, "num_sm", d["num_sm"], int)
    fp32 = _num(path, "fp32_gflops", d["fp32_gflops"])
    core = _num(path, "core_per_sm", d.get("core_per_sm", 128), int)
    # FP32 peak = 2 FLOPs (FMA) x cores x clock: derive the clock when a user gives only the peak
    freq = _num(path, "freq_mhz", d["freq_mhz"]) if "freq_mhz" in d else fp32 * 1e3 / (2 * num_sm * core)
    link = d.get("link_gbs")
    vendor = str(d.get("vendor", "NVIDIA"))
    if vendor not in ("NVIDIA", "AMD"):
        raise DeviceFileError(f"{path}: device {name!r} vendor must be NVIDIA or AMD, got {vendor!r}")
    return Device(
        # the name torch reports matches a device to the local GPU; without one, the entry's name with spaces
        name=str(name), display_name=str(d.get("display_name") or str(name).replace("_", " ")), vendor=vendor,
        mem_gb=_num(path, "mem_gb", d["mem_gb"]), mem_bw_gbs=_num(path, "mem_bw_gbs", d["mem_bw_gbs"]),
        num_sm=num_sm, core_per_sm=core, freq_mhz=float(freq), fp32_gflops=fp32,
        fp32_vec_gflops=_num(path, "fp32_vec_gflops", d.get("fp32_vec_gflops", fp32)),
        l2_mb=_num(path, "l2_mb", d["l2_mb"]),
        link_gbs=None if link is None else _num(path, "link_gbs", link),
        link_gpus=None if d.get("link_gpus") is None else _num(path, "link_gpus", d["link_gpus"], int),
        training=bool(d.get("training", False)) and training_allowed,
        source=" ".join(str(d.get("source", default_source)).split()),
        origin=str(path), **_tensor_fields(path, name, d),
    )


def _check_regular(path: Path) -> None:
    """Device files must be regular files; a FIFO is refused without being opened (reading it would block)."""
    why = paths.not_a_regular_file(path)
    if why:
        raise DeviceFileError(f"{path}: {why}" + (" (device files must be regular files)" if why.startswith("is ") else ""))


def _read_structured(path: Path):
    _check_regular(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise DeviceFileError(f"{path}: cannot read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise DeviceFileError(f"{path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})") from None
    try:
        if path.suffix == ".json":
            return json.loads(text)
        return paths.load_yaml(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DeviceFileError(f"{path}: not valid {path.suffix[1:].upper()} ({first})") from None


def _aliases(path, name, value) -> list:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(a, str) for a in value):
        return value
    raise DeviceFileError(f"{path}: aliases of {name!r} must be a string or a list of strings")


def load_user_file(path: str | Path) -> list[tuple[Device, list]]:
    """Parse one user device file into (Device, aliases) pairs; malformed -> DeviceFileError (one line)."""
    path = Path(path)
    if path.suffix not in USER_DEVICE_SUFFIXES:
        raise DeviceFileError(f"{path}: device files must end in .json, .yaml or .yml")
    data = _read_structured(path)
    src = f"user file {path}"
    if isinstance(data, dict) and "Device" in data:
        extra = {k: data[k] for k in ("link_gbs", "link_gpus", "link_source", "tensor_gflops", "tensor_source")
                 if k in data}
        dev = _from_release_json(path, data, path.stem, {**extra, "training": False}, src)
        return [(dev, _aliases(path, path.stem, data.get("aliases")))]
    if isinstance(data, dict) and set(data) == {"devices"}:
        data = data["devices"]
    if not isinstance(data, dict) or not data:
        raise DeviceFileError(f"{path}: expected a mapping of device name -> fields "
                              "(or a release-style JSON with a 'Device' field)")
    out = []
    for name, fields in data.items():
        # user GPUs are never training GPUs: the training set is the release's five GPUs
        dev = _from_own_format(path, str(name), fields, src, training_allowed=False)
        out.append((dev, _aliases(path, name, fields.get("aliases"))))
    return out


def user_device_files() -> list[Path]:
    """Files to read user GPUs from: <home>/user_devices/ and $NEUSIGHT_DEVICES (files or folders)."""
    places = [paths.home() / "user_devices"]
    env = os.environ.get(ENV_USER_DEVICES, "")
    places += [Path(p) for p in env.split(os.pathsep) if p.strip()]
    files = []
    for p in places:
        if p.is_dir():
            files += sorted(f for f in p.iterdir() if f.suffix in USER_DEVICE_SUFFIXES)
        elif p.exists():
            files.append(p)
        elif p != places[0]:
            raise DeviceFileError(f"{p}: listed in ${ENV_USER_DEVICES} but does not exist")
    return files


_CACHE: dict = {}


def _cache_key():
    files = user_device_files()
    stamp = []
    for f in files:
        try:
            stamp.append((str(f), f.stat().st_mtime_ns))
        except OSError:                    # e.g. a dangling link: load_user_file says so, naming it
            stamp.append((str(f), None))
    stamp = tuple(stamp)
    return (str(paths.device_configs_dir()), stamp)


def _catalogue() -> _Catalogue:
    key = _cache_key()
    if key not in _CACHE:
        _CACHE.clear()
        _CACHE[key] = _build()
    return _CACHE[key]


def reload() -> None:
    """Forget the cached catalogue (after editing a device file in the same process)."""
    _CACHE.clear()


def _build() -> _Catalogue:
    cfg = paths.load_yaml(CATALOGUE_YAML.read_text())
    cat = _Catalogue()

    def add(dev: Device, aliases, origin):
        if dev.name in cat.devices:
            raise DeviceFileError(f"{origin}: device {dev.name!r} is already defined in the catalogue")
        cat.devices[dev.name] = dev
        for key in [dev.name, *aliases]:
            k = normalise_name(key)
            if k in cat.aliases and cat.aliases[k] != dev.name:
                raise DeviceFileError(f"{origin}: name or alias {key!r} already refers to {cat.aliases[k]!r}")
            cat.aliases[k] = dev.name

    rel = paths.device_configs_dir()
    release_extra = cfg.get("release", {}) or {}
    if rel.is_dir():
        for f in sorted(rel.glob("*.json")):
            extra = release_extra.get(f.stem, {})
            data = _read_structured(f)
            if not isinstance(data, dict):
                raise DeviceFileError(f"{f}: expected a JSON object")
            dev = _from_release_json(f, data, f.stem, extra, f"authors' release data/device_configs/{f.name}")
            add(dev, extra.get("aliases", []), f)
            if extra.get("variant"):
                cat.variants.add(dev.name)
    else:
        cat.release_found = False
    for name, fields in (cfg.get("spec_sheet") or {}).items():
        add(_from_own_format(CATALOGUE_YAML, name, fields, "spec sheet", training_allowed=False),
            fields.get("aliases", []), CATALOGUE_YAML)
    for f in user_device_files():
        for dev, aliases in load_user_file(f):
            add(dev, aliases, f)
    # display names are lookup keys too, unless two GPUs share one (H100 and its FP16 variant)
    shown: dict = {}
    for dev in cat.devices.values():
        shown.setdefault(normalise_name(dev.display_name), []).append(dev.name)
    for k, names in shown.items():
        names = [n for n in names if n not in cat.variants]
        if len(names) == 1:
            cat.aliases.setdefault(k, names[0])
    return cat


# ---------------------------------------------------------------- public lookup
def short_name(name: str) -> str:
    """How the paper's tables and our figures name a catalogue GPU (``short`` in devices.yaml: H100, A100x4, ...),
    else ``name`` itself. Reads devices.yaml alone (no release data needed)."""
    return _short_names().get(name, name)


@functools.lru_cache(maxsize=1)
def _short_names() -> dict:
    cfg = paths.load_yaml(CATALOGUE_YAML.read_text())
    return {str(n): str(e["short"]) for section in ("release", "spec_sheet") for n, e in (cfg.get(section) or {}).items()
            if isinstance(e, dict) and e.get("short")}


def get_device(name: "str | Device") -> Device:
    """File stem, display name or alias (case/space/-/_ insensitive); unknown -> UnknownDeviceError."""
    if isinstance(name, Device):
        return name
    cat = _catalogue()
    k = normalise_name(name)
    if k in cat.aliases:
        return cat.devices[cat.aliases[k]]
    # "H100 80GB HBM3" without the vendor prefix
    for prefix in ("nvidia", "tesla", "nvidiatesla", "geforce", "nvidiageforce", "amd", "amdinstinct"):
        if prefix + k in cat.aliases:
            return cat.devices[cat.aliases[prefix + k]]
    known = sorted({*cat.devices, *(d.display_name for d in cat.devices.values())})
    every = {normalise_name(n): n for n in known}
    for alias_key, target in cat.aliases.items():
        every.setdefault(alias_key, target)
    close = difflib.get_close_matches(k, list(every), n=5, cutoff=0.5)
    close_names = list(dict.fromkeys(every[c] for c in close))
    hint = f"; close names: {', '.join(close_names)}" if close_names else ""
    extra = "" if cat.release_found else " (the release is not provisioned, so its GPUs are missing)"
    raise UnknownDeviceError(f"unknown GPU {name!r}{extra}{hint}; add it with a device file in "
                             f"user_devices/ or ${ENV_USER_DEVICES} (see neusight_core/data/devices.py)")


def list_devices() -> pd.DataFrame:
    """One row per GPU with every Device field, plus its aliases and whether it is a variant."""
    cat = _catalogue()
    rows = []
    for dev in cat.devices.values():
        r = asdict(dev)
        r["aliases"] = ", ".join(sorted(a for a, n in cat.aliases.items() if n == dev.name and a != normalise_name(dev.name)))
        r["variant"] = dev.name in cat.variants
        rows.append(r)
    return pd.DataFrame(rows)


def describe(every_field: bool = False) -> str:
    """The catalogue as ``neusight devices`` prints it: the figures a prediction uses, one line per GPU of at most
    about 130 characters; ``every_field``: one block per GPU with every field, sources included."""
    t = list_devices()
    if every_field:
        return "\n".join("\n".join([r["name"]] + [f"  {k:<20} {v}" for k, v in r.items() if k != "name"]) + "\n"
                         for r in t.to_dict("records"))
    short = pd.DataFrame({
        "name": t["name"], "vendor": t["vendor"], "GB": t["mem_gb"], "GB/s": t["mem_bw_gbs"], "SMs": t["num_sm"],
        "FP32 TFLOPS": (t["fp32_gflops"] / 1e3).round(1), "BF16 TFLOPS": (t["bf16_tensor_gflops"] / 1e3).round(0),
        "L2 MB": t["l2_mb"], "link GB/s": t["link_gbs"],
        # a variant (the release's H100 with FP16 tensor-core figures in its FP32 fields) is no GPU to ask about
        "role": ["variant (paper's FP16 study)" if va else "training" if tr else "unseen (paper)" if un else "catalogue"
                 for tr, un, va in zip(t["training"], t["unseen"], t["variant"])]})
    with pd.option_context("display.width", 200, "display.max_rows", 200):
        return short.to_string(index=False, na_rep="-") + "\n(--all: every field with its source and the aliases)"


def training_devices(vendor: str = "NVIDIA") -> list[Device]:
    """The training GPUs of a vendor (NVIDIA: P4, P100, V100, T4, A100-PCIE-40GB)."""
    return [d for d in _catalogue().devices.values() if d.training and d.vendor == vendor]


_MODEL_TOKEN = re.compile(r"[A-Z]+\d+[A-Z]?", re.I)


def device_from_properties(name: str, total_memory_bytes: int, sm_count: int) -> Device | None:
    """The catalogue GPU that matches what torch.cuda.get_device_properties reports, or None.

    The reported name decides; SM count and memory only break ties between entries with the same
    display name (and the release's FP16 variant of the H100 is never chosen). When the name is not
    in the catalogue, a GPU with the same model token (e.g. "H100"), SM count and memory (within 20 %)
    is accepted if it is the only one.
    """
    cat = _catalogue()
    gib = total_memory_bytes / 2**30
    usable = [d for d in cat.devices.values() if d.name not in cat.variants]

    def mem_ok(d):
        return abs(gib - d.mem_gb) / d.mem_gb < 0.2

    same_name = [d for d in usable if normalise_name(d.display_name) == normalise_name(name)]
    if len(same_name) == 1:
        return same_name[0]
    if len(same_name) > 1:
        fit = [d for d in same_name if d.num_sm == sm_count and mem_ok(d)]
        return fit[0] if len(fit) == 1 else None
    tokens = {t.lower() for t in _MODEL_TOKEN.findall(name)}
    fit = [d for d in usable if d.num_sm == sm_count and mem_ok(d)
           and tokens & {t.lower() for t in _MODEL_TOKEN.findall(d.display_name)}]
    return fit[0] if len(fit) == 1 else None


#: Device fields an entry derived from torch's device properties cannot know and so estimates.
ESTIMATED_FIELDS = ("mem_bw_gbs", "fp32_gflops", "fp32_vec_gflops", "l2_mb", "freq_mhz", "core_per_sm")


def derive_from_properties(name: str, total_memory_bytes: int, sm_count: int) -> tuple[Device, tuple]:
    """A catalogue entry for a GPU the catalogue does not know, from what torch reports.

    SM count and memory are measured; everything else is taken from the known NVIDIA GPU with the
    closest SM count (per-SM peak FLOPS scaled to this SM count, bandwidth, L2, clock, cores per SM
    as they are). Returns (device, estimated field names). Predictions for it are indicative only:
    add a device file (see the module docstring) with the spec-sheet numbers to do better.
    """
    if sm_count < 1 or total_memory_bytes <= 0:
        raise DeviceFileError(f"cannot derive a device for {name!r}: {sm_count} SMs, {total_memory_bytes} bytes")
    cat = _catalogue()
    known = [d for d in cat.devices.values() if d.vendor == "NVIDIA" and d.name not in cat.variants]
    ref = min(known, key=lambda d: (abs(d.num_sm - sm_count), -d.fp32_gflops))
    scale = sm_count / ref.num_sm
    dev = Device(name=f"derived:{name}", display_name=name, vendor="NVIDIA",
                 mem_gb=round(total_memory_bytes / 2**30, 1), mem_bw_gbs=ref.mem_bw_gbs, num_sm=int(sm_count),
                 core_per_sm=ref.core_per_sm, freq_mhz=ref.freq_mhz, fp32_gflops=ref.fp32_gflops * scale,
                 fp32_vec_gflops=ref.fp32_vec_gflops * scale, l2_mb=ref.l2_mb, link_gbs=None, training=False,
                 source=(f"derived from torch device properties (SM count, memory); {', '.join(ESTIMATED_FIELDS)} "
                         f"estimated from {ref.name} ({ref.num_sm} SMs, FLOPS scaled by SM count)"))
    return dev, ESTIMATED_FIELDS
