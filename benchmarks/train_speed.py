"""Training speed of one op class with and without flush-to-zero (``predictors.nets.flush_denormals``).

Trains the class alone (as benchmarks/class_search.py does, on the recipe's own records) for a few epochs,
once with the CPU's denormals flushed to zero, as training runs, and once without, one thread, one run
after the other, and prints the seconds of each and whether the validation MAPE after every epoch is the
same. Run it on an otherwise idle machine: the two numbers share nothing else.

    .venv/bin/python benchmarks/train_speed.py --recipe neusight-paper --cls LINEAR --epochs 6
"""
from __future__ import annotations

import argparse
import contextlib
import json
import time

from class_search import one_class     # benchmarks/ is on the path when this script runs
from neusight_core import predictors as P
from neusight_core.data import dataset
from neusight_core.predictors import nets


def train_once(recipe: str, cls: str, epochs: int, seed: int, flush: bool) -> dict:
    p = one_class(recipe, cls, {"epochs": {cls: epochs}}, seed)
    train = dataset.training_data()
    saved = nets.flush_denormals
    if not flush:
        nets.flush_denormals = contextlib.nullcontext
    try:
        t0 = time.perf_counter()
        p.fit(P.data_for(p, train))
        secs = time.perf_counter() - t0
    finally:
        nets.flush_denormals = saved
    return {"flush": flush, "seconds": round(secs, 1), "val_history": p.info["classes"][cls]["val_history"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipe", default="neusight-paper")
    ap.add_argument("--cls", required=True)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    import torch
    # the first optimiser of a process imports torch's compiler modules (about a second): not part of either run
    torch.optim.AdamW([torch.zeros(1, requires_grad=True)], fused=True)
    runs = [train_once(a.recipe, a.cls, a.epochs, a.seed, flush) for flush in (True, False)]
    same = runs[0]["val_history"] == runs[1]["val_history"]
    print(json.dumps({"recipe": a.recipe, "cls": a.cls, "epochs": a.epochs, "seed": a.seed,
                      "seconds_flush": runs[0]["seconds"], "seconds_no_flush": runs[1]["seconds"],
                      "speedup": round(runs[1]["seconds"] / runs[0]["seconds"], 2),
                      "same_val_history": same, "val_history": runs[0]["val_history"]}))


if __name__ == "__main__":
    main()
