"""The predictor registry: which predictors exist, how they are named, coloured, seeded and
configured, read from ``predictors/registry.yaml``. No torch, no pandas: the CLI's parser reads it.

A new predictor is one entry in that file (plus its module); the CLI's choices, the sweep, notebook 03's and
04's tables and the figures' colours all come from here, and :func:`create` is the one way a predictor is made:
its class from the entry, its name the entry's key, its configuration the entry's (recipe file or inline config). ``NEUSIGHT_PREDICTORS`` may name extra registry
files (``os.pathsep``-separated, same format, entries appended; a name may not be redefined), so that a
user or a test adds a predictor without editing the package.
"""
from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from neusight_core import paths

REGISTRY_FILE = Path(__file__).parent / "registry.yaml"
DEFAULT = "neusight"
_KEYS = {"label", "colour", "seeded", "reported", "class", "recipe", "config"}


class RegistryError(ValueError):
    """A registry file that cannot be used (one line naming the file and the problem)."""


@dataclass(frozen=True)
class Entry:
    name: str
    label: str
    colour: str
    seeded: bool
    reported: bool
    cls: str                       # "module:Class"
    recipe: Path | None = None     # NeuSight recipe file (kind "recipe")
    config: dict | None = None     # a baseline's hyper-parameters

    @property
    def kind(self) -> str:
        return "recipe" if self.recipe is not None else "baseline"


def _read(path: Path) -> dict:
    import yaml

    why = paths.not_a_regular_file(path)
    if why:
        raise RegistryError(f"{path}: {why} (NEUSIGHT_PREDICTORS names predictor registry files)")
    try:
        d = paths.load_yaml(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise RegistryError(f"{path}: cannot read predictor registry ({str(e).splitlines()[0]})") from None
    if not isinstance(d, dict) or not d:
        raise RegistryError(f"{path}: a predictor registry maps names to entries")
    out = {}
    for name, e in d.items():
        if not isinstance(e, dict):
            raise RegistryError(f"{path}: entry {name!r} must be a mapping")
        missing = {"label", "colour", "seeded", "reported", "class"} - set(e)
        unknown = set(e) - _KEYS
        if missing or unknown:
            what = f"lacks {', '.join(sorted(missing))}" if missing else f"has unknown key(s) {', '.join(sorted(unknown))}"
            raise RegistryError(f"{path}: entry {name!r} {what}")
        if ":" not in str(e["class"]):
            raise RegistryError(f"{path}: class of {name!r} must be 'module:Class', got {e['class']!r}")
        recipe = (path.parent / e["recipe"]) if e.get("recipe") else None
        if recipe is not None and not recipe.is_file():
            raise RegistryError(f"{path}: recipe file of {name!r} not found: {recipe}")
        out[str(name)] = Entry(str(name), str(e["label"]), str(e["colour"]), bool(e["seeded"]), bool(e["reported"]),
                               str(e["class"]), recipe, dict(e["config"]) if e.get("config") else None)
    return out


@functools.lru_cache(maxsize=4)
def _entries(extra: str) -> dict:
    out = _read(REGISTRY_FILE)
    for f in filter(None, extra.split(os.pathsep)):
        for name, e in _read(Path(f)).items():
            if name in out:
                raise RegistryError(f"{f}: predictor {name!r} is already registered")
            out[name] = e
    return out


def entries() -> dict:
    """name -> :class:`Entry`, in table order (the package's file, then ``NEUSIGHT_PREDICTORS``' files)."""
    return _entries(os.environ.get("NEUSIGHT_PREDICTORS", ""))


def names() -> tuple:
    return tuple(entries())


def entry(name: str) -> Entry:
    e = entries().get(name)
    if e is None:
        raise KeyError(f"unknown predictor {name!r}; choose one of {', '.join(names())}")
    return e


def label(name: str) -> str:
    """Display name of a registered predictor (an unknown name is shown as it is)."""
    e = entries().get(name)
    return e.label if e else name


def seeded(name: str) -> bool:
    return entry(name).seeded


def reported(kind: str | None = None) -> tuple:
    """The predictors of notebook 04's / 03's tables, in table order; ``kind`` "recipe" or "baseline"."""
    return tuple(n for n, e in entries().items() if e.reported and (kind is None or e.kind == kind))


def colours() -> dict:
    """Label -> colour and name -> colour of every registered predictor."""
    out = {}
    for n, e in entries().items():
        out[e.label] = out[n] = e.colour
    return out


def load_class(name: str):
    """The KernelPredictor class that runs ``name`` (imports its module)."""
    mod, _, cls = entry(name).cls.partition(":")
    try:
        return getattr(importlib.import_module(mod), cls)
    except (ImportError, AttributeError) as e:
        raise RegistryError(f"predictor {name!r}: cannot load {entry(name).cls} ({e})") from None


RECIPES_DIR = Path(__file__).parent / "recipes"


def hparams(name: str) -> dict:
    """The chosen hyper-parameters of predictor ``name``: its recipe file (the NeuSight recipes,
    ``predictors/recipes/<name>.yaml``) or the ``config`` of its registry entry (the baselines);
    a recipe name that is not registered (an ablation's base) is read from ``recipes/<name>.yaml``.
    A fresh copy each call (callers may change it); the files are parsed once per process and version."""
    import copy
    entry = entries().get(name)
    recipe = entry.recipe if entry is not None and entry.recipe is not None else RECIPES_DIR / f"{name}.yaml"
    if recipe.is_file():
        own = dict(copy.deepcopy(_yaml(str(recipe), recipe.stat().st_mtime_ns)) or {})
        # a recipe may name a ``base`` recipe and list only what it changes (our recipe: the authors' + ...)
        base = own.pop("base", None)
        return {**hparams(base), **own} if base else own
    return dict(copy.deepcopy(entry.config or {})) if entry is not None else {}


@functools.lru_cache(maxsize=16)
def _yaml(path: str, mtime_ns: int):
    return paths.load_yaml(Path(path).read_text())


class UnknownPredictorError(KeyError):
    def __str__(self):
        return self.args[0]


def create(name: str, seed: int = 0, config: dict | None = None):
    """A new, untrained predictor ``name``: the entry's class, named by the key, configured by the entry's recipe
    file or inline ``config`` with ``config`` over it (an ablation's variant). ``predictors.get`` trains or loads."""
    if name not in entries():
        raise UnknownPredictorError(f"unknown predictor {name!r}; choose one of {', '.join(names())}")
    return load_class(name)({**hparams(name), **(config or {})}, seed=seed, name=name)


class _Classes(Mapping):
    """Name -> predictor class, each module imported when its class is first asked for: a roofline question
    does not import the NeuSight networks and their tile look-up."""

    def __init__(self):
        self._loaded = {}

    def __getitem__(self, name):
        if name not in entries():
            raise KeyError(name)
        if name not in self._loaded:
            self._loaded[name] = load_class(name)
        return self._loaded[name]

    def __iter__(self):
        return iter(names())

    def __len__(self):
        return len(entries())


#: name -> class of every registered predictor (a Mapping; modules imported on first use)
CLASSES = _Classes()
