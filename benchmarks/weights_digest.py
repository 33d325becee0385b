"""One line per trained full-weights folder: where and how long it trained, its validation MAPE per class, and a
digest of its arrays (sha256 over the arrays in key order), so weights trained on two machines can be compared
bit for bit without moving 37 MB folders (docs/tier2/; the device session's ``gpu_session.sh``).

    python benchmarks/weights_digest.py --predictors neusight-paper,neusight --seeds 0,1,2 [--quick] > weights.csv
"""
import argparse
import hashlib
import json
import sys

import numpy as np
import pandas as pd

from neusight_core.predictors import training


def digest(state_file) -> str:
    h = hashlib.sha256()
    with np.load(state_file) as z:
        for k in sorted(z.files):
            a = z[k]
            h.update(k.encode() + str(a.dtype).encode() + str(a.shape).encode() + np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


def row(name: str, seed: int, quick: bool) -> dict:
    f = training.folder(name, quick, seed)
    try:
        info = json.loads((f / "meta.json").read_text()).get("info", {})
        d = digest(f / "state.npz")
    except (OSError, ValueError) as e:
        return {"predictor": name, "seed": seed, "error": f"{type(e).__name__}: {e}"[:200]}
    r = {"predictor": name, "seed": seed, "train_seconds": round(info.get("train_seconds", float("nan")), 1),
         "trained_on": info.get("trained_on", ""), "digest": d}
    for c, v in info.get("classes", {}).items():
        r[f"val_mape_{c}"] = round(v["val_mape"], 4) if v.get("val_mape") is not None else None
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--predictors", default="neusight-paper,neusight")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    rows = [row(n, int(s), a.quick) for n in a.predictors.split(",") for s in a.seeds.split(",")]
    pd.DataFrame(rows).to_csv(sys.stdout, index=False)


if __name__ == "__main__":
    main()
