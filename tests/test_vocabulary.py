"""Issue 35: one vocabulary. Op classes and precisions are enums of ``schema`` that carry their attributes; no other
module of the package spells one as a string literal, and the members behave as the text a kernel table holds. The
options' words (``Mode``, ``Plan``, ``Attention``, ``Execution``, ``Grads``, ``Comm``) likewise, where a literal means
the option; the few that mean something else are listed in ``NOT_AN_OPTION``."""
from __future__ import annotations

import ast
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from neusight_core.data import datafile
from neusight_core.question import schema
from neusight_core.predictors import common
from neusight_core.question.schema import Attention, Comm, Execution, Grads, Mode, OpClass, Plan, Precision

PKG = Path(__file__).resolve().parents[1] / "neusight_core"
MODULES = sorted(p for p in PKG.rglob("*.py") if p != PKG / "question" / "schema.py")
WORDS = {c.value for c in OpClass} | {p.value for p in Precision}
#: the options' words: inf train dp tp pp ep eager sdpa graph fresh accumulate nccl bandwidth
OPTION_WORDS = {m.value for e in (Mode, Plan, Attention, Execution, Grads, Comm) for m in e}

#: Literals of an option's word that mean something else: (module, word) -> (how many in the module, why). The count
#: is exact, so that a literal meaning the option beside them still fails (and an entry no longer needed too).
NOT_AN_OPTION = {
    ("__main__.py", "train"): (2, "the CLI's train subcommand (trains a predictor's weights), not a mode"),
    ("cost/host.py", "train"): (3, "the name of a timed step (decode | train) and of its result keys, not a mode"),
    ("data/dataset.py", "train"): (2, "the authors' dataset split (the dataset/train folder), not a mode"),
    ("data/measured_kernels.py", "nccl"): (2, "the folder of NVIDIA's measured NCCL kernels, not a comm model"),
    ("studies/live_modern.py", "train"): (6, "a measured step's phase (STEP_PHASES: prefill | decode | train)"),
    ("studies/live_modern.py", "graph"): (1, "a key of VARIANTS: the name of a compared variant (graph | eager | paper's setting)"),
    ("studies/live_modern.py", "eager"): (1, "a key of VARIANTS: the name of a compared variant (graph | eager | paper's setting)"),
    ("studies/live_modern.py", "sdpa"): (1, "a word looked for in CUDA kernel names (ATTENTION_KERNEL_WORDS)"),
    ("__main__.py", "tp"): (1, "the serve question's field tp (GPUs of one serving instance), not a plan"),
    ("data/serving_runs.py", "tp"): (2, "the measured runs' column tp (GPUs of one serving instance), not a plan"),
    ("studies/serving_eval.py", "tp"): (1, "the serve question's field tp (GPUs of one serving instance), not a plan"),
    ("studies/moe_eval.py", "tp"): (2, "a label of the split column of NVIDIA's layers (one GPU | tp | ep | tp x ep)"),
    ("studies/moe_eval.py", "ep"): (2, "a label of the split column of NVIDIA's layers (one GPU | tp | ep | tp x ep)"),
}


def _literals(source: str, words=WORDS) -> list[tuple[int, str]]:
    """(line, text) of every string constant that is one of ``words``, docstrings, f-string text and the argument of
    ``float`` (``float("inf")`` is infinity, not a mode) left out."""
    tree = ast.parse(source)
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skip.add(id(first.value))
        if isinstance(node, ast.JoinedStr):
            skip |= {id(v) for v in node.values}
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "float":
            skip |= {id(a) for a in node.args}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in words and id(n) not in skip]


def _unexplained(module: str, source: str) -> dict[str, list[int]]:
    """Option words of ``module`` (its path below the package) whose literals ``NOT_AN_OPTION`` does not account for
    -> the lines of those literals (none where the entry counts more than there are)."""
    found = _literals(source, OPTION_WORDS)
    have = Counter(w for _, w in found)
    allowed = Counter({w: n for (m, w), (n, _) in NOT_AN_OPTION.items() if m == module})
    return {w: sorted(line for line, x in found if x == w) for w in sorted(have | allowed) if have[w] != allowed[w]}


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PKG)))
def test_no_op_class_or_precision_literal_outside_the_vocabulary(path):
    found = _literals(path.read_text())
    assert not found, f"{path.relative_to(PKG)}: use schema.OpClass / schema.Precision, not {found}"


def test_the_scan_finds_a_literal_and_spares_docstrings_and_text():
    src = '"""LINEAR in a docstring."""\nx = f"bf16 {y}"\nif c == "LINEAR" or p in ("fp16", "other"):\n    pass\n'
    assert _literals(src) == [(3, "LINEAR"), (3, "fp16")]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PKG)))
def test_no_option_word_literal_outside_the_vocabulary(path):
    module = path.relative_to(PKG).as_posix()
    bad = _unexplained(module, path.read_text())
    assert not bad, (f"{module}: option words as literals {bad} (word: lines); use the members of schema's Mode, Plan, "
                     "Attention, Execution, Grads, Comm (or a tuple of schema: MODES, PLANS, TENSOR_PLANS, ...); a "
                     "literal that means something else goes in NOT_AN_OPTION, counted, with why")


def test_the_scan_finds_an_option_word_and_spares_infinity_and_the_listed_ones():
    src = ('"""train in a docstring."""\nx = f"tp{n} eager {y}"\nif mode == "train" and plan in ("pp", "dp2"):\n'
           '    best = float("inf")\n')
    assert _literals(src, OPTION_WORDS) == [(3, "train"), (3, "pp")]
    assert OPTION_WORDS == {"inf", "train", "dp", "tp", "pp", "ep", "eager", "sdpa", "graph", "fresh", "accumulate",
                            "nccl", "bandwidth"}
    # a module's listed literals pass as counted; one more of the word (an option beside them) fails, as does one fewer
    labels = 'split = ["one GPU", "tp", "ep"]\norder = {"tp": 1, "ep": 2}\n'
    assert _unexplained("studies/moe_eval.py", labels) == {}
    assert _unexplained("studies/moe_eval.py", labels + 'plan = "tp"\n') == {"tp": [1, 2, 3]}
    assert _unexplained("studies/moe_eval.py", 'order = {"tp": 1, "ep": 2}\n') == {"ep": [1], "tp": [1]}
    assert _unexplained("cost/network.py", 'if comm == "nccl":\n    pass\n') == {"nccl": [1]}
    # every entry names a module of the package, a word of the options and a reason
    assert all((PKG / m).is_file() and w in OPTION_WORDS and n > 0 and why for (m, w), (n, why) in NOT_AN_OPTION.items())


def test_members_carry_their_attributes():
    assert [p.bytes for p in Precision] == [4, 4, 2, 2, 1]
    assert schema.ELEMENT_BYTES == {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
    assert schema.HALF_PRECISIONS == ("fp16", "bf16") and schema.TENSOR_PRECISIONS == ("tf32", "fp16", "bf16", "fp8")
    # an fp8 step keeps its activations (and attention, memory-bound kernels) in bf16
    assert schema.HALF_ACTIVATIONS == ("fp16", "bf16", "fp8") and Precision.FP8.activations is Precision.BF16
    torch = pytest.importorskip("torch")
    for p in Precision:       # the named torch dtype exists and stores elements of the member's size
        assert getattr(torch, p.torch_dtype).itemsize == p.bytes
    # the subsets the predictors use are the members' predicates, in table order
    assert schema.GEMM_CLASSES == ("BMM", "LINEAR") and common.VECTOR_CLASSES == ("VEC", "SOFTMAX", "LAYERNORM")
    assert common.PEAK_GEMM_CLASSES == ("BMM", "LINEAR", "CONV", "ATTN")
    assert common.MEMORY_CLASSES == ("MEM", "UNCLASSIFIED") and common.ROW_TILE_CLASSES == ("SOFTMAX", "LAYERNORM")
    assert schema.PAPER_CLASSES == schema.GEMM_CLASSES + common.VECTOR_CLASSES
    assert [OpClass(c).label for c in schema.PAPER_CLASSES] == ["BMM", "FC", "EW", "Softmax", "LN"]
    assert schema.OP_CLASSES[-3:] == ("MEM", "COMM", "UNCLASSIFIED")


def test_members_behave_as_the_text_a_kernel_table_holds(tmp_path):
    m, p = OpClass.LINEAR, Precision.BF16
    assert m == "LINEAR" and hash(p) == hash("bf16") and {"bf16": 2}[p] == 2
    assert f"{m} {p}" == "LINEAR bf16" and str(p) == "bf16" and repr(p) == "'bf16'"
    assert json.dumps({p: m}) == '{"bf16": "LINEAR"}'
    table = pd.DataFrame({"op_class": [m, "VEC"], "precision": [p, "fp32"], "x": [1.0, 2.0]})
    assert table["op_class"].isin(schema.GEMM_CLASSES).tolist() == [True, False]
    assert np.isin(table["precision"].to_numpy(), schema.HALF_PRECISIONS).tolist() == [True, False]
    # written and read back as plain text (the trace cache's format), equal to the table written
    datafile.write_frame(tmp_path / "t.npz", table, meta={"classes": {m: p}})
    back, meta = datafile.read_frame(tmp_path / "t.npz")
    assert [type(v) for v in back["op_class"]] == [str, str] and meta == {"classes": {"LINEAR": "bf16"}}
    pd.testing.assert_frame_equal(back, table)


def test_a_module_constant_has_one_meaning_in_the_package():
    """``PREDICTORS``, ``OP_CLASSES``, ``COLUMNS`` ... once named different things in different modules (issue 35): a
    module-level UPPER_CASE name is defined in one module of the package only; others import it from there."""
    where: dict[str, list[str]] = {}
    for f in sorted(PKG.rglob("*.py")):
        for node in ast.parse(f.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            for t in targets:
                if isinstance(t, ast.Name) and t.id.isupper() and len(t.id) > 1:
                    where.setdefault(t.id, []).append(str(f.relative_to(PKG)))
    twice = {n: fs for n, fs in where.items() if len(fs) > 1}
    assert not twice, f"defined in several modules: {twice}"
