"""The fault table of issue 36: every fault an evaluator found, what the artifact does now, and the tests that
check it, run now; writes docs/faults.md (expected / observed / ok per row).

    .venv/bin/python benchmarks/fault_table.py [--out docs/faults.md]

Each row runs its tests with pytest (one process, one thread); a row is ok when every one of its tests passed.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
T = "tests/"
# (item, fault as found, what the artifact does now, tests)
FAULTS = [
    ("1", "one bad row (NaN, inf, a non-dict request, a size of 2^62) cost a whole engine batch its answers",
     "the bad row gets its one-line error, the others their answers",
     [T + "test_robust_engine.py"]),
    ("2", "truncated full weights started an unasked 720-epoch retraining",
     "answered with the quick weights, one line names the damaged file; --full retrains",
     [T + "test_robust_weights.py"]),
    ("3", "an FP32 question needed the optional BF16 database, trained everything, then exited 2",
     "FP32 networks train and answer; BF16 rows are refused in one line naming the package",
     [T + "test_robust_bf16_optional.py"]),
    ("4", "NVIDIA's measured kernels were read unchecked (negative latencies, m <= 0, zero heads)",
     "rows are validated; a file that fails is named in one line",
     [T + "test_robust_measured.py"]),
    ("5", "an answer lost its memory verdict (sweep rows, engine batches of several sizes)",
     "every sweep and engine row says whether it fits (lower bound when not computed)",
     [T + "test_robust_engine.py::test_every_sweep_row_says_whether_it_fits"]),
    ("6", "notebook 06's heat map coloured configurations that do not fit on 8 GPUs as latencies",
     "no time for a run that cannot happen; the cell says 'does not fit' or 'tpN: no link'",
     [T + "test_memory.py::test_whatif_gives_no_time_to_a_run_that_cannot_happen_and_its_heat_map_says_why"]),
    ("7", "Ctrl-C / SIGTERM during a sweep dropped the rows computed or left a hidden .tmp file",
     "the finished parts are kept as NAME.partial.csv and said; no .tmp left",
     [T + "test_robust_sweep_interrupt.py"]),
    ("8", "`--link-gbs nan` in a sweep silently used the catalogue link",
     "refused: one line, exit 2", [T + "test_robust_small.py::test_sweep_refuses_a_nan_link"]),
    ("8", "`fusion=\"False\"` in an engine dict predicted fused", "read as false; other words refused",
     [T + "test_robust_engine.py::test_a_bad_request_gets_its_error_and_the_others_their_answer"]),
    ("8", "device files did not range-check link_gbs / tensor_gflops; range errors did not name the file",
     "every speed figure, the link and the tensor peaks have a plausible range, checked when the GPU is used; the error names the file and field, the file's other GPUs still answer",
     [T + "test_robust_small.py::test_device_file_ranges_name_the_file_and_field"]),
    ("8", "notebook 06 accepted a negative price and max_gpus=0",
     "whatif.check_parameters refuses them in one line",
     [T + "test_robust_small.py::test_notebook_06_parameters_are_checked"]),
    ("8", "a bad or FIFO NEUSIGHT_PREDICTORS file: an 18-line traceback or every command hung",
     "one line naming the file, exit 2, never opened when not a regular file",
     [T + "test_robust_small.py::test_a_bad_predictor_registry_file_is_one_line_and_never_hangs"]),
    ("8", "a disk that filled during the HTML export was reported OK",
     "the notebook is FAILED with 'disk full while writing <file>.html'",
     [T + "test_robust_small.py::test_a_full_disk_during_the_html_export_fails_the_notebook",
      T + "test_runner.py::test_disk_full_in_the_html_export_fails_that_notebook"]),
    ("8", "an earlier run's tarball was overwritten by a new --out of the same name",
     "the run is refused before it starts, naming the tarball",
     [T + "test_robust_small.py::test_an_earlier_runs_tarball_is_never_overwritten"]),
    ("8", "`n_positions: 0` answered; `num_key_value_heads: 0` gave 'integer division or modulo by zero'",
     "config sizes must be positive integers: one line naming the file and field",
     [T + "test_robust_small.py::test_config_sizes_must_be_positive_integers"]),
    ("8", "`--seed -1` was accepted", "refused in one line (sweep, train, predict)",
     [T + "test_robust_small.py::test_a_negative_seed_is_refused",
      T + "test_robust_small.py::test_predict_takes_a_seed_and_refuses_a_negative_one"]),
    ("8", "an alias plus its canonical name gave two identical sweep rows", "one row per GPU however named",
     [T + "test_robust_small.py::test_an_alias_and_its_canonical_name_are_one_sweep_row"]),
    ("8", "ViT-B/16 at `--image-size 100000` answered, reporting 136 million GiB only after the time",
     "the first line says it does not fit and what it needs (1,453 GiB with sdpa attention)",
     [T + "test_robust_small.py::test_an_absurd_image_size_says_it_does_not_fit_before_any_time"]),
    ("8", "no `--version`", "`--version` prints the package version", [T + "test_robust_small.py::test_version"]),
    ("8", "a SIGTERM to ./run_all.sh could be lost inside the kernel client (the run went on into the next notebook; "
          "CI waited 120 s), and one just after the start left the folder's lock behind",
     "the signal is remembered and stops the run after that notebook, whose kernel is killed after 10 s; the "
     "handlers come before the lock, so an interrupted run always writes its record and removes the lock",
     [T + "test_runner.py::test_a_signal_whose_exception_is_swallowed_still_stops_the_run",
      T + "test_runner.py::test_stop_all_kills_the_kernels_the_run_started",
      T + "test_runner.py::test_a_signal_right_after_the_claim_leaves_no_lock",
      T + "test_runner.py::test_a_second_run_started_on_the_same_folder_stops_at_once"]),
    ("readability", "run.json said \"tarball\": null although the tarball existed", "run.json names the tarball",
     [T + "test_runner.py::test_run_all_continues_past_failure"]),
    ("full run", "training ran on the CPU even on a GPU machine; nothing said where weights trained or how long a "
     "run would take", "NEUSIGHT_TRAIN_DEVICE (auto: the GPU), meta.json / SUMMARY.md say where, the run says its "
     "expected time at start", [T + "test_training_device.py"]),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "faults.md"))
    a = ap.parse_args(argv)
    ids = list(dict.fromkeys(t for *_, tests in FAULTS for t in tests))
    t0 = time.perf_counter()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", *ids],
                          cwd=ROOT, capture_output=True, text=True, env=env)
    outcome = {}
    for m in re.finditer(r"^(PASSED|FAILED|ERROR|SKIPPED) (\S+)", proc.stdout, re.M):
        outcome[m.group(2)] = m.group(1)
    rows = []
    for item, fault, now, tests in FAULTS:
        got = {nid: st for nid, st in outcome.items() if any(nid == t or nid.startswith(t + "::") or
                                                              nid.startswith(t + "[") for t in tests)}
        n_ok = sum(st == "PASSED" for st in got.values())
        ok = bool(got) and n_ok == len(got)
        rows.append(f"| {item} | {fault} | {now} | {n_ok} of {len(got)} tests passed | {'ok' if ok else '**NOT OK**'} |")
    head = ["# Fault table (issue 36)", "",
            f"Written by `benchmarks/fault_table.py` on {time.strftime('%Y-%m-%d')} in {time.perf_counter() - t0:.0f} s "
            f"(pytest exit {proc.returncode}). Each row's tests are in `tests/` (see the script for their names).", "",
            "| item | fault as found | what happens now (expected) | observed | ok |", "|---|---|---|---|---|"]
    Path(a.out).write_text("\n".join(head + rows) + "\n")
    print("\n".join(rows))
    return 0 if all(r.endswith("| ok |") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
