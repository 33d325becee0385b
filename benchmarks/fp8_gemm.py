"""FP8 GEMMs on the held-out GPUs: the ``neusight`` recipe's ``GEMM_fp8`` network, trained on the
per-tensor FP8 GEMMs of H100, H200 and L40S, scored on NVIDIA's measured FP8 GEMMs of B200 and GB200 (never trained,
tuned or chosen on), beside the BF16 ``GEMM`` network on the same GPUs' BF16 GEMMs (the same file per GPU,
``measured_kernels.gemm_rows``). Also scored, never trained on: the block-scaled ``fp8_block`` GEMMs through the same
network (a different kernel: an extrapolation) and the training GPUs in sample.

    python benchmarks/fp8_gemm.py [--quick] [--seeds 0,1,2] [--out FILE.csv]

Prints MAPE (%), median and P90 APE and bias per GPU, precision and seed, then the mean over the seeds; numbers are
never written into the code. Full weights train once per seed if not saved (about 8 min per seed on 2 cores);
``--quick`` (1,000 rows per GPU, 4 epochs) takes seconds. Weights saved by the recipe before it had GEMM_fp8 (the same
settings for every other network) are completed instead (``complete``: the missing networks trained alone, about a
minute): the other networks are seeded apart (``TensorCoreNets.fit``), so the result is the weights a whole training
gives (tests/test_fp8.py checks it on quick weights).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # this checkout's package, not an installed one
from neusight_core import predictors  # noqa: E402
from neusight_core.data import measured_kernels as mk  # noqa: E402
from neusight_core.predictors import tensor_core as tc  # noqa: E402
from neusight_core.studies import error_metric  # noqa: E402


def rows() -> pd.DataFrame:
    """Every scored row: BF16, FP8 (per tensor) and FP8 block-scaled GEMMs of the training and held-out GPUs."""
    parts = []
    for gpus in ("training", "held_out"):
        parts.append(mk.gemm_rows(gpus).assign(kind="bf16"))
        parts.append(mk.gemm_rows(gpus, "fp8").assign(kind="fp8"))
    # block-scaled: every GPU whose chosen file has them (L40S's, SGLang's, has none)
    for gpus in ("training", "held_out"):
        parts.append(mk.gemm_rows(gpus, mk.FP8_BLOCK).assign(kind=mk.FP8_BLOCK))
    return pd.concat(parts, ignore_index=True)


#: tensor-core settings that may differ between saved weights and the recipe when completing (they name networks)
COMPLETED_KEYS = ("networks", "fp8_quantiser")


def _value(nets, key: str, net: str):
    """A tensor-core setting as network ``net`` reads it; None for a {network: value} setting that does not name it
    (``gemm_inputs`` names the GEMM networks only)."""
    if key == "gemm_inputs" and net not in tc.GEMM_NETWORKS:
        return None              # read by the GEMM networks only
    try:
        return nets.value(key, net)
    except KeyError:
        return None


def complete(seed: int, quick: bool, name: str = "neusight") -> list[str]:
    """Complete saved weights of ``name`` / ``seed`` whose recipe lacked some of today's tensor-core networks and
    matches it otherwise (every FP32 setting, and every setting of every network they have, as that network reads
    it): train the missing networks alone and save. Returns the networks trained ([] when the weights are current,
    absent, or differ in anything else: ``predictors.get`` then trains them whole)."""
    if predictors.is_trained(name, quick, seed):
        return []
    f = predictors.folder(name, quick, seed)
    try:
        old = predictors.load(name, f)
    except (predictors.PredictorLoadError, OSError):
        return []
    new = predictors.create(name, seed)
    if old.tc is None or new.tc is None:
        return []
    rest = lambda c: {k: v for k, v in c.items() if k != "tensor_core"}   # noqa: E731
    if rest(old.config) != rest(new.config):
        return []
    keys = (set(old.tc.config) | set(new.tc.config)) - set(COMPLETED_KEYS)
    for net in old.tc.config["networks"]:
        if any(_value(old.tc, k, net) != _value(new.tc, k, net) for k in keys):
            return []
    missing = [n for n in new.tc.config["networks"] if n not in old.tc.nets]
    if not missing:
        return []
    new.set_state(old.get_state())
    new.info, new.fitted = old.info, True
    add = tc.TensorCoreNets({**new.tc.config, "networks": missing}, seed=seed)
    info = add.fit(mk.training_kernels(tuple(missing)), quick=quick, law=predictors.memory_law_params())
    new.tc.nets.update(add.nets)
    new.tc.norm.update(add.norm)
    new.info.setdefault("tensor_core", {}).setdefault("networks", {}).update(info["networks"])
    new.info["completed"] = {"networks": missing, "seconds": info["train_seconds"]}
    new.save(f)
    return missing


class GemmNets:
    """The recipe's GEMM networks alone (GEMM and GEMM_fp8), trained here for one seed with the recipe's settings:
    the same weights the full recipe trains for them (each network seeded apart, on its own rows), without the FP32
    classes' hours on a loaded 2-core machine. Nothing is saved."""

    def __init__(self, seed: int, quick: bool):
        cfg = {**predictors.create("neusight", seed).config["tensor_core"], "networks": ["GEMM", "GEMM_fp8"]}
        self.law = predictors.memory_law_params()
        self.nets = tc.TensorCoreNets(cfg, seed=seed)
        self.nets.fit(mk.training_kernels(("GEMM", "GEMM_fp8")), quick=quick, law=self.law)

    def predict(self, df: pd.DataFrame, device=None):
        return self.nets.predict(df, device, law=self.law)


def score(df: pd.DataFrame, seed: int, quick: bool, nets_only: bool = False) -> pd.DataFrame:
    p = GemmNets(seed, quick) if nets_only else predictors.get("neusight", quick=quick, seed=seed)
    pred = p.predict(df, None)
    ape = error_metric.ape(df["latency_ms"].to_numpy(float), pred)
    err = (pred / df["latency_ms"].to_numpy(float) - 1) * 100
    t = df[["device", "role", "kind"]].assign(seed=seed, ape=ape, err=err)
    return (t.groupby(["role", "device", "kind", "seed"])
            .agg(rows=("ape", "size"), mape=("ape", "mean"), median_ape=("ape", "median"),
                 p90_ape=("ape", lambda a: float(np.percentile(a, 90))), bias=("err", "mean")).reset_index())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="quick weights (1,000 rows per GPU, 4 epochs)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--out", help="write the per-seed table as CSV")
    ap.add_argument("--nets-only", action="store_true",
                    help="train the GEMM networks alone for each seed (GemmNets) instead of loading the full weights")
    a = ap.parse_args(argv)
    for seed in [] if a.nets_only else a.seeds.split(","):
        done = complete(int(seed), a.quick)
        if done:
            print(f"seed {seed}: completed the saved weights with {', '.join(done)}", flush=True)
    df = rows()
    per_seed = pd.concat([score(df, int(s), a.quick, a.nets_only) for s in a.seeds.split(",")], ignore_index=True)
    if a.out:
        per_seed.to_csv(a.out, index=False)
    pd.set_option("display.width", 160)
    print(f"weights: {'quick' if a.quick else 'full'}; seeds {a.seeds}")
    print(per_seed.round(2).to_string(index=False))
    mean = per_seed.groupby(["role", "device", "kind"]).agg(rows=("rows", "first"), mape=("mape", "mean"),
                                                            mape_spread=("mape", lambda m: m.max() - m.min()),
                                                            bias=("bias", "mean")).reset_index()
    print("\nmean over the seeds:")
    print(mean.round(2).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
