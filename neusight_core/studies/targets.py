"""The targets and thresholds of the studies, read from ``targets.yaml`` beside this module (the paper's own numbers
are ``claims.yaml``): ``section(name)`` returns one section as a dict, parsed once per process."""
from __future__ import annotations

import functools
from pathlib import Path

TARGETS_FILE = Path(__file__).with_name("targets.yaml")


@functools.lru_cache(maxsize=1)
def _all() -> dict:
    import yaml
    return yaml.safe_load(TARGETS_FILE.read_text(encoding="utf-8"))


def section(name: str) -> dict:
    """A copy of section ``name`` (tier1, gemm, live, published); a missing one is a KeyError naming the file."""
    import copy
    d = _all()
    if name not in d:
        raise KeyError(f"{TARGETS_FILE}: no section {name!r} (has {', '.join(d)})")
    return copy.deepcopy(d[name])
