"""Issue 26, trace side: image models (ResNet, ViT) traced with pixel_values, the CONV rows' dims / FLOPs /
bytes against the conv formulas, the --image-size / --seq errors, memory and the sweep."""

import numpy as np
import pytest

from neusight_core.question.step import Step
from neusight_core.tracing import table_info, trace
from neusight_core.cost import latency, memory, sweep, tables
from neusight_core.question import schema
from neusight_core.__main__ import main as cli

# A two-stage bottleneck ResNet small enough to count by hand: stem 7x7/2 to 8 channels, max pool 3x3/2,
# stage 1 (stride 1) to 16 channels, stage 2 (stride 2) to 32 channels, one bottleneck block each.
TINY_RESNET = {"model_type": "resnet", "architectures": ["ResNetForImageClassification"], "num_channels": 3,
               "embedding_size": 8, "hidden_sizes": [16, 32], "depths": [1, 1], "layer_type": "bottleneck",
               "hidden_act": "relu", "downsample_in_first_stage": False, "downsample_in_bottleneck": False,
               "num_labels": 10, "name": "tiny_resnet"}
TINY_VIT = {"model_type": "vit", "architectures": ["ViTForImageClassification"], "hidden_size": 32,
            "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64, "image_size": 32,
            "patch_size": 8, "num_channels": 3, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0,
            "num_labels": 10, "name": "tiny_vit"}
B, SIZE = 2, 32


@pytest.fixture
def cache_dir(tmp_path, monkeypatch, release_root):
    monkeypatch.setenv("NEUSIGHT_TRACE_CACHE", str(tmp_path / "trace_cache"))
    return tmp_path / "trace_cache"


def _resnet_convs(cfg: dict, size: int) -> list[tuple]:
    """(cin, cout, k, in, stride, pad) of every convolution of a bottleneck ResNet, from its config and the
    architecture (He et al. 2015, Table 1 and Fig. 5; stride on the 3x3, "v1.5"): a 7x7/2 stem, a 3x3/2 max
    pool, then per stage blocks of 1x1 (width / 4), 3x3, 1x1 (width), with a 1x1 projection shortcut where
    the channels or the side change. Padding k // 2 everywhere."""
    out = lambda i, k, s, p: (i + 2 * p - k) // s + 1     # noqa: E731
    convs = [(cfg["num_channels"], cfg["embedding_size"], 7, size, 2, 3)]
    side = out(out(size, 7, 2, 3), 3, 2, 1)                # stem, then the max pool
    cin = cfg["embedding_size"]
    for st, (width, depth) in enumerate(zip(cfg["hidden_sizes"], cfg["depths"])):
        for blk in range(depth):
            stride = 2 if blk == 0 and (st > 0 or cfg["downsample_in_first_stage"]) else 1
            mid = width // 4
            if cin != width or stride != 1:
                convs.append((cin, width, 1, side, stride, 0))
            convs += [(cin, mid, 1, side, 1, 0), (mid, mid, 3, side, stride, 1)]
            side = out(side, 3, stride, 1)
            convs.append((mid, width, 1, side, 1, 0))
            cin = width
    return convs


def _expected(conv, sub_op, batch=B):
    """M, N, K, FLOPs, bytes read, bytes written of one FP32 conv row (docs/interfaces.md, CONV rows)."""
    cin, cout, k, i, s, p = conv
    o = (i + 2 * p - k) // s + 1
    x, w, y = batch * cin * i * i, cout * cin * k * k, batch * cout * o * o
    M, N, K = {"fwd": (batch * o * o, cin * k * k, cout), "dgrad": (batch * i * i, cout * k * k, cin),
               "wgrad": (cout, batch * o * o, cin * k * k)}[sub_op]
    rw = {"fwd": (x + w, y), "dgrad": (y + w, x), "wgrad": (y + x, w)}[sub_op]
    return (M, N, K, 2.0 * M * N * K, 4.0 * rw[0], 4.0 * rw[1])


def test_conv_is_one_op_class_in_the_schema():
    assert schema.OP_CLASSES.index("CONV") == schema.OP_CLASSES.index("LAYERNORM") + 1
    assert schema.CLASS_LABEL["CONV"] == "Conv"


def test_a_small_resnet_has_the_conv_rows_of_its_config():
    k = trace.trace_model(Step(model=dict(TINY_RESNET), batch=B, seq=SIZE, mode="train"))
    convs = _resnet_convs(TINY_RESNET, SIZE)
    assert len(convs) == 9
    conv = k[k.op_class == "CONV"]
    assert (conv.conv_groups == 1).all() and (conv.B == B).all() and conv.H.isna().all()
    for sub_op, phase, expect in (("fwd", "fw", convs), ("dgrad", "bw", convs[1:]), ("wgrad", "bw", convs)):
        # the stem's input is the image: no gradient asked for it, so no dgrad row
        rows = conv[conv.sub_op == sub_op]
        assert (rows.phase == phase).all() and len(rows) == len(expect), sub_op
        got = sorted(tuple(int(v) for v in r[:6]) + tuple(float(v) for v in r[6:])
                     for r in rows[list(schema.CONV_COLUMNS[:6]) + ["M", "N", "K", "flops", "bytes_read", "bytes_written"]]
                     .to_numpy())
        want = sorted(c + _expected(c, sub_op) for c in expect)
        assert got == [tuple(float(v) if j >= 6 else v for j, v in enumerate(w)) for w in want], sub_op
    # a backward launch is split into its two gradients: same aten op for both
    assert set(conv[conv.phase == "bw"].aten_op) == {"aten.convolution_backward.default"}
    assert set(conv[conv.phase == "fw"].aten_op) == {"aten.convolution.default"}
    assert (conv.precision == "fp32").all()


def test_batch_norm_pooling_and_activations_of_a_resnet():
    inf = trace.trace_model(Step(model=dict(TINY_RESNET), batch=B, seq=SIZE, mode="inf"))
    tr = trace.trace_model(Step(model=dict(TINY_RESNET), batch=B, seq=SIZE, mode="train"))
    assert not table_info.info(inf).unclassified and not table_info.info(tr).unclassified
    n_bn = 9                                    # one batch norm after every conv
    for k, per in ((inf, 2), (tr, 6)):          # inference: scale + shift; training: as layer norm (SPEC 3.1)
        bn = k[k.aten_op.str.contains("batch_norm") & (k.phase == "fw")]
        assert len(bn) == n_bn and set(bn.op_class) == {"VEC"} and set(bn.sub_op) == {"mul"}
        fw_conv = k[(k.op_class == "CONV") & (k.phase == "fw")]
        # each batch norm normalises its conv's output: per-element FLOPs x that many elements
        assert sorted(bn.flops) == sorted(per * fw_conv.bytes_written / 4)
    assert (tr.aten_op == "aten.native_batch_norm_backward.default").sum() == n_bn
    pool = inf[inf.aten_op.str.startswith("aten.max_pool2d")]
    assert list(pool.op_class) == ["MEM"]
    # reads the stem's output (8 x 16 x 16 per image), writes the pooled values and their int64 indices
    assert pool.bytes_read.iloc[0] == 4 * B * 8 * 16 * 16 and pool.bytes_written.iloc[0] == (4 + 8) * B * 8 * 8 * 8
    assert (inf.sub_op == "relu").sum() >= 7   # after the stem and inside the blocks
    assert "VEC" in set(inf[inf.aten_op == "aten.mean.dim"].op_class)     # global average pool


def test_vit_rows_patch_conv_attention_and_mlp():
    k = trace.trace_model(Step(model=dict(TINY_VIT), batch=B, seq=SIZE, mode="train"))
    tokens = (SIZE // 8) ** 2 + 1                        # 16 patches + [CLS]
    conv = k[k.op_class == "CONV"]
    assert list(conv.sub_op) == ["fwd", "wgrad"]        # no gradient of the pixels
    fwd = conv.iloc[0]
    assert (fwd.conv_cin, fwd.conv_cout, fwd.conv_k, fwd.conv_stride, fwd.conv_pad, fwd.conv_in) == (3, 32, 8, 8, 0, 32)
    assert (fwd.M, fwd.N, fwd.K) == (B * 16, 3 * 64, 32) and fwd.flops == 2 * B * 16 * 3 * 64 * 32
    # the patch conv has a bias: added by its own kernel after the conv, and its gradient is a per-channel
    # sum of the output gradient (one VEC row each)
    bias = k[k.aten_op.str.startswith("aten.convolution") & (k.op_class == "VEC")]
    assert list(bias.phase) == ["fw", "bw"] and set(bias.sub_op) == {"add"}
    assert bias.flops.iloc[0] == B * 32 * 16 and bias.bytes_written.iloc[0] == 4 * B * 32 * 16
    assert (bias.B.iloc[1], bias.H.iloc[1]) == (32, B * 16) and bias.flops.iloc[1] == B * 32 * 16
    qk = k[(k.op_class == "BMM") & (k.phase == "fw")]
    assert len(qk) == 2 * 2 and set(zip(qk.B, qk.M)) == {(B * 2, tokens)}
    assert set(qk.N) == {16, tokens} and set(qk.K) == {16, tokens}
    lin = k[(k.op_class == "LINEAR") & (k.phase == "fw") & (k.layer >= 0)]
    assert len(lin) == 2 * 6 and set(lin.M) == {B * tokens}
    assert k[k.op_class != "CONV"][list(schema.CONV_COLUMNS)].isna().all().all()
    # a ViT is built for the image side asked: 48 x 48 -> 36 patches + [CLS]
    k48 = trace.trace_model(Step(model=dict(TINY_VIT), batch=B, seq=48, mode="inf"))
    assert set(k48[(k48.op_class == "BMM")].M) == {(48 // 8) ** 2 + 1}
    assert table_info.info(k48).image_size == 48 and table_info.info(k).image_size == SIZE


def test_image_models_are_traced_not_derived(release_root):
    from neusight_core.tracing import table_families
    assert table_families.family_for("resnet50", 2, 224, "inf") is None and table_families.family_for("vit_b16", 3, 224, "train") is None


def test_text_traces_have_no_conv_rows_and_empty_conv_columns(release_root):
    k = trace.trace_model(Step(model="gpt2_large", batch=1, seq=8, mode="inf"))
    assert "CONV" not in set(k.op_class) and k[list(schema.CONV_COLUMNS)].isna().all().all()
    assert table_info.info(k).image_size == 0


def test_bf16_and_tf32_conv_rows():
    bf = trace.trace_model(Step(model=dict(TINY_RESNET), batch=B, seq=SIZE, mode="inf", dtype="bf16"))
    fp = trace.trace_model(Step(model=dict(TINY_RESNET), batch=B, seq=SIZE, mode="inf"))
    c_bf, c_fp = bf[bf.op_class == "CONV"], fp[fp.op_class == "CONV"]
    assert set(c_bf.precision) == {"bf16"}
    assert np.allclose(c_bf.bytes_read.to_numpy() * 2, c_fp.bytes_read.to_numpy())
    tf = trace.trace_model(Step(model=dict(TINY_RESNET), batch=B, seq=SIZE, mode="inf", dtype="tf32"))
    assert set(tf[tf.op_class == "CONV"].precision) == {"tf32"}


def test_image_models_refuse_a_kv_cache():
    with pytest.raises(trace.TraceError, match="KV cache"):
        trace.trace_model(Step(model=dict(TINY_RESNET), batch=B, seq=SIZE, mode="inf", past=4))


def test_another_vision_type_is_refused_in_one_line(tmp_path, capsys):
    """A vision config outside resnet / vit (DINOv2) says so, with --seq or --image-size, instead of failing inside
    transformers on token ids ('NoneType' object has no attribute 'shape')."""
    f = tmp_path / "dinov2.json"
    f.write_text('{"architectures": ["Dinov2Model"], "model_type": "dinov2", "hidden_size": 64, "intermediate_size": 128, '
                 '"num_attention_heads": 2, "num_hidden_layers": 2, "image_size": 56, "patch_size": 14, "num_channels": 3}')
    for size in (["--seq", "64"], ["--image-size", "56"]):
        assert cli(["predict", "--model", str(f), "--device", "A100", "--batch", "2", "--quick", *size]) == 2
        assert "'dinov2' takes images" in _one_error_line(capsys)
    with pytest.raises(trace.TraceError, match="the image models traced here are resnet, vit"):
        trace.trace_model(Step(model=str(f), batch=2, seq=64, mode="inf"))


def _one_error_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:"), err
    return err[0]


@pytest.mark.parametrize("args, text", [
    (["--model", "resnet50", "--seq", "224"], "--seq is for text models: resnet50 is an image model"),
    (["--model", "vit_b16", "--seq", "197"], "--seq is for text models"),
    (["--model", "gpt2_large", "--image-size", "224"], "--image-size is for image models: gpt2_large is a text model"),
    (["--model", "gpt2_large"], "give its sequence length (--seq)"),
    (["--model", "resnet50", "--past", "8"], "a KV cache (--past) is for text decoders"),
    (["--model", "resnet50", "--image-size", "0"], "image size must be a positive integer"),
    (["--model", "vit_b16", "--parallel", "tp", "--gpus", "2"], "tp is not modelled for image models"),
])
def test_cli_refuses_the_size_option_of_the_other_kind(args, text, capsys, release_root):
    assert cli(["predict", "--device", "A100", "--batch", "8", "--quick"] + args) == 2
    assert text in _one_error_line(capsys)


@pytest.mark.parametrize("args, text", [
    (["--model", "resnet50,vit_b16", "--seq", "128"], "--seq is for text models"),
    (["--model", "gpt2_large", "--seq", "128", "--image-size", "224"], "--image-size is for image models"),
    (["--model", "gpt2_large,resnet50", "--image-size", "224"], "give the sequence length(s) (--seq)"),
])
def test_sweep_refuses_the_size_option_of_the_other_kind(args, text, capsys, tmp_path, monkeypatch, release_root):
    monkeypatch.setattr(sweep, "run", lambda *a, **k: pytest.fail("computed before refusing"))
    assert cli(["sweep", "--device", "A100", "--batch", "8", "--predictor", "roofline", "--quick",
                "--out", str(tmp_path / "s.csv")] + args) == 2
    assert text in _one_error_line(capsys)


def test_resnet50_memory_footprint(cache_dir):
    k = tables.trace(Step(model="resnet50", batch=32, seq=224, mode="train"))
    # 25,557,032 parameters: torchvision's resnet50 (IMAGENET1K_V1 / V2 weights, "num_params"), same layers
    assert sum(table_info.info(k).params.values()) == 25_557_032
    m = memory.footprint(k, "A100", optimizer="adamw")
    assert m["weights_gib"] == pytest.approx(25_557_032 * 4 / 2**30)
    assert m["optimizer_gib"] == pytest.approx(2 * m["weights_gib"]) and m["fits"]
    # every forward conv output is saved for backward (its batch norm needs it): all alive at the peak
    fw_conv = k[(k.op_class == "CONV") & (k.phase == "fw")]
    assert m["activations_gib"] * 2**30 >= fw_conv.bytes_written.sum()
    k64 = tables.trace(Step(model="resnet50", batch=64, seq=224, mode="train"))
    assert memory.footprint(k64, "A100")["activations_gib"] == pytest.approx(2 * m["activations_gib"], rel=0.05)


def test_every_catalogue_gpu_answers_resnet50_and_vit(cache_dir):
    from neusight_core.data import devices
    gpus = list(devices.list_devices()["name"])
    df = sweep.sweep(["resnet50", "vit_b16"], gpus, [32], modes=["inf", "train"], dtype=["fp32", "bf16"],
                     predictors=["roofline"], quick=True, progress=False)
    assert len(df) == 2 * len(gpus) * 2 * 2
    assert (df.error == "").all(), df[df.error != ""].error.iloc[0]
    assert (df.e2e_ms > 0).all() and (df.CONV_ms > 0).all() and df.seq.isna().all() and (df.image_size == 224).all()
    assert (df[df["mode"] == "train"].bw_ms > 0).all() and not df.derived.any()
    # the sweep and a single question give the same number
    r = latency.predict_model("resnet50", "A100", 32, mode="train", image_size=224, predictor="roofline", dtype="bf16")
    row = df[(df.model == "resnet50") & (df["mode"] == "train") & (df.dtype == "bf16")
             & (df.device == devices.get_device("A100").name)]
    assert row.e2e_ms.iloc[0] == pytest.approx(r["e2e_ms"], rel=1e-9)
    assert r["conv_note"] == ""                  # the roofline baseline's convolutions are its own method


def test_conv_rows_take_the_roofline_with_a_note_without_a_conv_model(cache_dir, capsys):
    from neusight_core.predictors import common
    # the authors' recipe has no CONV network (ours has one since the issue-26 predictor side)
    assert latency.conv_by_roofline("neusight-paper", quick=True)
    assert not latency.conv_by_roofline("neusight", quick=True)
    assert cli(["predict", "--model", "resnet50", "--device", "A100", "--batch", "32", "--quick",
                "--predictor", "neusight-paper"]) == 0
    out = capsys.readouterr().out
    assert "resnet50 inf batch=32 image=224x224 fp32" in out
    assert "NOTE: convolutions (" in out and "predicted by the roofline" in out
    ours = latency.predict_model("resnet50", "A100", 32, image_size=224, quick=True)
    # ours: ResNet-50's 1 x 1 and strided convolutions are outside the measured set, and the note says so
    assert ours["e2e_ms"] > 0 and "extrapolations" in ours["conv_note"] and "roofline" not in ours["conv_note"]
    r = latency.predict_model("resnet50", "A100", 32, image_size=224, quick=True, predictor="neusight-paper")
    k = r["kernels"]
    conv = k[k.op_class == "CONV"]
    dev = common.device_arrays(conv, "A100")
    # compute-bound: FLOPs / the FP32 GEMM peak (not bytes / bandwidth as a MEM row)
    assert np.allclose(conv.pred_ms, common.roofline_ms(conv, dev))
    assert conv.pred_ms.sum() > (conv.bytes_read + conv.bytes_written).sum() / (dev["mem_bw_gbs"][0] * 1e9) * 1e3


def test_the_python_api_takes_an_image_size_not_a_seq_for_an_image_model():
    """One field per meaning (issue 35): ``seq`` is a text model's length, ``image_size`` an image model's side, in
    ``latency.predict_model`` as on the command line."""
    with pytest.raises(latency.LatencyInputError, match="--seq is for text models: resnet50 is an image model"):
        latency.predict_model("resnet50", "A100", 32, 224, predictor="roofline")
    with pytest.raises(latency.LatencyInputError, match="--image-size is for image models"):
        latency.predict_model("gpt2_large", "A100", 1, image_size=224, predictor="roofline")
    a = latency.predict_model("resnet50", "A100", 32, predictor="roofline")                  # 224 by default
    b = latency.predict_model("resnet50", "A100", 32, image_size=224, predictor="roofline")
    assert a["e2e_ms"] == b["e2e_ms"] > 0
