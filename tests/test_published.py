"""Published whole-model measurements beside our predictions (issue 26)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from neusight_core.data import devices
from neusight_core.studies import published


def test_the_published_rows_name_their_source_and_a_catalogue_gpu():
    t = published.load()
    assert len(t) >= 8 and set(t.model) == {"resnet50"}
    assert t.source.str.contains("DeepLearningExamples").all() and (t.latency_ms > 0).all()
    for g in set(t.gpu):
        devices.get_device(g)                    # every row maps to a catalogue GPU
    # the V100 rows say what they were measured on, since the catalogue's V100 is another board
    assert t[t.gpu.str.contains("V100")].measured_on.str.contains("SXM2").all()


def test_compare_predicts_each_row_under_its_settings(release_root):
    t = published.load()
    t = pd.concat([t.head(2), t.head(1).assign(gpu="NoSuchGPU")], ignore_index=True)
    out = published.compare("roofline", table=t)
    ok = out[out.error == ""]
    assert len(ok) == 2 and (ok.predicted_ms > 0).all() and (out.label == published.LABEL).all()
    np.testing.assert_allclose(ok.ape, (ok.predicted_ms - ok.latency_ms).abs() / ok.latency_ms * 100)
    # batch 8 costs more than batch 1 on the same GPU (the roofline of 8 images)
    assert ok.predicted_ms.iloc[1] > ok.predicted_ms.iloc[0]
    assert "NoSuchGPU" in out.error.iloc[2] and np.isnan(out.predicted_ms.iloc[2])


def test_a_throughput_row_becomes_the_latency_of_one_iteration():
    t = published.load()
    tr = t[t.throughput_img_s.notna()]
    assert len(tr) >= 2 and set(tr["mode"]) == {"train"}
    # V100 FP32: 112 images at 367 img/s -> 305.2 ms per iteration (by hand)
    v = tr[tr.gpu.str.contains("V100")].iloc[0]
    assert v.batch == 112 and abs(v.latency_ms - 305.177) < 1e-3
    assert t[t.throughput_img_s.isna()].latency_ms.notna().all()      # latency rows keep their own value


def test_summary_and_panels_group_by_setting():
    t = published.load().assign(predictor="x", error="", predicted_ms=1.0)
    t["ape"] = [5.0, 30.0] + [10.0] * (len(t) - 2)
    s = published.summary(t)
    first = s[(s.gpu == t.gpu.iloc[0]) & (s["mode"] == "inf")].iloc[0]
    assert first.rows == 4 and first.max_ape == 30.0 and first.within_20pct == 3
    titles = [name for name, _ in published.panels(t)]
    assert len(titles) == t.groupby(["gpu", "mode", "precision"]).ngroups
    assert any("TF32 training" in n for n in titles) and any("FP32 inference" in n for n in titles)
