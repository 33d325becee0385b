"""Issue 24: what ``sweep --out`` may touch, empty and repeated lists, parts streamed, short sequences."""
import os
import stat

import pandas as pd
import pytest

from neusight_core.question.step import Step
from neusight_core.tracing import table_families, trace
from neusight_core.cost import sweep
from neusight_core.__main__ import main as cli

BASE = ["sweep", "--model", "bert_large", "--device", "H100", "--batch", "1,2", "--seq", "64",
        "--predictor", "roofline", "--quick", "--no-progress"]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch, release_root):
    monkeypatch.setenv("NEUSIGHT_TRACE_CACHE", str(tmp_path / "trace_cache"))
    return tmp_path / "trace_cache"


def _one_error_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:"), err
    return err[0]


@pytest.mark.parametrize("case, out, text", [
    ("a folder", "{tmp}/afolder", "is a folder"),
    ("an empty name", "", "empty file name"),
    ("a missing folder", "{tmp}/nope/s.csv", "does not exist"),
    ("a read-only place", "/proc/neusight-sweep.csv", "not writable"),
])
def test_a_bad_out_is_refused_before_computing(case, out, text, tmp_path, capsys, monkeypatch):
    (tmp_path / "afolder").mkdir()
    monkeypatch.setattr(sweep, "run", lambda *a, **k: pytest.fail("computed before refusing --out"))
    assert cli(BASE + ["--out", out.replace("{tmp}", str(tmp_path))]) == 2
    assert text in _one_error_line(capsys)
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


def test_out_follows_a_symlink_and_writes_through_a_device(cache_dir, tmp_path):
    target = tmp_path / "real.csv"
    target.write_text("old\n")
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    assert cli(BASE + ["--out", str(link)]) == 0
    assert link.is_symlink() and len(pd.read_csv(link)) == 2      # the link stays, its target has the rows
    st = os.stat("/dev/null")
    assert cli(BASE + ["--out", "/dev/null"]) == 0
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode) and os.stat("/dev/null").st_rdev == st.st_rdev
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("opt, value", [("--batch", ","), ("--seq", " , "), ("--device", ","), ("--predictor", ",")])
def test_an_empty_list_is_a_usage_error(opt, value, tmp_path, capsys):
    argv = list(BASE) + ["--out", str(tmp_path / "s.csv")]
    argv[argv.index(opt) + 1] = value
    assert cli(argv) == 2
    assert f"{opt} names no value" in _one_error_line(capsys)
    assert not (tmp_path / "s.csv").exists()
    with pytest.raises(sweep.SweepInputError, match="batches: empty list"):
        sweep.grid(["bert_large"], ["H100"], [], [64])


def test_a_sweep_takes_several_cache_lengths(cache_dir, tmp_path, capsys):
    """``--past`` is a list in a sweep, like ``--batch`` and ``--seq`` (it took one integer): decode steps at several
    context lengths are the sweep a serving question asks for; each row equals the single question."""
    out = tmp_path / "s.csv"
    assert cli(["sweep", "--model", "llama3_2_1b", "--device", "H100", "--batch", "1,4", "--seq", "1", "--past",
                "128,512,128", "--dtype", "bf16", "--predictor", "roofline", "--quick", "--no-progress",
                "--out", str(out)]) == 0
    d = pd.read_csv(out)
    assert sorted(zip(d["batch"], d["past"])) == [(1, 128), (1, 512), (4, 128), (4, 512)]
    from neusight_core.cost import latency
    one = latency.predict_model("llama3_2_1b", "H100", 4, seq=1, past=512, dtype="bf16", predictor="roofline", quick=True)
    assert d[(d.batch == 4) & (d.past == 512)]["e2e_ms"].iloc[0] == pytest.approx(one["e2e_ms"], rel=1e-9)
    argv = ["sweep", "--model", "llama3_2_1b", "--device", "H100", "--batch", "1", "--seq", "1", "--past", "1,x",
            "--out", str(tmp_path / "bad.csv")]
    assert cli(argv) == 2
    assert "--past takes comma-separated integers" in _one_error_line(capsys)


def test_repeated_values_count_once_and_parts_stream_the_same_rows(cache_dir, tmp_path):
    one, parts = tmp_path / "one.csv", tmp_path / "parts.csv"
    argv = ["sweep", "--model", "bert_large,bert_large", "--device", "H100,V100,H100", "--batch", "1,2,2,4",
            "--seq", "64,128,64", "--predictor", "roofline", "--quick", "--no-progress"]
    assert cli(argv + ["--out", str(one)]) == 0
    assert cli(argv + ["--chunk", "5", "--out", str(parts)]) == 0
    a, b = pd.read_csv(one), pd.read_csv(parts)
    assert len(a) == 2 * 3 * 2 and not a.duplicated(["device", "batch", "seq"]).any()
    key = ["device", "batch", "seq"]
    # the same numbers; whether a table was derived or traced depends on how many tables share a part
    pd.testing.assert_frame_equal(a.sort_values(key).reset_index(drop=True).drop(columns="derived"),
                                  b.sort_values(key).reset_index(drop=True).drop(columns="derived"))


def test_short_sequences_share_one_family_per_seq_and_equal_real_traces(cache_dir, monkeypatch):
    monkeypatch.setattr(table_families, "FAMILIES", {})
    fam = table_families.family_for("gpt2_large", 5, 7, "inf", past=0, allow_fixed=True)
    assert fam is not None and fam.ok and fam.seq_fixed == 7
    assert table_families.compare(fam.table(5, 7), trace.trace_model(Step(model="gpt2_large", batch=5, seq=7, mode="inf"))) == ""
    assert table_families.family_for("gpt2_large", 5, 7, "inf", past=0) is None     # without allow_fixed: a real trace
    # in a sweep, batches 2..5 at seq 7 are derived, not traced one by one
    df = sweep.sweep(["gpt2_large"], ["H100"], [2, 3, 4, 5], [7], predictors=["roofline"], quick=True, progress=False)
    assert (df.error == "").all() and df.derived.all()


def test_a_sweep_says_when_a_gpu_has_no_tensor_cores_for_its_dtype(cache_dir, tmp_path, capsys):
    argv = list(BASE) + ["--device", "H100,P100", "--dtype", "fp32,bf16", "--out", str(tmp_path / "s.csv")]
    assert cli(argv) == 0
    err = capsys.readouterr().err
    assert "NOTE: Tesla_P100-PCIE-16GB has no bf16 tensor cores in the catalogue" in err
    assert "H100" not in err.split("NOTE:", 1)[1].split("\n")[0]


def test_predict_and_sweep_take_the_same_question_options():
    """Issue 35: one argument builder serves both commands, so an option added for one reaches the other."""
    from neusight_core.__main__ import _parser
    sub = next(a for a in _parser()._actions if a.dest == "cmd").choices

    def flags(cmd):
        return {f for a in sub[cmd]._actions for f in a.option_strings if f.startswith("--")} - {"--help"}
    assert flags("predict") - {"--json"} == flags("sweep") - {"--no-progress", "--chunk", "--out"}
    assert {"--seed", "--past", "--attention", "--execution", "--dtype", "--quick", "--full"} <= flags("sweep")
