"""One validation (issue 23): predict and the sweep accept and refuse the same requests, with the same line."""
from __future__ import annotations

import pandas as pd
import pytest

from neusight_core.cost import scenario
from neusight_core.cost import sweep
from neusight_core.cost.scenario import LatencyInputError

BAD = [
    dict(batch=10**9),                                   # the absurd-memory guard (the sweep lacked it)
    dict(gpus=2),                                        # GPUs without a plan
    dict(parallel="tp", gpus=3),                         # 20 heads do not split 3 ways
    dict(parallel="pp", gpus=64),                        # more stages than layers
    dict(parallel="dp", gpus=4, batch=6),                # global batch not divisible
    dict(link_gbs=100.0),                                # a link without a plan
    dict(micro_batches=2),                               # micro-batches without pp
    dict(mode="eval"),
    dict(dtype="fp4"),
    dict(image_size=224),                                # an image size for a text model
]


def _req(**over):
    r = dict(model="gpt2_large", device="H100", batch=4, seq=128, mode="inf")
    r.update(over)
    return r


@pytest.mark.parametrize("over", BAD, ids=[",".join(f"{k}={v}" for k, v in d.items()) for d in BAD])
def test_sweep_rows_are_refused_like_predict(over):
    r = _req(**over)
    with pytest.raises(ValueError) as direct:
        scenario.scenario(r.pop("model"), r.pop("device"), r.pop("batch"), r.pop("seq"), r.pop("mode"), **r)
    row = sweep.run(pd.DataFrame([_req(**over)]), ["roofline"], quick=True, progress=False).iloc[0]
    assert str(direct.value).splitlines()[0] in row["error"]          # the same sentence, in the row
    assert pd.isna(row["e2e_ms"])


def test_scenario_defaults_and_image_sizes():
    sc = scenario.scenario("gpt2_large", "H100", 8, 128, "train", parallel="dp")
    assert sc.gpus == 4 and sc.link_gbs == 900.0 and sc.device == "NVIDIA_H100_80GB_HBM3"   # the paper's 4, NVLink
    assert not sc.image and sc.seq == 128 and sc.image_size is None and sc.size == 128
    im = scenario.scenario("resnet50", "A100", 32, mode="inf")
    assert im.image and im.image_size == 224 and im.seq is None and im.size == 224
    with pytest.raises(LatencyInputError, match="image model"):
        scenario.scenario("resnet50", "A100", 32, 128)
    # one field per meaning: a scenario is a text request or an image request, never both or neither
    text = scenario.scenario("gpt2_large", "H100", 1, 128).as_dict()
    with pytest.raises(LatencyInputError, match="exactly one: got seq=128, image_size=224"):
        scenario.Scenario(**{**text, "image_size": 224})
    with pytest.raises(LatencyInputError, match="exactly one: got seq=None, image_size=None"):
        scenario.Scenario(**{**text, "seq": None})
    with pytest.raises(LatencyInputError, match="no link bandwidth known"):
        scenario.scenario("gpt2_large", "L4", 4, 128, parallel="dp", gpus=2)   # L4: PCIe only, no link in the catalogue
