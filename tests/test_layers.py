"""Three layers, shown by the folders, each importing only from the layers below it.

- the forecaster core: ``neusight_core/*.py`` and its folders by role (``CORE_FOLDERS``: the question, tracing,
  plans, cost, data, predictors);
- the studies, one question each: ``neusight_core/studies/``;
- the reports (tables, figures, verdicts): ``neusight_core/reports/``;
- the run (the notebooks executed by ./run_all.sh, SUMMARY.md, the record and the tarball): ``neusight_core/run/``.

A module's layer is its folder, so a new module is placed by where it is written. The imports of each module,
function-level ones included, are read from its source; docs/architecture.md draws the same map."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "neusight_core"
ORDER = ("core", "studies", "reports", "run")       # a layer may import its own and those before it
#: the core's folders, by role (each says its purpose in its __init__)
CORE_FOLDERS = ("question", "tracing", "plans", "cost", "data", "predictors")


def _modules() -> dict[str, Path]:
    """Dotted name below the package (``engine``, ``predictors.base``, ``studies.whatif``) -> file."""
    return {".".join(f.relative_to(PKG).with_suffix("").parts): f for f in PKG.rglob("*.py")}


def _layer(name: str) -> str:
    top = name.split(".")[0]
    return top if top in ORDER[1:] else "core"


def _imports(path: Path, pkg: Path = PKG) -> set[str]:
    """Package modules ``path`` imports anywhere in its source, as dotted names below the package
    (``from neusight_core.studies import whatif`` counts as ``studies.whatif``; relative imports are resolved)."""
    package = path.relative_to(pkg).parent.parts
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[:len(package) - node.level + 1])
            elif node.module and node.module.split(".")[0] == "neusight_core":
                base = []
            else:
                continue
            mod = base + ([p for p in node.module.split(".") if p != "neusight_core"] if node.module else [])
            for a in node.names:
                full = ".".join(mod + [a.name])
                out.add(full if (pkg / (full.replace(".", "/") + ".py")).exists() else ".".join(mod))
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".", 1)[1] for a in node.names if a.name.startswith("neusight_core.")}
    return {m for m in out if m}


def test_every_folder_is_a_layer():
    folders = {f.parent.relative_to(PKG).as_posix() for f in PKG.rglob("*.py")}
    assert folders == {".", *CORE_FOLDERS, *ORDER[1:]}, f"a new folder needs a place in the layers: {folders}"


@pytest.mark.parametrize("name", sorted(_modules()))
def test_no_module_imports_a_layer_above_its_own(name):
    mine = ORDER.index(_layer(name))
    above = sorted(m for m in _imports(_modules()[name]) if ORDER.index(_layer(m)) > mine)
    assert not above, f"{_layer(name)} module {name} imports {above} from a layer above it"


def test_the_scan_sees_function_level_and_relative_imports(tmp_path):
    pkg = tmp_path / "neusight_core"
    for m in ("engine", "paths", "studies/whatif", "studies/live", "reports/report", "reports/plots"):
        (pkg / f"{m}.py").parent.mkdir(parents=True, exist_ok=True)
        (pkg / f"{m}.py").write_text("")
    f = pkg / "studies" / "probe.py"
    f.write_text("def f():\n    from neusight_core.studies import whatif\n"
                 "    from neusight_core.reports import report\n"
                 "    import neusight_core.reports.plots\n    from . import live\n    from .. import engine\n"
                 "    from neusight_core import paths\n    from neusight_core.studies.whatif import run\n")
    got = _imports(f, pkg)
    assert got == {"studies.whatif", "reports.report", "reports.plots", "studies.live", "engine", "paths"}
    above = sorted(m for m in got if ORDER.index(_layer(m)) > ORDER.index("studies"))
    assert above == ["reports.plots", "reports.report"]


def test_the_package_and_notebooks_name_things_not_tickets():
    """Code and notebooks say what a thing is and why; which issue asked for it is the history's business (git log,
    docs/). One slip is shown with its file and line."""
    import re
    pattern = re.compile(r"\bissue \d+", re.I)
    hits = [f"{p.relative_to(PKG.parent)}:{i}" for p in sorted(PKG.rglob("*.py"))
            + sorted((PKG.parent / "notebooks").glob("*.ipynb"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not hits, hits[:10]


def _private_uses(path: Path, pkg: Path = PKG) -> list[str]:
    """The private names (``_x``, not ``__x__``) of other package modules that ``path`` imports or reads: a name
    used across modules is an interface, and an interface is public."""
    here = ".".join(path.relative_to(pkg).with_suffix("").parts)
    tree = ast.parse(path.read_text())
    alias, out = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "neusight_core":
            mod = ".".join(p for p in node.module.split(".") if p != "neusight_core")
            for a in node.names:
                full = f"{mod}.{a.name}".strip(".")
                if (pkg / (full.replace(".", "/") + ".py")).exists():
                    alias[a.asname or a.name] = full
                elif a.name.startswith("_") and not a.name.startswith("__") and mod != here:
                    out.append(f"from {node.module} import {a.name}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("neusight_core.") and a.asname:
                    alias[a.asname] = a.name.split(".", 1)[1]
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in alias
                and node.attr.startswith("_") and not node.attr.startswith("__") and alias[node.value.id] != here):
            out.append(f"{node.value.id}.{node.attr}")
    return sorted(set(out))


@pytest.mark.parametrize("name", sorted(_modules()))
def test_no_module_uses_another_modules_private_names(name):
    found = _private_uses(_modules()[name])
    assert not found, f"{name} uses private names of other modules (make them public where they are defined): {found}"


def test_the_private_name_scan_sees_imports_and_attributes(tmp_path):
    pkg = tmp_path / "neusight_core"
    (pkg / "studies").mkdir(parents=True)
    (pkg / "tracing").mkdir()
    (pkg / "tracing" / "families.py").write_text("_FAMILIES = {}\nFAMILIES = {}\n")
    (pkg / "studies" / "x.py").write_text(
        "from neusight_core.tracing import families\nfrom neusight_core.tracing.families import _FAMILIES, FAMILIES\n"
        "def f():\n    return families._FAMILIES, families.FAMILIES, families.__name__\n")
    assert _private_uses(pkg / "studies" / "x.py", pkg) == ["families._FAMILIES",
                                                            "from neusight_core.tracing.families import _FAMILIES"]
    (pkg / "tracing" / "families.py").write_text("_FAMILIES = {}\ndef g():\n    return _FAMILIES\n")   # its own: fine
    assert _private_uses(pkg / "tracing" / "families.py", pkg) == []


@pytest.mark.parametrize("folder", CORE_FOLDERS + ORDER[1:])
def test_every_folder_says_its_purpose(folder):
    doc = ast.get_docstring(ast.parse((PKG / folder / "__init__.py").read_text())) or ""
    assert len(doc.split()) >= 5, f"{folder}/__init__.py: say what the folder is for (its docstring), got {doc!r}"


#: the modules that read data files (the release, NVIDIA's measured kernels) or the trace cache
DATA_READERS = ("data.dataset", "data.measured_kernels", "data.release", "tracing.trace_cache")
#: names of those modules that read nothing: the convolution's implicit-GEMM formula
READS_NOTHING = {"data.dataset.conv_gemm"}


def _reads_data(path: Path) -> list[str]:
    """The data readers ``path`` imports (``DATA_READERS``), as ``module`` or ``module.name``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("neusight_core"):
            mod = node.module.split(".", 1)[1] if "." in node.module else ""
            for a in node.names:
                full = f"{mod}.{a.name}".strip(".")
                if full in DATA_READERS or (mod in DATA_READERS and full not in READS_NOTHING):
                    out.append(full)
        elif isinstance(node, ast.Import):
            out += [a.name.split(".", 1)[1] for a in node.names if a.name.split(".", 1)[-1] in DATA_READERS]
    return out


@pytest.mark.parametrize("name", sorted(n for n in _modules() if n.startswith("predictors.")))
def test_a_predictor_reads_no_data_file(name):
    """Training hands a predictor its frames (``training.data_for``, ``training.hand_over``): only the trainer reads."""
    if name == "predictors.training":
        assert _reads_data(_modules()[name]), "the trainer is where the data is read: the scan must see it"
        return
    found = _reads_data(_modules()[name])
    assert not found, f"{name} reads data itself ({found}): declare it in data_wanted and let the trainer hand it over"
