"""Command line: ``python -m neusight_core predict | devices | models``.

    python -m neusight_core predict --model gpt3_27 --device H100 --batch 1 --seq 2048 --mode train
    python -m neusight_core predict --model gpt2_large --device A100-40GB --batch 4 --seq 1024 \
        --mode train --parallel dp --gpus 4 --json
    python -m neusight_core devices
    python -m neusight_core models

Bad input (unknown GPU or model, zero batch, ...) ends with one line ``error: ...`` and exit code 2.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# = predictors.NAMES (kept here so that the parser does not import torch; a test checks they agree)
PREDICTORS = ("neusight", "neusight-paper", "neusight-logo", "roofline", "habitat", "li")   # = predictors.NAMES (no torch import here)


def _models() -> list[tuple[str, str]]:
    """(name, source) of every model config the tracer knows by name."""
    from neusight_core import paths
    out = []
    try:
        for p in sorted(paths.model_configs_dir().glob("*.json")):
            out.append((p.stem, "authors' release"))
    except Exception:  # release not provisioned: still list ours
        pass
    for p in sorted((Path(__file__).parent / "model_configs").glob("*.json")):
        out.append((p.stem, "neusight_core/model_configs (ours)"))
    return out


class _OneLineParser(argparse.ArgumentParser):
    """Usage errors are one line ``error: ...`` and exit 2 (not the whole usage text)."""

    def error(self, message):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def _parser() -> argparse.ArgumentParser:
    ap = _OneLineParser(prog="python -m neusight_core",
                                 description="NeuSight re-implementation: predict GPU latency of a model.")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_OneLineParser)
    p = sub.add_parser("predict", help="predict one configuration")
    p.add_argument("--model", required=True, help="config name (see `models`) or path to a HF config JSON")
    p.add_argument("--device", required=True, help="GPU name, file stem or alias (see `devices`)")
    p.add_argument("--batch", type=int, required=True, help="global batch size")
    p.add_argument("--seq", type=int, required=True, help="sequence length")
    p.add_argument("--mode", choices=("inf", "train"), default="inf")
    p.add_argument("--fusion", action="store_true", help="operator fusion as torch.compile would do")
    p.add_argument("--parallel", choices=("dp", "tp", "pp"), default=None)
    p.add_argument("--gpus", type=int, default=None,
                   help="GPUs for --parallel (default 4, the paper's setting; 1 without --parallel)")
    p.add_argument("--link-gbs", type=float, default=None, help="link peak GB/s (default: catalogue)")
    p.add_argument("--micro-batches", type=int, default=1, help="PP micro-batches (default 1)")
    p.add_argument("--past", type=int, default=0,
                   help="inference on a KV cache of this many tokens (extension; --seq 1 = one decode step)")
    p.add_argument("--dtype", choices=("fp32", "tf32", "fp16", "bf16"), default="fp32",
                   help="precision (default fp32 = the paper, TF32 off; the others are extrapolations: "
                        "GEMMs at the dense tensor-core peak, 2-byte elements for fp16/bf16)")
    p.add_argument("--predictor", default="neusight", choices=PREDICTORS,
                   help="neusight (ours: the authors' recipe on 3 seeds, averaged), neusight-paper (the authors' recipe, "
                        "docs/recipes.md), neusight-logo (our earlier leave-one-GPU-out recipe) or a baseline")
    p.add_argument("--quick", action="store_true", help="use (or train) the quick predictors")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    _add_sweep_parser(sub)
    sub.add_parser("devices", help="list the GPUs in the catalogue")
    sub.add_parser("models", help="list the model configs known by name")
    return ap


def _predict(a) -> int:
    from neusight_core import latency
    if a.gpus is None:
        a.gpus = 4 if a.parallel else 1
    r = latency.predict_model(a.model, a.device, a.batch, a.seq, a.mode, predictor=a.predictor,
                              fusion=a.fusion, parallel=a.parallel, gpus=a.gpus, link_gbs=a.link_gbs,
                              micro_batches=a.micro_batches, quick=a.quick, past=a.past, dtype=a.dtype)
    k = r.pop("kernels")
    r.update(model=a.model, batch=a.batch, seq=a.seq, past=a.past, mode=a.mode, fusion=a.fusion, dtype=a.dtype,
             parallel=a.parallel, gpus=a.gpus, kernels=int(len(k)))
    if a.json:
        print(json.dumps(r, indent=2))
        return 0
    plan = f" {a.parallel}x{a.gpus}" if a.parallel else ""
    from neusight_core import memory
    mem = r["memory"]
    if not mem.get("fits", True):   # say it first: the latency below is of a run that cannot happen
        print(f"WARNING: {mem['verdict']}")
    print(f"{a.model} {a.mode} batch={a.batch} seq={a.seq}{f' past={a.past}' if a.past else ''}"
          f"{' fused' if a.fusion else ''}{plan} {a.dtype} "
          f"on {r['device']} ({r['predictor']})"
          + ("" if a.dtype == "fp32" else f"  [{a.dtype}: extrapolation, the predictors are validated on FP32]"))
    if r["dtype_note"]:
        print(f"NOTE: {r['dtype_note']}")
    print(f"  end-to-end  {r['e2e_ms']:12.3f} ms")
    for key, label in (("fw_ms", "forward"), ("bw_ms", "backward"), ("acc_ms", "grad acc"),
                       ("comm_ms", "comm"), ("comm_exposed_ms", "comm exposed")):
        if r.get(key):
            print(f"  {label:<11} {r[key]:12.3f} ms")
    print("  by op class:")
    for c, v in r["breakdown"].items():
        print(f"    {c:<12} {v:12.3f} ms")
    for line in memory.format_footprint(mem):
        print("  " + line)
    print(f"  {r['kernels']} kernel rows; trace {r['trace_s']:.2f} s, predict {r['predict_s']:.2f} s")
    return 0


def _add_sweep_parser(sub) -> None:
    """``sweep``: the product of comma-separated lists, one CSV row per configuration x predictor."""
    from neusight_core import predictors as _pred
    p = sub.add_parser("sweep", help="predict many configurations (comma-separated lists) into a CSV")
    p.add_argument("--model", required=True, help="model name(s) or config path(s), comma-separated")
    p.add_argument("--device", required=True, help="GPU name(s), comma-separated")
    p.add_argument("--batch", required=True, help="batch size(s), e.g. 1,2,4,8")
    p.add_argument("--seq", required=True, help="sequence length(s), e.g. 512,1024")
    p.add_argument("--mode", default="inf", help="inf, train or inf,train")
    p.add_argument("--fusion", action="store_true")
    p.add_argument("--parallel", default=None, help="dp, tp or pp (comma-separated for several)")
    p.add_argument("--gpus", default=None, help="GPUs for --parallel (default 4)")
    p.add_argument("--link-gbs", type=float, default=None)
    p.add_argument("--micro-batches", type=int, default=1)
    p.add_argument("--predictor", default="neusight",
                   help=f"predictor(s), comma-separated, of: {', '.join(_pred.NAMES)}")
    p.add_argument("--seed", default="0", help="predictor seed(s), comma-separated")
    p.add_argument("--quick", action="store_true", help="use (or train) the quick predictors")
    p.add_argument("--dtype", default="fp32",
                   help="precision(s), comma-separated, of fp32 (the paper), tf32, fp16, bf16 (extrapolations)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--out", required=True, help="CSV file to write")


def _sweep(a) -> int:
    from neusight_core import predictors as _pred
    from neusight_core import sweep

    def ints(s, what):
        try:
            return [int(x) for x in str(s).split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"--{what} takes comma-separated integers, got {s!r}") from None

    names = [x.strip() for x in a.predictor.split(",") if x.strip()]
    unknown = [x for x in names if x not in _pred.NAMES]
    if unknown:
        raise ValueError(f"unknown predictor(s) {', '.join(unknown)}; choose from {', '.join(_pred.NAMES)}")
    modes = [x.strip() for x in a.mode.split(",") if x.strip()]
    plans = [x.strip() for x in a.parallel.split(",")] if a.parallel else [None]
    out = Path(a.out)
    if out.parent and not out.parent.exists():
        raise ValueError(f"folder of --out does not exist: {out.parent}")
    df = sweep.sweep([x.strip() for x in a.model.split(",") if x.strip()],
                     [x.strip() for x in a.device.split(",") if x.strip()],
                     ints(a.batch, "batch"), ints(a.seq, "seq"), modes, predictors=names,
                     seeds=ints(a.seed, "seed"), quick=a.quick, progress=not a.no_progress,
                     fusion=a.fusion, parallel=plans, gpus=ints(a.gpus, "gpus") if a.gpus else None,
                     micro_batches=a.micro_batches, link_gbs=a.link_gbs,
                     dtype=[x.strip() for x in a.dtype.split(",") if x.strip()])
    tmp = out.with_name(out.name + ".tmp")
    df.to_csv(tmp, index=False)
    tmp.replace(out)
    bad = int((df["error"] != "").sum())
    print(f"{len(df)} rows ({bad} with an error) -> {out}; tables {df.attrs['tables_s']:.1f} s, "
          f"total {df.attrs['total_s']:.1f} s")
    return 0


def main(argv=None) -> int:
    a = _parser().parse_args(argv)
    try:
        if a.cmd == "predict":
            return _predict(a)
        if a.cmd == "sweep":
            return _sweep(a)
        if a.cmd == "devices":
            from neusight_core import devices
            import pandas as pd
            with pd.option_context("display.width", 200, "display.max_rows", 200):
                print(devices.list_devices().to_string(index=False))
            return 0
        if a.cmd == "models":
            for name, src in _models():
                print(f"{name:<16} {src}")
            return 0
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # one line for the user; the traceback helps nobody here
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"error: {msg}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
