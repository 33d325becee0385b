"""The evaluator's experience: hostile inputs, interrupted and repeated runs, the SUMMARY verdict
block, notebooks executed from their own folder with clean outputs, the Available-badge files."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest

from neusight_core import __main__ as cli
from neusight_core.data import devices
from neusight_core import paths
from neusight_core.run import executed_notebook, run_summary, runner

FIXTURES = paths.REPO_ROOT / "tests" / "fixtures" / "notebooks"
SLOW_FIXTURES = paths.REPO_ROOT / "tests" / "fixtures" / "slow_notebooks"
PY = str(paths.REPO_ROOT / ".venv" / "bin" / "python")


# ----------------------------------------------------------------------------- hostile inputs
@pytest.fixture
def hostile_files(tmp_path, monkeypatch):
    """Bad model configs and an absurd device file, as a user would hand them over."""
    cfg = json.loads((paths.model_configs_dir() / "gpt2_large.json").read_text())
    (tmp_path / "neg_layers.json").write_text(json.dumps({**cfg, "n_layer": -3}))
    (tmp_path / "list.json").write_text("[1, 2, 3]")
    (tmp_path / "devices.yaml").write_text(
        "devices:\n"
        "  Many_SM_GPU: {display_name: a, mem_gb: 80, mem_bw_gbs: 2000, num_sm: 100000000, fp32_gflops: 50000, l2_mb: 50, source: t}\n"
        "  Fast_Mem_GPU: {display_name: b, mem_gb: 80, mem_bw_gbs: 1.0e+30, num_sm: 100, fp32_gflops: 50000, l2_mb: 50, source: t}\n")
    monkeypatch.setenv("NEUSIGHT_DEVICES", str(tmp_path / "devices.yaml"))
    devices.reload()
    yield tmp_path
    monkeypatch.delenv("NEUSIGHT_DEVICES")
    devices.reload()


BASE = ["predict", "--quick", "--model", "gpt2_large", "--device", "H100", "--seq", "1024"]

# (case, argv, expected exit code, expected error text)
HOSTILE = [
    ("tp over more GPUs than heads", BASE + ["--batch", "4", "--parallel", "tp", "--gpus", "64"], 2,
     "needs the 20 attention heads to split evenly"),
    ("negative layer count", ["predict", "--quick", "--model", "{tmp}/neg_layers.json", "--device", "H100",
                              "--batch", "1", "--seq", "128"], 2, "number of layers must be a positive integer, got -3"),
    ("model JSON that is a list", ["predict", "--quick", "--model", "{tmp}/list.json", "--device", "H100",
                                   "--batch", "1", "--seq", "128"], 2, "must be a JSON object"),
    ("a billion sequences", BASE + ["--batch", "1000000000"], 2, "impossible on NVIDIA_H100_80GB_HBM3"),
    ("batch 1e20", BASE + ["--batch", "1e20"], 2, "argument --batch: invalid int value: '1e20'"),
    ("batch 4.5", BASE + ["--batch", "4.5"], 2, "argument --batch: invalid int value: '4.5'"),
    ("batch 0", BASE + ["--batch", "0"], 2, "batch must be a positive integer, got 0"),
    ("1e8 SMs", ["predict", "--quick", "--model", "gpt2_large", "--device", "Many_SM_GPU", "--batch", "1",
                 "--seq", "128"], 2, "num_sm = 100000000 is outside the physically plausible range"),
    ("1e30 GB/s", ["predict", "--quick", "--model", "gpt2_large", "--device", "Fast_Mem_GPU", "--batch", "1",
                   "--seq", "128"], 2, "mem_bw_gbs = 1e+30 is outside the physically plausible range"),
    ("link of 0 GB/s", BASE + ["--batch", "4", "--parallel", "dp", "--link-gbs", "0"], 2,
     "link bandwidth must be a positive number"),
    ("8 GPUs without a plan", BASE + ["--batch", "4", "--gpus", "8"], 2, "8 GPUs need a parallel plan"),
    ("link without a plan", BASE + ["--batch", "4", "--link-gbs", "600"], 2, "only matters with a parallel plan"),
    ("micro-batches without pp", BASE + ["--batch", "4", "--parallel", "dp", "--micro-batches", "4"], 2,
     "micro-batches only apply to pipeline parallelism"),
    ("pp over more GPUs than layers", BASE + ["--batch", "64", "--parallel", "pp", "--gpus", "64"], 2,
     "needs at least 64 layers, the model has 36"),
    ("unknown option", BASE + ["--batch", "4", "--bogus"], 2, "unrecognized arguments: --bogus"),
    ("unknown GPU", ["predict", "--quick", "--model", "gpt2_large", "--device", "H9000", "--batch", "1",
                     "--seq", "128"], 2, "H9000"),
]


@pytest.mark.parametrize("case, argv, code, text", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_cli_input(case, argv, code, text, hostile_files, capsys):
    argv = [a.replace("{tmp}", str(hostile_files)) for a in argv]
    try:
        rc = cli.main(argv)
    except SystemExit as e:  # argparse's own exit
        rc = e.code
    out, err = capsys.readouterr()
    assert rc == code, (out, err)
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err  # one clear line
    assert text in lines[0], lines[0]
    assert out == ""  # and no number


def test_hostile_inputs_rejected_by_the_python_api_too(hostile_files):
    from neusight_core.cost import latency
    with pytest.raises(latency.LatencyInputError, match="attention heads"):
        latency.predict_model("gpt2_large", "H100", 4, 1024, "train", parallel="tp", gpus=64, quick=True)
    with pytest.raises(latency.LatencyInputError, match="impossible"):
        latency.predict_model("gpt2_large", "H100", 10 ** 20, 1024, "inf", quick=True)
    with pytest.raises(latency.LatencyInputError, match="parallel plan"):
        latency.predict_model("gpt2_large", "H100", 4, 1024, "inf", gpus=8, quick=True)
    with pytest.raises(latency.LatencyInputError, match="positive integer"):
        latency.predict_model(str(hostile_files / "neg_layers.json"), "H100", 1, 128, "inf", quick=True)


RUNNER_HOSTILE = [
    ("unknown option", ["--bogus"], "unrecognized arguments: --bogus"),
    ("--only naming no notebook", ["--only", "nope"], "unknown notebook(s) nope"),
    ("--out is a file", ["--out", "{tmp}/afile"], "exists and is not a folder"),
    ("--out below a file", ["--out", "{tmp}/afile/run"], "cannot create or write there"),
    ("--out holds an earlier run", ["--out", "{tmp}/used"], "already holds files"),
    ("--lab on nothing", ["--lab", "{tmp}/nothing"], "is not a folder"),
    ("--out on a read-only place", ["--out", "/proc/neusight-run"], "cannot create it"),
    ("--out empty", ["--out", ""], "--out: empty folder name"),
]


@pytest.mark.parametrize("case, argv, text", RUNNER_HOSTILE, ids=[h[0] for h in RUNNER_HOSTILE])
def test_hostile_runner_arguments(case, argv, text, tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "SUMMARY.md").write_text("old")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv] + ["--notebooks-dir", str(FIXTURES)]
    assert runner.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and text in err[0]
    assert (tmp_path / "used" / "SUMMARY.md").read_text() == "old"  # nothing touched


def test_run_all_usage_error_comes_before_setup(tmp_path):
    proc = subprocess.run([str(paths.REPO_ROOT / "run_all.sh"), "--only", "nope"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert "[setup]" not in proc.stdout and proc.stderr.strip().count("\n") == 0
    assert "unknown notebook(s) nope" in proc.stderr


def test_lab_command(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("NEUSIGHT_LAB_DRY_RUN", "1")
    assert runner.main(["--lab", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "jupyter lab" in out and "--ServerApp.default_url=/lab/tree/" in out


@pytest.mark.parametrize("uid", [0, 1000], ids=["root", "user"])
def test_lab_as_root_opens_with_allow_root(uid, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("NEUSIGHT_LAB_DRY_RUN", "1")
    monkeypatch.setattr(os, "geteuid", lambda: uid)
    assert runner.main(["--lab", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert ("--allow-root" in out) == (uid == 0)


# ----------------------------------------------------------------------------- interrupt, re-run
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupted_run_says_so_and_rerun_never_mixes(sig, tmp_path):
    out = tmp_path / "run"
    cmd = [PY, "-m", "neusight_core.run.runner", "--quick", "--out", str(out), "--notebooks-dir", str(SLOW_FIXTURES)]
    proc = subprocess.Popen(cmd, cwd=paths.REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(1200):  # wait until the slow notebook is running (its output folder exists)
        if (out / "02_slow").is_dir():
            break
        time.sleep(0.1)
    time.sleep(1.0)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, stdout + stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    summary = (out / "SUMMARY.md").read_text()
    assert f"**INTERRUPTED** by {signal.Signals(sig).name}" in summary and "(01_ok)" in summary
    assert "| 01_ok | OK |" in summary and "| 02_slow | **INTERRUPTED** |" in summary
    assert not list(tmp_path.glob("neusight_results_*.tar.gz"))  # no tarball of a partial run
    assert json.loads((out / "run.json").read_text())["interrupted"] == signal.Signals(sig).name
    # a re-run into the same folder is refused, before anything runs
    again = subprocess.run(cmd, cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "already holds files" in again.stderr
    assert (out / "SUMMARY.md").read_text() == summary


# ----------------------------------------------------------------------------- verdict block
def _metrics(run_dir, name, status="OK", **verdicts):
    (run_dir / name).mkdir(parents=True)
    body = {"status": status, **({"reason": "no CUDA GPU here"} if status == "SKIPPED" else {})}
    if verdicts:
        body["verdicts"] = verdicts
    (run_dir / name / "metrics.json").write_text(json.dumps(body))


def test_summary_opens_with_the_verdict_block(tmp_path):
    counts = lambda r, d, n: {"REPRODUCED": r, "DEVIATES": d, "NOT COMPUTABLE": n,  # noqa: E731
                              "graded": {"within tolerance": r, "within 10 %": 1, "within 2x": 2, "worse": d - 3}}
    rank = lambda ns, holds: {"holds": holds, "configurations": 80,  # noqa: E731
                              "mape": {"neusight": ns, "roofline": 31.4, "habitat": 385.0, "li": 60.3}}
    _metrics(tmp_path, "01_validate_shipped_pairs", tier=0, label="authors' shipped predictions",
             summary="485 of 517 table cells equal", claims={"neusight": counts(8, 8, 2)},
             ranking={"neusight": rank(8.9, True)},
             correlation={"neusight": {"n": 80, "mape": 8.9, "pearson": 0.981, "spearman": 0.996}})
    _metrics(tmp_path, "02_trace_models")
    _metrics(tmp_path, "04_reproduce_paper", tier=1, quick=True,
             claims={"neusight": counts(1, 15, 2), "neusight-paper": counts(3, 13, 2)},
             ranking={"neusight": rank(14.5, True), "neusight-paper": rank(40.0, False)})
    _metrics(tmp_path, "05_live_gpu", status="SKIPPED", tier=2, summary="SKIPPED: no CUDA GPU here")
    results = [run_summary.NotebookResult("01_validate_shipped_pairs", "OK", 1.0),
               run_summary.NotebookResult("02_trace_models", "OK", 1.0),
               run_summary.NotebookResult("04_reproduce_paper", "OK", 1.0),
               run_summary.NotebookResult("05_live_gpu", "SKIPPED", 1.0, "no CUDA GPU here")]
    p = run_summary.write_summary(tmp_path, results, {"python": "3.11"}, quick=True, total=60.0)
    text = p.read_text()
    head = text.split("## Run")[0]
    assert head.index("## Verdict") < 60  # the verdict opens the file
    assert "Tier 0, the authors' shipped predictions" in head and "485 of 517" in head
    assert "claims with authors' shipped predictions: REPRODUCED 8, DEVIATES 8, NOT COMPUTABLE 2" in head
    assert "Pearson 0.981, Spearman 0.996" in head
    assert "claims with recipe `neusight`: REPRODUCED 1, DEVIATES 15" in head
    assert "claims with recipe `neusight-paper`: REPRODUCED 3, DEVIATES 13" in head
    assert "quick mode" in head
    assert "Tier 2, live on the local GPU** (05_live_gpu, SKIPPED)" in head and "no CUDA GPU" in head
    assert "**Ranking**" in head and "authors' predictions: yes" in head
    assert "ours, recipe `neusight-paper`: NO" in head
    assert "half a unit of the last digit" in head


def test_summary_judges_neusights_numbers_first_and_the_baselines_apart_with_each_claims_reason(tmp_path):
    counts = lambda r, d, n: {"REPRODUCED": r, "DEVIATES": d, "NOT COMPUTABLE": n}  # noqa: E731
    _metrics(tmp_path, "04_reproduce_paper", tier=1, summary="NeuSight's own MAPE % 9.1 / 8.7 / 9.8; the paper 9.7 / 7.3 / 8.1",
             claims={"neusight": counts(0, 15, 3)},
             claims_neusight={"neusight": {**counts(4, 11, 3), "graded": {"within 10 %": 6}}},
             claims_baselines={"neusight": counts(1, 9, 0)},
             claim_list={"neusight": [{"claim": "C2", "text": "NVIDIA inference MAPE: NeuSight 9.7", "neusight": "DEVIATES",
                                       "grade": "within 10 %", "baselines": "DEVIATES", "why": "differs: NeuSight -0.58"}]})
    results = [run_summary.NotebookResult("04_reproduce_paper", "OK", 1.0)]
    text = run_summary.write_summary(tmp_path, results, {"python": "3.11"}, quick=False, total=60.0).read_text()
    line = next(x for x in text.splitlines() if "claims with recipe `neusight`" in x)
    assert line.index("on NeuSight's own numbers: REPRODUCED 4, DEVIATES 11") < line.index(
        "on our re-implemented baselines' numbers, apart: REPRODUCED 1, DEVIATES 9")
    assert "REPRODUCED 0, DEVIATES 15" not in text          # the mixed count is not the headline any more
    assert "| C2 | NVIDIA inference MAPE: NeuSight 9.7 | NeuSight DEVIATES (within 10 %); baselines DEVIATES — " \
           "differs: NeuSight -0.58 |" in text


def test_verdict_block_names_what_is_missing(tmp_path):
    results = [run_summary.NotebookResult("04_reproduce_paper", "FAILED", 1.0, "ValueError: boom")]
    lines = "\n".join(run_summary.verdict_block(tmp_path, results))
    assert "Tier 1, our re-implementation**: not reported (04_reproduce_paper FAILED (ValueError: boom))" in lines


# ----------------------------------------------------------------------------- notebooks
def _bad_outputs(nb_path) -> list[str]:
    """Warnings, tracebacks and echoed paths in a notebook's stored outputs."""
    nb = json.loads(nb_path.read_text())
    bad = []
    for i, c in enumerate(nb["cells"]):
        for o in c.get("outputs", []):
            text = o.get("text") or o.get("data", {}).get("text/plain", "") or ""
            text = "".join(text) if isinstance(text, list) else text
            if o.get("output_type") == "error":
                bad.append(f"cell {i}: error {o.get('ename')}")
            for needle in ("Warning", "Traceback", "PosixPath(", "IProgress not found"):
                if needle in text:
                    bad.append(f"cell {i}: {needle}: {text[:200]}")
    return bad


def test_fixture_run_outputs_have_no_warnings(tmp_path):
    out = tmp_path / "run"
    assert runner.main(["--quick", "--only", "01", "--out", str(out), "--notebooks-dir", str(FIXTURES)]) == 0
    assert _bad_outputs(out / "01_ok.ipynb") == []
    assert (tmp_path / "neusight_results_run.tar.gz").is_file()


@pytest.mark.slow
def test_notebook_01_runs_from_its_own_folder_with_clean_outputs(tmp_path):
    """Notebook 01 quick, as in JupyterLab: kernel started in notebooks/, the package found through the venv's
    path (simulated with PYTHONPATH: this checkout may share a venv whose .pth names another checkout). One
    execution for both: its outputs are clean, and its tables and verdicts are those of Tier 0."""
    import papermill as pm
    env_before = dict(os.environ)
    os.environ["PYTHONPATH"] = str(paths.REPO_ROOT)
    os.environ["TQDM_DISABLE"] = "1"  # as the runner sets it
    try:
        out = tmp_path / "01"
        pm.execute_notebook(str(paths.REPO_ROOT / "notebooks" / "01_validate_shipped_pairs.ipynb"),
                            str(tmp_path / "01.ipynb"), parameters={"output_dir": str(out), "quick": True},
                            cwd=str(paths.REPO_ROOT / "notebooks"), progress_bar=False, kernel_name="python3")
    finally:
        os.environ.clear()
        os.environ.update(env_before)
    assert _bad_outputs(tmp_path / "01.ipynb") == []
    metrics = json.loads((out / "metrics.json").read_text())
    v = metrics["verdicts"]
    assert v["tier"] == 0 and set(v["claims"]["neusight"]) >= {"REPRODUCED", "DEVIATES", "NOT COMPUTABLE", "graded"}
    assert v["ranking"]["neusight"]["holds"] is True and v["correlation"]["neusight"]["n"] == 80
    assert "table cells" in v["summary"]
    # Tier 0's tables and claims
    assert metrics["status"] == "OK"
    assert metrics["cells_compared"] == 517
    assert metrics["cells_equal"] + metrics["exceptions"] == metrics["cells_compared"]
    assert metrics["cells_per_table"]["nvidia_inf"]["equal"] == 216
    assert sum(metrics["claims_verdicts"].values()) == 18 and set(metrics["claims"]) == {f"C{i}" for i in range(1, 19)}
    assert v["claims"]["neusight"] == {**metrics["claims_verdicts"], "graded": v["claims"]["neusight"]["graded"]}
    for f in ["tables/claims.csv", "tables/claims.md", "tables/claims.json", "tables/tier0_diff.csv",
              "tables/nvidia_inf.md", "figures/fig7_nvidia_inf.png", "figures/fig7_nvidia_inf.pdf",
              "figures/table8_distributed.png", "summary.md"]:
        assert (out / f).is_file(), f
    summary = (out / "summary.md").read_text()
    assert re.search(r"\*\*Tier 0\*\*.*\d+ of 517 table cells", summary) and "| C14" in summary


def test_bootstrap_puts_the_checkout_on_the_venv_path():
    text = (paths.REPO_ROOT / "scripts" / "bootstrap.sh").read_text()
    assert "--no-build-isolation -e \"$ROOT\"" in text and '[ ! -L "$VENV" ]' in text
    assert "pythonpath = ." in (paths.REPO_ROOT / "pytest.ini").read_text()
    assert "user_devices/" in (paths.REPO_ROOT / ".gitignore").read_text()


# ----------------------------------------------------------------------------- available badge
def test_license_citation_and_evaluator_readme():
    lic = (paths.REPO_ROOT / "LICENSE").read_text()
    assert lic.startswith("MIT License") and "2026 NeuSight artifact contributors" in lic
    cff = (paths.REPO_ROOT / "CITATION.cff").read_text()
    assert "cff-version:" in cff and "2407.13853" in cff and "Phanishayee" in cff and "ASPLOS" in cff
    readme = (paths.REPO_ROOT / "README.md").read_text()
    for needle in ("## For artifact evaluators", "Available", "Functional", "Reproduced", "Tier 0", "Tier 2",
                   "--lab", "MIT"):
        assert needle in readme, needle


# ----------------------------------------------------------------------------- figures
def test_figures_colours_widths_and_labels():
    import matplotlib
    matplotlib.use("Agg")
    from neusight_core.studies import evaluation as ev
    from neusight_core.studies import paper_tables as pt
    from neusight_core.reports import plots
    pal = plots._palette(["ours", "authors", "Habitat", "Roofline", "Li et al.", "something new"])
    assert pal["ours"] == plots.PALETTE["NeuSight (ours)"] != pal["Habitat"]
    assert len(set(pal.values())) == len(pal)  # one colour per predictor
    idx = ev.build_index()
    fig = plots.plot_fusion(pt.fusion_cells(idx))
    assert fig.get_size_inches()[0] * 150 < 1600  # Table 7 readable at page width (was 3213 px)
    fig = plots.plot_distributed(pt.distributed_cells(idx))
    h100 = [ax for ax in fig.axes if ax.get_title() == "H100x4"][0]
    assert all(t.get_rotation() == 45 for t in h100.get_xticklabels())  # crowded labels turned
    fig = plots.plot_ape_bars(pt.figure_cells(idx, "nvidia_inf"), log=True)
    ylims = {ax.get_ylim() for ax in fig.axes if ax.get_visible() and ax.get_yscale() == "log"}
    assert len(ylims) == 1  # log panels share one y-range


def test_sub_resolution_values_are_not_printed_as_zero(tmp_path):
    import pandas as pd
    from neusight_core.reports import report
    df = pd.DataFrame({"kernel": ["tiny", "big", "none"], "ms": [0.031, 12.345, 0.0]})
    report.save_table(df, tmp_path, "t")
    md = (tmp_path / "tables" / "t.md").read_text()
    assert "0.031" in md
    assert "12.3" in md and "0.0" in md  # a true zero stays 0.0
    assert pd.read_csv(tmp_path / "tables" / "t.csv")["ms"][0] == 0.031  # CSV keeps full precision


def test_progress_bars_are_dropped_from_executed_notebooks(tmp_path):
    import nbformat
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("x")
    cell.outputs = [
        nbformat.v4.new_output("display_data", data={
            "text/plain": "train:   0%|          | 0/52 [00:00<?, ?epoch/s]",
            "application/vnd.jupyter.widget-view+json": {"model_id": "a", "version_major": 2, "version_minor": 0}}),
        nbformat.v4.new_output("stream", name="stderr", text="index:  50%|#####     | 1/2\rindex: 100%|##########| 2/2\n"),
        nbformat.v4.new_output("stream", name="stderr", text="a real message on stderr\n"),
        nbformat.v4.new_output("stream", name="stdout", text="100 configurations\n"),
    ]
    nb.cells = [cell]
    p = tmp_path / "x.ipynb"
    nbformat.write(nb, p)
    executed_notebook.strip_progress(p)
    outs = nbformat.read(p, as_version=4).cells[0].outputs
    assert [o.get("text") for o in outs] == ["a real message on stderr\n", "100 configurations\n"]
