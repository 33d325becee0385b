"""Issue 35: the forecaster core imports nothing from the studies or the reports above it.

Every module of the package is placed in one layer here (a new module must be placed, or this test fails), and the
imports of each core module, function-level ones included, are read from its source. docs/architecture.md draws the
same map."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "neusight_core"

#: trace, tables, engine, predictors, memory, network, CLI and what they stand on
CORE = {"__init__", "__main__", "aten_ops", "configs", "datafile", "dataset", "derive", "devices", "engine",
        "fused_attention", "fusion", "host", "interpolation", "latency", "measured_checks", "measured_kernels",
        "memory", "meta_model", "network", "parallel", "paths", "registry", "release", "request", "scenario",
        "schema", "sweep", "tables", "trace", "trace_cache"}
#: one question each, answered through the engine or a registered predictor
STUDIES = {"authors_tables", "claims", "evaluation", "external_eval", "hyperparameter_search", "kernel_eval", "live",
           "live_harness", "live_kernels", "live_modern", "opgraph", "paper_tables", "published", "recipe_eval",
           "recipe_studies", "reproduce", "whatif"}
#: tables, figures, verdicts, the run and its record
REPORTS = {"live_report", "plots", "report", "run_estimate", "run_record", "run_summary", "runner", "tier1_report"}


def _modules() -> dict[str, Path]:
    out = {f.stem: f for f in PKG.glob("*.py")}
    out.update({f"predictors.{f.stem}": f for f in (PKG / "predictors").glob("*.py")})
    return out


def _layer(name: str) -> str | None:
    if name.startswith("predictors"):
        return "core"                    # the predictors package is core, every module of it
    return next((layer for layer, mods in (("core", CORE), ("studies", STUDIES), ("reports", REPORTS))
                 if name in mods), None)


def _imports(path: Path) -> set[str]:
    """Package modules ``path`` imports anywhere in its source (``from neusight_core import x`` counts as x)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "neusight_core":
            sub = node.module[len("neusight_core"):].lstrip(".")
            out |= {sub.split(".")[0]} if sub else {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith("neusight_core.")}
    return out


def test_every_module_has_one_layer():
    mods = _modules()
    assert not (CORE & STUDIES or CORE & REPORTS or STUDIES & REPORTS)
    unplaced = sorted(m for m in mods if _layer(m) is None)
    assert not unplaced, f"place these modules in a layer (tests/test_layers.py): {unplaced}"
    gone = sorted((CORE | STUDIES | REPORTS) - set(mods))
    assert not gone, f"layer map names modules that do not exist: {gone}"


@pytest.mark.parametrize("name", sorted(m for m in _modules() if _layer(m) == "core"))
def test_core_imports_nothing_above_it(name):
    above = sorted(m for m in _imports(_modules()[name]) if _layer(m) in ("studies", "reports"))
    assert not above, f"core module {name} imports {above} (a study or report layer module)"


def test_the_scan_sees_function_level_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from neusight_core import whatif, report\n    import neusight_core.plots\n")
    assert _imports(f) == {"whatif", "report", "plots"}
