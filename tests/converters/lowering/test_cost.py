"""Cost model: op work against loop oracles, scaling properties, the source-material checks, profiles,
reports, and every op of the five real models."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import numpy as np
import onnx
import onnx.helper as h
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npu_deploy.converters.lowering import pipeline
from npu_deploy.converters.lowering.cost import (SOC_PARTS, SOC_PROFILES, CostReport, EstimatedOp,
                                        EstimatedTransData, OpWork, SocProfile, estimate, get_soc_profile,
                                        model_tensor_types, op_time_us, op_work, transdata_time_us)
from npu_deploy.converters.lowering.options import ConvertOptions
from npu_deploy.errors import InputError, ModelError

F16 = np.dtype("float16")
F32 = np.dtype("float32")


def infer(nodes, inputs, outputs, inits=()):
    """Shapes/dtypes of a one-node model via onnx shape inference (not via the code under test)."""
    g = h.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    m = onnx.shape_inference.infer_shapes(h.make_model(g), strict_mode=True)
    shapes, dtypes = {}, {}
    for vi in list(m.graph.input) + list(m.graph.value_info) + list(m.graph.output):
        tt = vi.type.tensor_type
        shapes[vi.name] = tuple(d.dim_value for d in tt.shape.dim)
        dtypes[vi.name] = np.dtype(h.tensor_dtype_to_np_dtype(tt.elem_type))
    return shapes, dtypes


# ------------------------------------------------------------------------------------------------
# op_work against independent loop oracles

def conv_macs_loop(n, c, m, group, kernel, out_spatial):
    """Count multiply-adds by enumerating every (output element, input channel, kernel tap)."""
    count = 0
    cg = c // group
    for _ in itertools.product(range(n), range(m), *(range(o) for o in out_spatial)):
        for _ in itertools.product(range(cg), *(range(k) for k in kernel)):
            count += 1
    return count


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 2), group=st.integers(1, 3), cpg=st.integers(1, 3), mpg=st.integers(1, 2),
       hw=st.integers(3, 7), k=st.integers(1, 3), stride=st.integers(1, 2), pad=st.integers(0, 1),
       bias=st.booleans())
def test_conv_flops_match_loop_oracle(n, group, cpg, mpg, hw, k, stride, pad, bias):
    c, m = cpg * group, mpg * group
    ins = ["x", "w"] + (["b"] if bias else [])
    node = h.make_node("Conv", ins, ["y"], group=group, strides=[stride, stride],
                       pads=[pad] * 4, kernel_shape=[k, k])
    inputs = [h.make_tensor_value_info("x", 1, [n, c, hw, hw]),
              h.make_tensor_value_info("w", 1, [m, cpg, k, k])]
    if bias:
        inputs.append(h.make_tensor_value_info("b", 1, [m]))
    shapes, dtypes = infer([node], inputs, [h.make_tensor_value_info("y", 1, None)])
    y = shapes["y"]
    work = op_work(node, shapes, dtypes)
    macs = conv_macs_loop(n, c, m, group, (k, k), y[2:])
    assert work.unit == "cube"
    assert work.flops == 2 * macs + (np.prod(y) if bias else 0)
    assert work.bytes_out == np.prod(y) * 4
    assert work.bytes_in == 4 * (n * c * hw * hw + m * cpg * k * k + (m if bias else 0))


@settings(max_examples=25, deadline=None)
@given(group=st.integers(1, 2), cpg=st.integers(1, 3), mpg=st.integers(1, 3), hw=st.integers(2, 5),
       k=st.integers(1, 4), stride=st.integers(1, 3))
def test_conv_transpose_flops_match_scatter_loop(group, cpg, mpg, hw, k, stride):
    c, m = cpg * group, mpg * group
    node = h.make_node("ConvTranspose", ["x", "w"], ["y"], group=group, strides=[stride, stride])
    shapes, dtypes = infer([node], [h.make_tensor_value_info("x", 1, [1, c, hw, hw]),
                                    h.make_tensor_value_info("w", 1, [c, mpg, k, k])],
                           [h.make_tensor_value_info("y", 1, None)])
    # every input element is multiplied into mpg output channels at every kernel tap
    macs = sum(1 for _ in itertools.product(range(c), range(hw), range(hw), range(mpg), range(k),
                                            range(k)))
    assert op_work(node, shapes, dtypes).flops == 2 * macs


@pytest.mark.parametrize("a, b", [((4, 8), (8, 5)), ((2, 1, 4, 8), (3, 8, 5)), ((8,), (8, 5)),
                                  ((3, 4, 8), (8,)), ((2, 3, 6, 7), (2, 3, 7, 2))])
def test_matmul_flops_match_loop_oracle(a, b):
    node = h.make_node("MatMul", ["a", "b"], ["y"])
    shapes, dtypes = infer([node], [h.make_tensor_value_info("a", 10, list(a)),
                                    h.make_tensor_value_info("b", 10, list(b))],
                           [h.make_tensor_value_info("y", 10, None)])
    # oracle: run the product with numpy on index-counting arrays: each output element sums K terms
    k = a[-1]
    count = 0
    out = np.matmul(np.ones(a), np.ones(b))          # every element equals K
    count = int(out.sum())                           # = (#outputs) * K multiply-adds
    assert np.all(out == k)
    work = op_work(node, shapes, dtypes)
    assert work.flops == 2 * count and work.unit == "cube"
    assert work.bytes_in == 2 * (np.prod(a) + np.prod(b))


@pytest.mark.parametrize("trans_a, trans_b", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_gemm_flops(trans_a, trans_b):
    m, k, n = 6, 10, 4
    node = h.make_node("Gemm", ["a", "b", "c"], ["y"], transA=trans_a, transB=trans_b)
    shapes, dtypes = infer([node], [h.make_tensor_value_info("a", 1, [k, m] if trans_a else [m, k]),
                                    h.make_tensor_value_info("b", 1, [n, k] if trans_b else [k, n]),
                                    h.make_tensor_value_info("c", 1, [n])],
                           [h.make_tensor_value_info("y", 1, None)])
    assert op_work(node, shapes, dtypes).flops == 2 * m * n * k + m * n


@pytest.mark.parametrize("direction, dirs", [("forward", 1), ("bidirectional", 2)])
def test_lstm_flops_scale_with_sequence_and_direction(direction, dirs):
    def work(seq):
        hidden, inp, batch = 16, 8, 3
        node = h.make_node("LSTM", ["x", "w", "r"], ["y"], hidden_size=hidden, direction=direction)
        shapes, dtypes = infer([node], [h.make_tensor_value_info("x", 1, [seq, batch, inp]),
                                        h.make_tensor_value_info("w", 1, [dirs, 4 * hidden, inp]),
                                        h.make_tensor_value_info("r", 1, [dirs, 4 * hidden, hidden])],
                               [h.make_tensor_value_info("y", 1, None)])
        return op_work(node, shapes, dtypes)

    one, two = work(5), work(10)
    assert one.unit == "cube"
    assert two.flops == pytest.approx(2 * one.flops)
    # the gate GEMMs alone: per step and batch row, 2 * 4H * (I + H) per direction
    assert one.flops >= dirs * 5 * 3 * 2 * 64 * (8 + 16)


def test_views_cost_nothing_and_gather_reads_only_rows():
    node = h.make_node("Reshape", ["x", "s"], ["y"])
    assert op_work(node, {}, {}) == OpWork(0.0, 0, 0, "none")
    assert op_time_us(op_work(node, {}, {}), "Ascend310P3") == 0.0
    gather = h.make_node("Gather", ["table", "ids"], ["rows"])
    shapes = {"table": (30522, 384), "ids": (1, 128), "rows": (1, 128, 384)}
    dtypes = {"table": F16, "ids": np.dtype("int64"), "rows": F16}
    w = op_work(gather, shapes, dtypes)
    assert w.bytes_out == 128 * 384 * 2
    assert w.bytes_in == 128 * 384 * 2 + 128 * 8        # rows read + indices, not the table


def test_unknown_op_is_a_bytes_moved_vector_estimate():
    node = h.make_node("SomeCustomOp", ["x"], ["y"], domain="custom")
    w = op_work(node, {"x": (10, 10), "y": (10, 10)}, {"x": F32, "y": F32})
    assert w == OpWork(0.0, 400, 400, "vector")
    assert op_time_us(w, "Ascend310P3") > SOC_PROFILES["Ascend310P3"].launch_us


def test_missing_or_dynamic_shape_names_node_and_tensor():
    node = h.make_node("Relu", ["x"], ["y"], name="relu_1")
    with pytest.raises(InputError, match="relu_1.*'y'"):
        op_work(node, {"x": (4,)}, {"x": F32})
    with pytest.raises(InputError, match="dynamic"):
        op_work(node, {"x": (-1, 4), "y": (-1, 4)}, {"x": F32, "y": F32})


# ------------------------------------------------------------------------------------------------
# op times: scaling and monotonicity

@pytest.mark.parametrize("soc", list(SOC_PROFILES))
def test_doubling_flops_doubles_large_cube_time(soc):
    p = SOC_PROFILES[soc]
    small_bytes = 1 << 16
    base = OpWork(4e11, small_bytes, small_bytes, "cube")   # far into the compute-bound regime
    t1 = op_time_us(base, soc) - p.launch_us
    t2 = op_time_us(OpWork(8e11, small_bytes, small_bytes, "cube"), soc) - p.launch_us
    assert t2 / t1 == pytest.approx(2.0, rel=1e-9)
    # whole-time ratio also close to 2 for a large op
    assert op_time_us(OpWork(8e11, small_bytes, small_bytes, "cube"), soc) / op_time_us(base, soc) \
        == pytest.approx(2.0, rel=0.01)


@pytest.mark.parametrize("soc", list(SOC_PROFILES))
def test_launch_overhead_floor(soc):
    p = SOC_PROFILES[soc]
    for unit in ("cube", "vector"):
        tiny = op_time_us(OpWork(10.0, 64, 64, unit), soc)
        assert p.launch_us <= tiny < p.launch_us + 0.01
    assert op_time_us(OpWork(10.0, 64, 64, "vector"), soc, engine="AI CPU") >= p.aicpu_launch_us


@settings(max_examples=200, deadline=None)
@given(flops=st.floats(0, 1e12), bin_=st.integers(0, 1 << 30), bout=st.integers(0, 1 << 30),
       unit=st.sampled_from(["cube", "vector"]), soc=st.sampled_from(list(SOC_PROFILES)),
       engine=st.sampled_from(["AI Core", "AI CPU"]), dtype=st.sampled_from(["float16", "float32",
                                                                            "int8"]))
def test_time_is_finite_and_monotonic(flops, bin_, bout, unit, soc, engine, dtype):
    w = OpWork(flops, bin_, bout, unit)
    t = op_time_us(w, soc, dtype, engine)
    assert math.isfinite(t) and t >= 0
    assert op_time_us(OpWork(flops * 2 + 1, bin_, bout, unit), soc, dtype, engine) >= t
    assert op_time_us(OpWork(flops, bin_ * 2 + 1, bout, unit), soc, dtype, engine) >= t
    if engine == "AI Core":
        assert op_time_us(w, soc, dtype, "AI CPU") > t          # AI CPU is much slower
        if unit == "cube":
            assert op_time_us(w, soc, dtype, operand_format="ND") >= t


def test_int8_and_fp32_rates():
    big = OpWork(1e12, 1 << 10, 1 << 10, "cube")
    t16 = op_time_us(big, "Ascend310P3", "float16")
    assert op_time_us(big, "Ascend310P3", "int8") < t16 < op_time_us(big, "Ascend310P3", "float32")


def test_unknown_engine_or_soc_is_an_input_error():
    with pytest.raises(InputError, match="engine"):
        op_time_us(OpWork(1, 1, 1, "vector"), "Ascend310P3", engine="GPU")
    with pytest.raises(InputError, match="no cost profile"):
        get_soc_profile("Ascend999")


# ------------------------------------------------------------------------------------------------
# The source-material checks (design.md): 10–15 µs per NCHW→NC1HWC0; NZ GEMM ≈ 1.5x ND GEMM.
# What the model gives is pinned here and explained in benchmarks/README-memory-cost.md.

TRANSDATA_CHECK = [
    # (soc, logical NCHW shape, fp16, model's estimate range in µs, agrees with 10–15 µs?)
    ("Ascend310P3", (1, 64, 56, 56), (10.0, 15.0), True),
    ("Ascend310P3", (1, 256, 56, 56), (30.0, 45.0), False),   # 4x the bytes: bandwidth dominates
    ("Ascend310P3", (1, 16, 28, 28), (3.0, 4.0), False),      # small: launch overhead only
    # fitted on the real 910B captures: ~12 µs fixed cost per NCHW->NC1HWC0 TransData, now within 10-15 µs
    ("Ascend910B", (1, 64, 56, 56), (10.0, 15.0), True),
]


@pytest.mark.parametrize("soc, shape, expected, agrees", TRANSDATA_CHECK)
def test_transdata_against_source_figure(soc, shape, expected, agrees):
    n, c, hh, ww = shape
    c0 = 16
    src = n * c * hh * ww * 2
    dst = n * (-(-c // c0)) * hh * ww * c0 * 2             # NC1HWC0, C padded to C0
    t = transdata_time_us(src, "NCHW", "NC1HWC0", soc, dst_nbytes=dst)
    assert expected[0] <= t <= expected[1]
    assert (10.0 <= t <= 15.0) == agrees


def test_transdata_pads_count_and_time_grows_with_bytes():
    p = SOC_PROFILES["Ascend310P3"]
    small = transdata_time_us(1000, "NCHW", "NC1HWC0", p)
    padded = transdata_time_us(1000, "NCHW", "NC1HWC0", p, dst_nbytes=5000)
    assert p.launch_us < small < padded
    expected = p.launch_us + 1e6 * 6000 / (p.bandwidth_gbps * 1e9 * p.transdata_efficiency)
    assert padded == pytest.approx(expected)


GEMM_CHECK = [
    # (soc, M, K, N, ND/NZ time ratio range the model gives). The source says ~1.5x; the model
    # gives at most bw_efficiency / nd_load_efficiency = 1.4x, reached only by bandwidth-bound
    # (skinny, decode-like) GEMMs, and ~1.0x for large compute-bound ones.
    ("Ascend310P3", 128, 384, 384, (1.1, 1.25)),     # MiniLM projection
    ("Ascend310P3", 128, 1536, 384, (1.25, 1.35)),   # MiniLM FFN down-projection
    ("Ascend310P3", 1, 4096, 4096, (1.35, 1.4)),     # GEMV: weight-read bound
    ("Ascend310P3", 4096, 4096, 4096, (1.0, 1.001)),  # large square: compute-bound
    ("Ascend910B", 128, 384, 384, (1.0, 1.1)),       # launch-dominated on 910B
    ("Ascend910B", 16, 4096, 4096, (1.0, 1.4)),      # weight-read bound: at the ceiling, fitted bw_efficiency / 0.5
    ("Ascend910B", 4096, 4096, 4096, (1.0, 1.001)),
]


@pytest.mark.parametrize("soc, m, k, n, ratio_range", GEMM_CHECK)
def test_nd_vs_nz_gemm_against_source_figure(soc, m, k, n, ratio_range):
    w = OpWork(2.0 * m * k * n, 2 * (m * k + k * n), 2 * m * n, "cube")
    ratio = op_time_us(w, soc, operand_format="ND") / op_time_us(w, soc, operand_format="NZ")
    assert ratio_range[0] <= ratio <= ratio_range[1]
    p = SOC_PROFILES[soc]
    assert ratio <= p.bw_efficiency / p.nd_load_efficiency + 1e-9   # the model's ceiling: 1.4x
    assert ratio < 1.5                                                # where it disagrees


# ------------------------------------------------------------------------------------------------
# Reports and profiles

def _ops(compute_us_each: float, n: int, soc="Ascend310P3"):
    p = SOC_PROFILES[soc]
    # a vector op whose time is launch + bytes / (bw * eff): choose bytes for the wanted time
    nbytes = int((compute_us_each - p.launch_us) * 1e-6 * p.bandwidth_gbps * 1e9 * p.bw_efficiency)
    return [EstimatedOp(f"op{i}", "Add", OpWork(0.0, nbytes, 0, "vector")) for i in range(n)]


def test_flag_threshold_and_report_fields():
    td = EstimatedTransData("t0", "NCHW", "NC1HWC0", 401408)
    t_td = transdata_time_us(401408, "NCHW", "NC1HWC0", "Ascend310P3")
    # share = t_td / (compute + t_td); pick compute for 7 % and 9 %
    for share, flagged in ((0.07, False), (0.09, True)):
        compute = t_td * (1 - share) / share
        r = estimate(_ops(compute / 10, 10), [td], "Ascend310P3")
        assert r.formattrans_share == pytest.approx(share, rel=1e-3)
        assert r.flagged is flagged and bool(r) is (not flagged)
        assert r.total_us == pytest.approx(r.compute_us + r.formattrans_us)
        v = r.verdict()
        assert "estimated" in v and ("flagged" in v) == flagged and "\n" not in v


def test_manifest_transdata_dicts_and_round_trip(tmp_path):
    entry = {"name": "trans_x", "src_format": "NCHW", "dst_format": "NC1HWC0",
             "shape": [1, 64, 56, 56], "dtype": "float16", "bytes": 401408, "onnx_nodes": ["conv"],
             "reason": "Conv input"}
    r = estimate(_ops(50.0, 4), [entry], "Ascend310P3")
    assert r.transdata[0].nbytes == 401408
    path = tmp_path / "cost.json"
    r.to_json(path)
    d = json.loads(path.read_text())
    assert d["estimated"] is True and d["flagged"] == r.flagged and "estimated" in d["verdict"]
    again = CostReport.load(path)
    assert again.total_us == pytest.approx(r.total_us) and len(again.ops) == 4
    summary = r.manifest_summary()
    assert summary["estimated"] is True and set(summary["est_us"]) == {"op0", "op1", "op2", "op3"}
    with pytest.raises(InputError, match="src_format"):
        estimate([], [{"dst_format": "ND", "bytes": 1}], "Ascend310P3")


def test_profile_override_object_and_json(tmp_path):
    slow = SocProfile.from_dict({"name": "slow310P", "base": "Ascend310P3", "bandwidth_gbps": 102.4})
    assert slow.sources["bandwidth_gbps"] == "user override"
    w = OpWork(0.0, 1 << 24, 1 << 24, "vector")
    fast_t = op_time_us(w, "Ascend310P3")
    slow_t = op_time_us(w, slow)
    assert slow_t - slow.launch_us == pytest.approx(2 * (fast_t - slow.launch_us))
    path = tmp_path / "soc.json"
    path.write_text(json.dumps({"name": "slow310P", "base": "Ascend310P3", "bandwidth_gbps": 102.4}))
    r = estimate([EstimatedOp("a", "Add", w)], [], "Ascend310P3", soc_profile=path)
    assert r.soc == "slow310P" and r.ops[0].est_us == pytest.approx(slow_t)
    assert get_soc_profile(str(path)) == slow
    for bad, match in [("{", "not JSON"), ('{"name": "x", "bandwidth": 1}', "unknown field"),
                       ('{"name": "x", "cube_efficiency": 2}', r"\(0, 1\]"), ("[1]", "object")]:
        path.write_text(bad)
        with pytest.raises(InputError, match=match):
            get_soc_profile(path)


def test_every_constant_has_a_source():
    for p in SOC_PROFILES.values():
        tables = ("launch_us_by_engine", "transdata_efficiency_by_pair", "cube_efficiency_by_dtype")
        fields = [f.name for f in dataclasses.fields(SocProfile)
                  if f.name not in ("name", "sources", "calibration", *tables)]
        fields += [f"{t}.{k}" for t in tables for k in getattr(p, t)]
        assert set(p.sources) == set(fields), p.name
        assert all(s.strip() for s in p.sources.values())


def test_soc_family_names():
    assert get_soc_profile("Ascend910B1") is SOC_PROFILES["Ascend910B"]      # no part profile: the family's
    assert get_soc_profile("Ascend910B4") is SOC_PROFILES["Ascend910B4"]     # a part profile (test_cost_parts)
    assert get_soc_profile("Ascend310P1") is SOC_PROFILES["Ascend310P3"]


def _planned(path, **options):
    """The plan ``convert`` makes, with its cost estimate: the product's own path."""
    return pipeline.lower(path, None, ConvertOptions(backend="builtin", **options), until="plan from ONNX")


def test_the_plan_prices_fp32_as_fp16_under_force_fp16_and_refuses_dynamic_inputs(tmp_path):
    g = h.make_graph([h.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                     [h.make_tensor_value_info("x", 1, ["n", 64, 56, 56])],
                     [h.make_tensor_value_info("y", 1, ["n", 64, 56, 56])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "relu.onnx")
    with pytest.raises(ModelError, match="dynamic"):
        _planned(tmp_path / "relu.onnx")
    with pytest.raises(ModelError, match="not an input"):
        _planned(tmp_path / "relu.onnx", input_shapes={"z": (1,)})
    n = 64 * 56 * 56
    shape = {"x": (1, 64, 56, 56)}
    r16 = _planned(tmp_path / "relu.onnx", input_shapes=shape).plan.cost
    r32 = _planned(tmp_path / "relu.onnx", input_shapes=shape, precision_mode="must_keep_origin_dtype").plan.cost
    (o16,), (o32,) = r16.ops, r32.ops
    assert o32.bytes == 2 * n * 4            # fp32 in and out
    assert o16.bytes == n * 4 + n * 2        # the fed fp32 input, an fp16 output (force_fp16)
    assert 0 < o16.est_us < o32.est_us and r16.formattrans_share == 0.0


# ------------------------------------------------------------------------------------------------
# Real models: every op gets a finite, non-negative estimate

REAL = [
    ("ppocr_det", {"x": (1, 3, 640, 640)}),
    ("ppocr_rec", {"x": (1, 3, 48, 320)}),
    ("ppocr_cls", {"x": (1, 3, 48, 192)}),
    ("silero_vad", {"input": (1, 576), "h": (1, 1, 128), "c": (1, 1, 128)}),
    ("minilm", {"input_ids": (1, 128), "attention_mask": (1, 128)}),
]


@pytest.mark.realmodel
@pytest.mark.parametrize("name, shapes", REAL)
@pytest.mark.slow
def test_real_model_ops_all_estimated(real_model, name, shapes):
    path = real_model(name)
    # the 910B parts differ from the family only in their peaks (test_cost_parts): planned once, as the family
    socs = [s for s in SOC_PROFILES if s == "Ascend910B" or s not in SOC_PARTS] if name != "minilm" \
        else ["Ascend310P3"]  # minilm: 69 MB, planned once
    by_soc = {soc: _planned(path, input_shapes=shapes, soc=soc) for soc in socs}
    for soc, ctx in by_soc.items():
        plan, graph = ctx.plan, ctx.loaded.model.graph
        r = plan.cost
        assert r is not None and r.soc == soc
        assert plan.report.to_dict()["cost"]["total_us"] == pytest.approx(r.total_us)  # the record's totals
        for o in r.ops:
            assert math.isfinite(o.est_us) and o.est_us >= 0, o
        kernels = [o for o in r.ops if o.unit != "none"]
        assert kernels and all(o.est_us >= SOC_PROFILES[soc].launch_us for o in kernels)
        assert r.compute_us == pytest.approx(sum(o.est_us for o in r.ops))
        # every node of the graph is priced, or left out for a reason the plan records
        folded = {k for k, rec in plan.node_formats.items() if rec.folded}
        fused = set(plan.fused)
        estimated = {o.name for o in r.ops}
        for node in graph.node:
            if node.name in estimated or node.name in folded or any(t in fused for t in node.input):
                continue
            raise AssertionError(f"{node.name} ({node.op_type}) neither estimated, folded nor fused")
    if name == "minilm":
        return  # the cross-check below runs the 69 MB model again; the CNNs cover it
    # cube work is where the model's arithmetic is: cross-check MatMul/Gemm against shapes
    # measured with onnxruntime where shape inference left them open (not the planner's shapes)
    ctx = by_soc["Ascend310P3"]
    shp, _ = model_tensor_types(ctx.loaded.model, input_shapes=shapes)
    by_name = {o.name: o for o in ctx.plan.cost.ops}
    checked = 0
    for node in ctx.loaded.model.graph.node:
        if node.op_type in ("MatMul", "Gemm") and node.name in by_name:
            a, y = shp[node.input[0]], shp[node.output[0]]
            k = a[0] if node.op_type == "Gemm" and any(
                at.name == "transA" and at.i for at in node.attribute) else a[-1]
            assert by_name[node.name].flops >= 2 * np.prod(y) * k
            checked += 1
    assert checked or not any(n.op_type in ("MatMul", "Gemm") for n in ctx.loaded.model.graph.node)


# ------------------------------------------------------------------------------------------------
# The model against measured ops (costcheck) and the profiles of every SoC convert accepts

from npu_deploy.converters.lowering import costcheck  # noqa: E402
from npu_deploy.converters.lowering.cost import accuracy_note  # noqa: E402
from npu_deploy.profiling.ops import MeasuredOp  # noqa: E402


def _m(type_, in_shapes, out_shapes, in_fmts, out_fmts, dur=10.0, engine="AI_CORE", dtype="FLOAT"):
    return MeasuredOp("op", type_, engine, tuple(in_shapes), tuple(out_shapes), (dtype,) * len(in_shapes),
                      (dtype,) * len(out_shapes), tuple(in_fmts), tuple(out_fmts), dur)


def test_measured_transdata_moves_its_stored_bytes():
    f = costcheck.features(_m("TransData", [(32, 3, 224, 224)], [(32, 1, 224, 224, 8)], ["NCHW"], ["NC1HWC0"],
                              engine="AI_VECTOR_CORE"))
    assert f.cls == "TransData" and f.pair == "NCHW->NC1HWC0" and f.dtype == "float32"
    assert f.nbytes == 4 * (32 * 3 * 224 * 224 + 32 * 224 * 224 * 8)


def test_measured_conv_work_from_storage_shapes():
    # 192x64x5x5 conv on 32x64x27x27, stored as NC1HWC0 (C0 8) with a FRACTAL_Z weight, as in the capture
    f = costcheck.features(_m("Conv2D", [(32, 8, 27, 27, 8), (200, 12, 16, 8), (192,)], [(32, 24, 27, 27, 8)],
                              ["NC1HWC0", "FRACTAL_Z", "NCHW"], ["NC1HWC0"]))
    assert f.cls == "Conv" and f.flops == 2 * 32 * 27 * 27 * 192 * 64 * 5 * 5
    g = costcheck.features(_m("Conv2DBackpropFilter", [(32, 8, 27, 27, 8), (4,), (32, 24, 27, 27, 8)],
                              [(200, 12, 16, 8)], ["NC1HWC0", "NCHW", "NC1HWC0"], ["FRACTAL_Z"]))
    assert g.flops == f.flops                       # the same MACs as the forward conv


@pytest.mark.parametrize("a, b, y, k", [((32, 9216), (4096, 9216), (32, 4096), 9216),     # x·Wᵀ
                                        ((32, 1000), (1000, 4096), (32, 4096), 1000),     # x·W
                                        ((32, 1000), (32, 4096), (1000, 4096), 32)])      # xᵀ·dy
def test_measured_matmul_finds_k(a, b, y, k):
    f = costcheck.features(_m("MatMulV2", [a, b], [y], ["ND", "ND"], ["ND"]))
    assert f.flops == 2 * y[0] * y[1] * k


def test_unknown_or_unreadable_ops_are_not_priced_but_kept():
    ops = [_m("NoSuchKernel", [(1, 8, 128, 64)], [(1, 8, 128, 64)], ["ND"], ["ND"], 50.0, "MIX_AIC"),
           _m("FlashAttentionScore", [(128, 64)], [(128, 64)], ["ND"], ["ND"], 5.0, "MIX_AIC"),   # no q/k/v
           _m("Relu", [(1024, 1024)], [(1024, 1024)], ["ND"], ["ND"], 45.0, "AI_VECTOR_CORE")]
    r = costcheck.check(ops, "Ascend910B")
    assert [o.predicted_us is None for o in r.ops] == [True, True, False]
    assert r.not_priced["count"] == 2 and r.not_priced["share_pct"] == pytest.approx(100 * 55 / 100)
    d = r.to_dict()
    assert len(d["ops"]) == 3 and d["ops"][0]["predicted_us"] is None
    assert set(d["total"]) >= {"measured_us", "predicted_us"}
    assert set(d["formattrans"]) == {"measured_pct", "predicted_pct"}


def _fa(type_, ins, outs, dtypes, dur):
    return MeasuredOp("fa", type_, "MIX_AIC", tuple(ins), tuple(outs), tuple(dtypes), (), ("ND",) * len(ins),
                      (), dur)


# the shapes of real rows: torch_npu_level2_llm_910B (SBH, GQA 16/8 heads of 128, compressed causal mask)
_LLM_FA = [(4096, 1, 2048), (4096, 1, 1024), (4096, 1, 1024), (), (), (), (2048, 2048)]
_LLM_FA_OUT = [(1, 16, 4096, 8), (1, 16, 4096, 8), (), (4096, 1, 2048)]
_LLM_FAG = [(4096, 1, 2048), (4096, 1, 1024), (4096, 1, 1024), (4096, 1, 2048), (2048, 2048),
            (1, 16, 4096, 8), (1, 16, 4096, 8), (), (4096, 1, 2048)]
# gpt3_step_start_rank0: B 2, S 8192, 5 heads of 128, a full 4-D mask and a dropout mask, outputs flattened
_GPT_FA = [(8192, 2, 640), (8192, 2, 640), (8192, 2, 640), (), (83886112,), (), (1, 1, 8192, 8192)]
_GPT_FA_OUT = [(655360,), (655360,), (), (10485760,)]


def test_flash_attention_work_from_its_rows():
    """QK^T and PV of B·N·Sq·Skv scores of head dim D (by hand: 1 x 16 x 4096 x 4096 x 128), half of it
    under CANN's compressed causal mask; the grad's five products are 2.5x; a full 4-D mask halves nothing."""
    f = costcheck.features(_fa("FlashAttentionScore", _LLM_FA, _LLM_FA_OUT, ["BF16"] * 3, 880.0))
    assert f.cls == "Attention" and f.dtype == "bfloat16"
    assert f.flops == pytest.approx(2 * 2 * (16 * 4096 * 4096 / 2) * 128)
    g = costcheck.features(_fa("FlashAttentionScoreGrad", _LLM_FAG, [(4096, 1, 2048)] * 3, ["BF16"] * 4, 2250.0))
    assert g.flops == pytest.approx(2.5 * f.flops) and g.vflops == pytest.approx(2 * f.vflops)
    h = costcheck.features(_fa("FlashAttentionScore", _GPT_FA, _GPT_FA_OUT, ["BF16"] * 3, 7000.0))
    assert h.flops == pytest.approx(2 * 2 * (2 * 5 * 8192 * 8192) * 128)
    p = get_soc_profile("Ascend910B")
    assert 0 < costcheck.predict(f, p) < costcheck.predict(g, p) < costcheck.predict(h, p)


def test_fill_topk_pool_and_dsa_rows_are_priced_by_what_they_do():
    p = get_soc_profile("Ascend910B")
    z_small = costcheck.features(_m("ZerosLike", [(4, 24)], [(4, 24)], ["ND"], ["ND"], 1.5, "AI_VECTOR_CORE"))
    z_big = costcheck.features(_m("ZerosLike", [(375815680,)], [(375815680,)], ["ND"], ["ND"], 1893.0,
                                  "AI_VECTOR_CORE"))
    assert z_big.cls == "fill" and z_big.nbytes == 4 * 375815680           # bytes written, none read
    assert costcheck.predict(z_big, p) > 100 * costcheck.predict(z_small, p)
    memset = costcheck.features(MeasuredOp("m", "MemSet", "AI_VECTOR_CORE", (), (), (), (), (), (), 10.0))
    assert memset.cls == "fill" and costcheck.predict(memset, p) > 0      # size not recorded: a fixed cost
    topk = costcheck.features(_m("TopKV2", [(32, 1000), ()], [(32, 5), (32, 5)], ["ND"] * 2, ["ND"] * 2, 11.0,
                                 "MIX_AIV"))
    assert topk.cls == "vector" and topk.flops == pytest.approx(32 * 1000 * math.log2(1000))
    pool = costcheck.features(_m("MaxPoolWithArgmaxV1", [(32, 4, 55, 55, 16)],
                                 [(32, 4, 27, 27, 16), (32, 4, 9, 47, 16)], ["NC1HWC0"], ["NC1HWC0"] * 2,
                                 170.0, "AI_VECTOR_CORE"))
    assert pool.flops == pytest.approx(32 * 4 * 27 * 27 * 16 * 3 * 9)     # a 3x3 window (the mask's dim 2)
    dsa = costcheck.features(MeasuredOp("d", "DSAGenBitMask", "DSA_SQE", (), ((36864,),), (), ("UINT8",), (),
                                        (), 3.4))
    assert dsa.cls == "DSA" and dsa.nbytes == 36864


@pytest.mark.parametrize("soc", ["Ascend310", "Ascend310P3", "Ascend310B1", "Ascend310B4", "Ascend910",
                                 "Ascend910A", "Ascend910B", "Ascend910B3", "Ascend910_9391"])
def test_every_soc_convert_accepts_has_a_profile(soc):
    p = get_soc_profile(soc)
    note = accuracy_note(soc)
    if p.name.startswith("Ascend910B"):     # the family and its parts (B3: its peaks, the family's fit)
        assert p.calibrated and "median op error" in note and "real Ascend910B captures" in note
    else:
        assert not p.calibrated and note.startswith(f"cost model not calibrated for {soc}")


def test_profile_json_refuses_unknown_or_out_of_range_fields():
    with pytest.raises(InputError, match="launch_us_by_engine.GPU"):
        SocProfile.from_dict({"name": "x", "base": "Ascend910B", "launch_us_by_engine": {"GPU": 3.0}})
    with pytest.raises(InputError, match=r"transdata_efficiency_by_pair.NCHW->NC1HWC0 = 9"):
        SocProfile.from_dict({"name": "x", "base": "Ascend910B",
                              "transdata_efficiency_by_pair": {"NCHW->NC1HWC0": 9}})
    with pytest.raises(InputError, match="calibration.bogus"):
        SocProfile.from_dict({"name": "x", "base": "Ascend910B", "calibration": {"bogus": 1}})
    with pytest.raises(InputError, match="unknown field"):
        SocProfile.from_dict({"name": "x", "base": "Ascend910B", "warp_speed": 1})


@pytest.mark.shared_data
@pytest.mark.slow
def test_fit_on_real_captures_is_bounded_and_generalises():
    pytest.importorskip("scipy", reason="cost fit needs scipy (pip install 'npu-deploy[cost]')")
    from npu_deploy.profiling.ops import read_measured_ops
    from tests.conftest import SHARED_DATA

    caps = [(c.label, c.ops) for name in ("cnn_level1_rank1_ascend_pt", "cnn_level2_rank0_ascend_pt")
            for c in read_measured_ops(SHARED_DATA / "timings_910B" / name)]
    prof, res = costcheck.fit(caps, "Ascend910B", name="t")
    again_prof, _ = costcheck.fit(caps, "Ascend910B", name="t")
    assert again_prof.to_dict() == prof.to_dict()                     # multi-start, seeded: deterministic
    assert len(res.parameters) * 4 < res.n_keys                      # far fewer parameters than keys
    assert all(0 < v for v in res.parameters.values())
    assert all(0.01 <= v <= 3.0 for v in prof.transdata_efficiency_by_pair.values())
    assert res.leave_one_out["per_class"]["TransData"]["median_abs_err_pct"] < 20
    # the fitted profile round-trips through the JSON a --soc option reads
    again = SocProfile.from_dict(json.loads(json.dumps(costcheck.profile_dict(prof, "Ascend910B"))))
    assert again.transdata_efficiency_by_pair == prof.transdata_efficiency_by_pair and again.calibrated


@pytest.mark.realmodel
@pytest.mark.slow
def test_estimate_charges_fused_ops_to_their_producer_and_names_cann_types(real_model, tmp_path):
    """PP-OCRv4 det: before, the estimated profile showed Add 28 % and Mul 27 % of device time (each
    elementwise op a kernel of its own); ops the plan fuses into their producer are not kernels."""
    import npu_deploy
    from npu_deploy.converters.files.bundle import read_bundle
    from npu_deploy.runtime.emulator import profile_rows

    npu_deploy.convert(real_model("ppocr_det"), output=tmp_path / "d.bundle", backend="builtin",
                       input_shapes={"x": (1, 3, 640, 640)})
    with read_bundle(tmp_path / "d.bundle") as b:
        manifest, graph = b.manifest, b.graph
    fused = set(manifest["fused_tensors"])
    assert fused
    readers = {n.name for n in graph.graph.node if any(t in fused for t in n.input)}
    est = manifest["cost"]["est_us"]
    assert readers and not readers & set(est)              # no separate estimate for a fused op
    rows = profile_rows(manifest, graph)
    assert not readers & {r["name"] for r in rows}          # and no task row
    by_type: dict[str, float] = {}
    for r in rows:
        by_type[r["type"]] = by_type.get(r["type"], 0.0) + r["us"]
    assert "Conv2D" in by_type and "Conv" not in by_type    # msprof's names
    total = sum(by_type.values())
    assert by_type["Conv2D"] / total > 0.3
    assert (by_type.get("Add", 0) + by_type.get("Mul", 0)) / total < by_type["Conv2D"] / total


def _hand_profile(**over):
    """A profile with round figures, so the expected times below are computed by hand."""
    d = {"name": "hand", "base": "Ascend910B", "bandwidth_gbps": 1000.0, "bw_efficiency": 0.5,
         "fp32_tflops": 1000.0, "fp16_tflops": 100.0, "vector_fp16_tflops": 10.0,
         "transposed_read_efficiency": 0.25, "cube_write_efficiency": 1.0,
         "launch_us_by_engine": {"AI_CORE": 2.0, "MIX_AIC": 1.0},
         "cube_efficiency_by_dtype": {"MatMul/float32": 1.0, "FlashAttention/bfloat16": 0.5}}
    d.update(over)
    return SocProfile.from_dict(d)


def test_matmul_prices_the_transposed_weight_and_the_result_apart():
    """The CNN capture's forward Linear (aclnnAddmm: x·Wᵀ + bias, W stored (N, K)) against its backward
    Mm (dy·W, W as (K, N)): same shapes, 126.7 vs 45.5 µs. By hand, at 1000 GB/s x 0.5, the transposed
    weight read at 0.25 of that and the result written at 1000 GB/s: the forward reads x (32x4096) and
    the bias (4096) plainly, W (4096x4096 fp32, 67,108,864 bytes) transposed, writes 32x4096."""
    p = _hand_profile()
    fwd = costcheck.features(_m("MatMulV2", [(32, 4096), (4096, 4096), (4096,)], [(32, 4096)],
                                ["ND"] * 3, ["ND"]))
    bwd = costcheck.features(_m("MatMulV2", [(32, 4096), (4096, 4096)], [(32, 4096)], ["ND"] * 2, ["ND"]))
    assert fwd.xbytes == 4096 * 4096 * 4 and bwd.xbytes == 0          # square W: the bias says x·Wᵀ
    assert fwd.obytes == bwd.obytes == 32 * 4096 * 4
    plain_us = (32 * 4096 * 4 + 4096 * 4) / 500e9 * 1e6               # 1.081344
    trans_us = 67108864 / (500e9 * 0.25) * 1e6                         # 536.870912
    write_us = 32 * 4096 * 4 / 1000e9 * 1e6                            # 0.524288
    assert costcheck.predict(fwd, p) == pytest.approx(2.0 + plain_us + trans_us + write_us)
    assert costcheck.predict(bwd, p) == pytest.approx(2.0 + (32 * 4096 * 4 + 67108864) / 500e9 * 1e6 + write_us)
    # a non-square weight stored (N, K) is transposed by its shape alone; xᵀ·dy transposes the small x
    fc1 = costcheck.features(_m("MatMulV2", [(32, 9216), (4096, 9216), (4096,)], [(32, 4096)], ["ND"] * 3, ["ND"]))
    dw = costcheck.features(_m("MatMulV3", [(32, 4096), (32, 9216)], [(4096, 9216)], ["ND"] * 2, ["ND"]))
    assert fc1.xbytes == 4096 * 9216 * 4 and dw.xbytes == 32 * 4096 * 4 and dw.obytes == 4096 * 9216 * 4
    # a row whose two K disagree (mstt's fixture: 81920 from A, 8192 from B) tells no orientation
    odd = costcheck.features(_m("MatMulV2", [(81920, 4096), (8192, 512)], [(4096, 512)], ["ND"] * 2, ["ND"],
                                dtype="BF16"))
    assert odd.flops == 2 * 4096 * 512 * 8192 and odd.xbytes == 0


def test_flash_attention_prices_the_full_mask_and_the_dropout_mask_it_reads():
    """gpt3_step_start_rank0's forward: B 2 x 5 heads x 8192 x 8192 = 671,088,640 scores, a bf16 mask
    (1, 1, 8192, 8192) read for every head (2 bytes a score) and a dropout bit mask of 83,886,112 bytes
    (1 bit a score): 2.125 bytes a score streamed, 8 + 1 (mask) + 2 (dropout) vector operations. The
    LLM step's causal call (compressed 2048x2048 mask, empty drop_mask) streams nothing per score."""
    scores = 2 * 5 * 8192 * 8192
    h = costcheck.features(MeasuredOp("fa", "FlashAttentionScore", "MIX_AIC", tuple(_GPT_FA), tuple(_GPT_FA_OUT),
                                      ("BF16", "BF16", "BF16", "FLOAT", "UINT8", "FLOAT", "BF16"), (),
                                      ("ND",) * 7, (), 7000.0))
    assert h.xbytes == pytest.approx(scores * 2.125) and h.vflops == pytest.approx(11 * scores)
    f = costcheck.features(MeasuredOp("fa", "FlashAttentionScore", "MIX_AIC", tuple(_LLM_FA), tuple(_LLM_FA_OUT),
                                      ("BF16", "BF16", "BF16", "BF16", "UINT8", "BF16", "BOOL"), (),
                                      ("ND",) * 7, (), 880.0))
    assert f.xbytes == 0 and f.vflops == pytest.approx(8 * 16 * 4096 * 4096 / 2)
    # by hand: cube 4·scores·128 at 100 TFLOPS bf16, vector 11·scores at 5 TFLOPS (fp32: half of 10), both
    # at 0.5; the streams at 1000 GB/s x 0.5; launch 1 µs
    p = _hand_profile()
    cube_s = 4 * scores * 128 / 100e12
    vec_s = 11 * scores / 5e12
    expected = 1.0 + 1e6 * ((cube_s + vec_s) / 0.5 + scores * 2.125 / 500e9)
    assert costcheck.predict(h, p) == pytest.approx(expected)


def test_in_place_optimizer_writes_and_the_pool_grads_real_mask():
    # ApplyAdamWV2 of the LLM step (no output recorded): reads var, m, v, grad and the step, writes var, m, v
    n = 3145728
    adam = costcheck.features(_m("ApplyAdamWV2", [(n,)] * 4 + [(1,)], [], ["ND"] * 5, [], 134.2, "AI_VECTOR_CORE"))
    assert adam.nbytes == 4 * n * 4 + 4 + 3 * n * 4               # the step read as FLOAT by _m: 4 bytes
    # MaxPoolGradWithArgmaxV1 of the CNN (layer 2): the mask its forward wrote is (32, 12, 9, 12, 16)
    # uint16; the row shows (32, 192, 9, 9, 12, 16), 16 x 9 times larger
    x, dy, mask = (32, 12, 27, 27, 16), (32, 12, 13, 13, 16), (32, 192, 9, 9, 12, 16)
    op = MeasuredOp("g", "MaxPoolGradWithArgmaxV1", "AI_VECTOR_CORE", (x, dy, mask), (x,),
                    ("FLOAT", "FLOAT", "UINT16"), ("FLOAT",), ("NC1HWC0",) * 3, ("NC1HWC0",), 100.8)
    g = costcheck.features(op)
    assert g.nbytes == 4 * math.prod(x) + 4 * math.prod(dy) + 2 * 32 * 12 * 9 * 12 * 16 + 4 * math.prod(x)


def test_new_profile_fields_are_bounded():
    with pytest.raises(InputError, match="cube_write_efficiency"):
        SocProfile.from_dict({"name": "x", "base": "Ascend910B", "cube_write_efficiency": 4.0})
    with pytest.raises(InputError, match="transposed_read_efficiency"):
        SocProfile.from_dict({"name": "x", "base": "Ascend910B", "transposed_read_efficiency": 1.5})
