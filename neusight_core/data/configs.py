"""Model configs by name or path, read without torch (the tracer builds models from them).

``available_configs`` lists the release's DLmodel_configs and ours (``model_configs/``);
``load_config`` turns one into a ``transformers`` config (importing transformers only then).
``trace`` re-exports these names.
"""
from __future__ import annotations

import copy
import functools
import json
import math
from pathlib import Path

from neusight_core import paths
from neusight_core.question.schema import Attention

OUR_CONFIGS_DIR = Path(__file__).resolve().parent / "model_configs"


#: Hugging Face model types traced as image models: they take ``pixel_values`` (batch, channels,
#: size, size) instead of ``input_ids``, so their input size is an image side (``--image-size``), not a
#: sequence length. Only the types validated here are listed; another vision type is traced as text
#: and fails with the tracer's one line.
IMAGE_MODEL_TYPES = ("resnet", "vit")
DEFAULT_IMAGE_SIZE = 224     # ImageNet's 224 x 224 crops (ResNet paper section 3.4; ViT Table 1's /16 at 224)


def max_positions(cfg) -> int | None:
    """The most positions (prompt + cache) a config's model takes, or None where it does not say (a config object or
    namespace: read by attribute)."""
    for k in ("n_positions", "max_position_embeddings"):
        v = getattr(cfg, k, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def is_image_model(config) -> bool:
    """True for a config (a transformers config, a dict of its content, a name or a path) of an image
    model (``IMAGE_MODEL_TYPES``)."""
    if isinstance(config, (str, Path)):
        return _named_is_image(str(config))
    mt = getattr(config, "model_type", None)
    if isinstance(config, dict):
        mt = config.get("model_type")
    return mt in IMAGE_MODEL_TYPES


def unsupported_image_model(config) -> str | None:
    """Why a config (a transformers config or a dict of its content) of a vision type outside ``IMAGE_MODEL_TYPES``
    cannot be traced (its config has ``num_channels`` and an image or patch size: DINOv2, Swin, ...), else None:
    fed token ids, it would fail deep inside transformers."""
    get = config.get if isinstance(config, dict) else (lambda k: getattr(config, k, None))
    if get("model_type") in IMAGE_MODEL_TYPES or not (get("num_channels") and (get("image_size") or get("patch_size"))):
        return None
    return (f"{get('model_type')!r} takes images (its config has num_channels and an image or patch size); "
            f"the image models traced here are {', '.join(IMAGE_MODEL_TYPES)}")


@functools.lru_cache(maxsize=256)
def _named_is_image(name: str) -> bool:
    # once per name and process: a sweep asks for every configuration, and reading a config globs the
    # config folders
    return config_content(name).get("model_type") in IMAGE_MODEL_TYPES


@functools.cache
def no_sdpa_model_types() -> frozenset:
    """Model types whose transformers class has no fused (sdpa) attention (``_supports_sdpa`` False: Switch
    Transformers, Gemma 2, GPT-OSS, ...) or, like ResNet, no attention at all: ``attention_support.yaml``, read from
    the pinned transformers (tests/test_attention.py checks it against the installed one). Every other model type
    is built with sdpa by Hugging Face by default, in any precision."""
    text = (Path(__file__).resolve().parent / "attention_support.yaml").read_text(encoding="utf-8")
    return frozenset(paths.load_yaml(text)["no_sdpa_model_types"])


def default_attention(config) -> str:
    """What Hugging Face builds a model with when nobody says (``attn_implementation`` unset): ``sdpa`` where the
    model type supports it, else ``eager``. Read from the config alone: no transformers import."""
    mt = (config.get("model_type") if isinstance(config, dict)
          else config_content(config).get("model_type") if isinstance(config, (str, Path))
          else getattr(config, "model_type", None))
    return Attention.EAGER if mt in no_sdpa_model_types() else Attention.SDPA


class TraceError(ValueError):
    """Bad input to the tracer (unknown model, unsupported type, non-positive batch/sequence)."""


def available_configs() -> dict[str, Path]:
    """Config name -> JSON file: the release's DLmodel_configs plus ours (model_configs/)."""
    rel = paths.model_configs_dir()
    return dict(_configs_in(str(rel), _mtime(rel), _mtime(OUR_CONFIGS_DIR)))


def _mtime(folder: Path) -> int:
    try:
        return folder.stat().st_mtime_ns
    except OSError:
        return -1


@functools.lru_cache(maxsize=8)
def _configs_in(rel: str, rel_mtime: int, ours_mtime: int) -> tuple:
    # the folders are listed again when either changes (a file added or removed changes its folder's mtime);
    # a sweep asks for every configuration, and listing them costs more than the rest of the checks
    out: dict[str, Path] = {}
    if rel_mtime >= 0:
        out.update({p.stem: p for p in sorted(Path(rel).glob("*.json"))})
    out.update({p.stem: p for p in sorted(OUR_CONFIGS_DIR.glob("*.json"))})
    return tuple(out.items())


def load_config(name_or_path):
    """A ``transformers`` config from a release/our config name or a path to a JSON file."""
    import transformers

    if isinstance(name_or_path, transformers.PretrainedConfig):
        return copy.deepcopy(name_or_path)
    if isinstance(name_or_path, dict):
        return _config_from_dict(dict(name_or_path), "dict", name_or_path.get("name", ""))
    p, d = _read_named(name_or_path)
    return _config_from_dict(d, str(p), p.stem)


def _read_named(name_or_path) -> tuple[Path, dict]:
    """(file, its JSON) of a config name (ours or the release's) or a path to a JSON file; one-line errors."""
    p = Path(str(name_or_path))
    if not (p.suffix == ".json" and p.is_file()):
        known = available_configs()
        if str(name_or_path) not in known:
            raise TraceError(f"unknown model config {name_or_path!r}; known: {', '.join(sorted(known)) or 'none'} "
                             "(or give a path to a JSON file)")
        p = known[str(name_or_path)]
    try:
        return p, json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise TraceError(f"model config {p} is not valid JSON: {e}") from None


def _config_from_dict(d: dict, where: str, name: str):
    import transformers

    # our own files carry provenance keys that are not part of the HF config
    d = {k: v for k, v in d.items() if not k.startswith("_neusight") and k != "name"}
    mt = d.pop("model_type", None)
    if not mt:
        raise TraceError(f"model config {where} has no model_type")
    _check_sizes(d, where)
    if mt not in transformers.CONFIG_MAPPING:
        raise TraceError(f"unsupported model type {mt!r} in {where}: transformers has no such model")
    try:
        cfg = transformers.AutoConfig.for_model(mt, **d)
    except Exception as e:  # noqa: BLE001 - transformers' own check of a field: its reason, in one line
        from neusight_core.question.step import one_line
        raise TraceError(f"model config {where}: {one_line(str(e)) or type(e).__name__}") from None
    cfg.name_or_path = name or mt
    return cfg


#: size fields of a config that must be positive integers when given: zero heads divide by zero deep in the
#: model code, zero positions let any sequence through
POSITIVE_SIZES = ("hidden_size", "n_embd", "d_model", "num_hidden_layers", "n_layer", "num_layers",
                  "num_attention_heads", "n_head", "num_heads", "num_key_value_heads", "intermediate_size", "n_inner",
                  "vocab_size", "n_positions", "max_position_embeddings", "head_dim", "image_size", "patch_size",
                  "num_channels")


def _check_sizes(d: dict, where: str) -> None:
    for k in POSITIVE_SIZES:
        v = d.get(k)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise TraceError(f"model config {where}: {k} must be a positive integer, got {v!r}")


def switch_tokens_per_expert(seq: int, num_experts: int, expert_capacity: int) -> int:
    """Tokens of each sequence that the tracer's Switch routing stand-in gives every expert
    (``trace.switch_routing_stand_in``): an even spread, each expert filled up to its capacity.
    Shape derivation (``table_families``) uses the same function, so the two cannot disagree."""
    return min(math.ceil(int(seq) / int(num_experts)), int(expert_capacity))


def expert_tokens_fn(content: dict):
    """``seq -> tokens per expert`` for a Switch Transformers config (num_experts and expert_capacity
    set, sparse layers present), else None: the one shape of our traces that is not polynomial in seq."""
    e, cap = content.get("num_experts"), content.get("expert_capacity")
    sparse = any(content.get(k) for k in ("num_sparse_encoder_layers", "num_sparse_decoder_layers"))
    if not (sparse and isinstance(e, int) and isinstance(cap, int) and e > 0 and cap > 0):
        return None
    # a partial, not a lambda: families travel between processes (family_pool) and must pickle
    return functools.partial(switch_tokens_per_expert, num_experts=e, expert_capacity=cap)


def config_content(model) -> dict:
    """The content of a model config as a plain dict (what the key hashes)."""
    if isinstance(model, dict):
        return dict(model)
    if isinstance(model, (str, Path)):
        p, d = _read_named(model)
        return {**d, "name": d.get("name", p.stem)}
    to_dict = getattr(model, "to_dict", None)       # a transformers PretrainedConfig
    if to_dict is None:
        raise TraceError(f"cannot use {type(model).__name__} as a model config")
    return {**to_dict(), "name": getattr(model, "name_or_path", "") or ""}
