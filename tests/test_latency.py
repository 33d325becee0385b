"""Model latency aggregation and the network model, on hand-made kernel tables (no tracing)."""
import numpy as np
import pandas as pd
import pytest

from neusight_core.cost import latency, network


def _table(rows):
    cols = ["phase", "op_class", "flops", "count", "comm_kind", "comm_bytes", "overlap", "stage"]
    df = pd.DataFrame(rows, columns=cols)
    return df


class FlopsPredictor:
    """1 ms per GFLOP per launch: easy to sum by hand."""
    name = "fake"

    def predict(self, kernels, device):
        return np.where(kernels["op_class"] == "COMM", 0.0, kernels["flops"].fillna(0) / 1e9)


K = _table([
    ("fw", "LINEAR", 2e9, 3, None, np.nan, False, 0),
    ("fw", "VEC", 1e9, 1, None, np.nan, False, 0),
    ("bw", "LINEAR", 4e9, 3, None, np.nan, False, 0),
    ("acc", "VEC", 0.5e9, 2, None, np.nan, False, 0),
])


def test_aggregation_sums_equal_kernel_sums():
    k = latency.predict_kernels(K, device=object(), predictor=FlopsPredictor())
    # pred_ms is per launch x count
    assert k["pred_ms"].tolist() == [6.0, 1.0, 12.0, 1.0]
    r = latency.aggregate(k)
    assert r["fw_ms"] == 7.0 and r["bw_ms"] == 12.0 and r["acc_ms"] == 1.0
    assert r["e2e_ms"] == pytest.approx(k["pred_ms"].sum())
    assert sum(r["breakdown"].values()) == pytest.approx(r["e2e_ms"])
    assert r["breakdown"]["LINEAR"] == 18.0


def test_ring_allreduce_and_sendrecv_formula():
    net = network.NetworkModel(link_gbs=600, gpus=4, efficiency=0.72)
    eff = 600 * 0.72 / 2 * 1e9
    assert net.allreduce_ms(1e9) == pytest.approx(2 * 3 / 4 * 1e9 / eff * 1e3)
    assert net.sendrecv_ms(1e9) == pytest.approx(1e9 / eff * 1e3)
    assert network.NetworkModel(link_gbs=600, gpus=1).allreduce_ms(1e9) == 0.0


@pytest.mark.parametrize("bad", [dict(link_gbs=0), dict(link_gbs=100, gpus=0), dict(link_gbs=100, efficiency=1.5)])
def test_network_rejects_bad_parameters(bad):
    with pytest.raises(network.NetworkError):
        network.NetworkModel(**bad)


def test_overlapped_allreduce_hides_under_backward_only_up_to_its_length():
    comm = ("comm", "COMM", np.nan, 1, "allreduce", 0.0, True, 0)
    for nbytes, exposed in ((1e6, 0.0), (1e11, None)):
        k = pd.concat([K, _table([comm[:5] + (nbytes,) + comm[6:]])], ignore_index=True)
        net = network.NetworkModel(link_gbs=600, gpus=4)
        r = latency.aggregate(latency.predict_kernels(k, object(), FlopsPredictor(), net=net))
        t = net.allreduce_ms(nbytes)
        if exposed == 0.0:
            assert r["comm_exposed_ms"] == 0.0 and r["e2e_ms"] == 20.0
        else:
            assert r["comm_exposed_ms"] == pytest.approx(t - 13.0)
            assert r["e2e_ms"] == pytest.approx(7.0 + t)


def test_comm_time_scales_with_link_bandwidth():
    k = pd.concat([K, _table([("comm", "COMM", np.nan, 2, "allreduce", 5e8, False, 0),
                              ("comm", "COMM", np.nan, 1, "sendrecv", 5e8, False, 0)])], ignore_index=True)
    times = []
    for bw in (300, 600):
        r = latency.aggregate(latency.predict_kernels(k, object(), FlopsPredictor(),
                                                      net=network.NetworkModel(link_gbs=bw, gpus=4)))
        times.append(r["comm_ms"])
    assert times[0] == pytest.approx(2 * times[1])


def test_pipeline_stages_with_micro_batches():
    k = _table([("fw", "LINEAR", 2e9, 1, None, np.nan, False, 0),
                ("fw", "LINEAR", 4e9, 1, None, np.nan, False, 1),
                ("comm", "COMM", np.nan, 1, "sendrecv", 0.0, False, 0)])
    k = latency.predict_kernels(k, object(), FlopsPredictor(), net=network.NetworkModel(600, gpus=2))
    assert latency.aggregate(k, micro_batches=1)["e2e_ms"] == pytest.approx(6.0)
    # GPipe: sum of stages + (m - 1) x slowest stage
    assert latency.aggregate(k, micro_batches=4)["e2e_ms"] == pytest.approx(6.0 + 3 * 4.0)


def test_comm_rows_without_network_model_are_an_error():
    k = _table([("comm", "COMM", np.nan, 1, "allreduce", 1.0, False, 0)])
    with pytest.raises(latency.LatencyInputError, match="network"):
        latency.predict_kernels(k, object(), FlopsPredictor())


@pytest.mark.parametrize("kw,msg", [(dict(batch=0), "batch"), (dict(seq=-1), "sequence"),
                                    (dict(mode="serve"), "mode"), (dict(parallel="zp"), "plan")])
def test_bad_arguments_give_one_line_errors(kw, msg):
    args = dict(model="gpt2_large", device="x", batch=1, seq=8, mode="inf")
    args.update(kw)
    with pytest.raises(latency.LatencyInputError, match=msg) as e:
        latency.predict_model(**args)
    assert "\n" not in str(e.value)
