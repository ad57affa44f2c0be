"""``inspect`` on offline bundles: manifest summary and integrity checks.

Bundles come from ``bundle.write_bundle`` with a manifest laid out as ``docs/internals.md`` says, and —
when the converter is available — from the real converter on real models.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from npu_deploy.converters.files.bundle import WeightEntry, write_bundle
from npu_deploy.converters.lowering.convert import convert
from npu_deploy.runtime.check.inspect import inspect, render_text
from npu_deploy.errors import BundleError


def _graph(weight_names=("w",)):
    nodes = [helper.make_node("MatMul", ["x", weight_names[0]], ["y"], name="mm"),
             helper.make_node("Relu", ["y"], ["z"], name="relu")]
    g = helper.make_graph(nodes, "lowered", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [-1, 32])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT16, [-1, 16])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def manifest(**over):
    m = {
        "producer": "npu-deploy", "producer_version": "0.1.0", "soc": "Ascend310P3",
        "precision_mode": "force_fp16",
        "inputs": [{"name": "x", "shape": [-1, 32], "dtype": "float16", "format": "ND",
                    "device_format": "FRACTAL_NZ", "device_shape": [2, 1, 16, 16], "c0": 16, "nbytes": 1024}],
        "outputs": [{"name": "z", "shape": [-1, 16], "dtype": "float16", "format": "ND",
                     "device_format": "ND", "device_shape": [8, 16], "c0": None, "nbytes": 256}],
        "dynamic": {"mode": "batch", "gears": [{"x": [1, 32]}, {"x": [8, 32]}]},
        "memory": {"arena_bytes": 2048, "lower_bound_bytes": 1536, "no_reuse_bytes": 4096, "alignment": 256},
        "transdata": [{"name": "trans_x", "src_format": "ND", "dst_format": "FRACTAL_NZ", "shape": [8, 32],
                       "dtype": "float16", "bytes": 512, "onnx_nodes": ["mm"], "reason": "MatMul wants NZ"}],
        "transdata_naive_count": 3,
        "node_formats": {"mm": {"op_type": "MatMul", "engine": "AI Core", "input_formats": ["FRACTAL_NZ", "FRACTAL_NZ"],
                                "output_formats": ["FRACTAL_NZ"], "dtype": "float16"},
                         "relu": {"op_type": "Relu", "engine": "AI Core", "input_formats": ["ND"],
                                  "output_formats": ["ND"], "dtype": "float16"}},
        "cost": {"estimated": True, "formattrans_share": 0.125},
        "source_model": "model.onnx",
    }
    m.update(over)
    return m


def _weights(name="w"):
    return [WeightEntry(name, "ND", (32, 16), np.ones((32, 16), np.float16))]


@pytest.fixture
def bundle_path(tmp_path):
    p = tmp_path / "model.anything"
    write_bundle(p, manifest(), _graph(), _weights())
    return p


def test_bundle_summary(bundle_path):
    r = inspect(bundle_path, layers=True)
    b = r.bundle
    assert r.kind == "bundle" and r, r.problems
    assert (b["soc"], b["precision_mode"], b["producer_version"]) == ("Ascend310P3", "force_fp16", "0.1.0")
    assert [(i["name"], i["shape"], i["device_format"], i["nbytes"]) for i in r.inputs] == [
        ("x", [-1, 32], "FRACTAL_NZ", 1024)]
    assert [o["name"] for o in r.outputs] == ["z"]
    assert b["dynamic"] == {"mode": "batch", "gears": [{"x": [1, 32]}, {"x": [8, 32]}]}
    assert b["memory"]["arena_bytes"] == 2048 and b["transdata_naive_count"] == 3
    assert b["formattrans_share"] == 0.125
    assert b["weights"] == {"count": 1, "bytes": 32 * 16 * 2}
    assert b["graph"] == {"nodes": 2, "constant_folded": 0, "opset": 17}
    assert r.op_types == {"MatMul": 1, "Relu": 1}
    assert [(t["name"], t["src_format"], t["dst_format"]) for t in r.layout_ops] == [("trans_x", "ND", "FRACTAL_NZ")]
    assert all(c["ok"] for c in b["integrity"]) and len(b["integrity"]) >= 5
    assert b["node_formats"]["mm"]["input_formats"] == ["FRACTAL_NZ", "FRACTAL_NZ"]
    text = render_text(r, layers=True)
    assert "FRACTAL_NZ" in text and "batch, 2 gears: x:[1,32]; x:[8,32]" in text
    assert text.splitlines()[-1] == r.verdict()
    assert r.verdict() == ("offline bundle for Ascend310P3 (force_fp16): 1 input, 1 output, 2 nodes, "
                           "1 TransData planned; integrity OK")


@pytest.mark.parametrize("over,problem", [
    ({"inputs": [{"name": "not_x", "shape": [1], "dtype": "float16"}]}, "manifest inputs match"),
    ({"outputs": []}, "manifest outputs match"),
    ({"memory": {"arena_bytes": 1000, "lower_bound_bytes": 0, "no_reuse_bytes": 4096, "alignment": 256}},
     "256-byte aligned"),
    ({"memory": {"arena_bytes": 8192, "lower_bound_bytes": 0, "no_reuse_bytes": 4096, "alignment": 256}},
     "within its bounds"),
    ({"transdata_naive_count": 0}, "naive count"),
    ({"outputs": [{"name": "z", "shape": [-1, 16], "dtype": "float16", "device_shape": [-1, 16], "nbytes": -512}]},
     "concrete device shape"),
])
def test_bundle_consistency_problems(tmp_path, over, problem):
    p = tmp_path / "b"
    write_bundle(p, manifest(**over), _graph(), _weights())
    r = inspect(p)
    assert not r and any(problem in x for x in r.problems)
    assert "integrity problem" in r.verdict()


def test_unused_weight_is_a_problem(tmp_path):
    p = tmp_path / "b"
    write_bundle(p, manifest(), _graph(), _weights() + [WeightEntry("orphan", "ND", (2,), np.ones(2, np.float16))])
    r = inspect(p)
    assert any("unused: ['orphan']" in x for x in r.problems)


def test_corrupt_weight_blob_is_reported_not_raised(bundle_path):
    data = bytearray(bundle_path.read_bytes())
    data[256] ^= 0xFF  # first byte of the weight blob
    bundle_path.write_bytes(bytes(data))
    r = inspect(bundle_path)
    assert not r and "weight blob checksum" in r.problems[0]
    assert inspect(bundle_path, verify=False)  # skipping the blob checksum: the rest is fine


def test_corrupt_header_raises(bundle_path):
    data = bytearray(bundle_path.read_bytes())
    data[20] ^= 1
    bundle_path.write_bytes(bytes(data))
    with pytest.raises(BundleError, match="checksum"):
        inspect(bundle_path)


def test_manifest_with_odd_types_does_not_crash(tmp_path):
    odd = manifest(inputs=[{"name": "x", "shape": 5, "nbytes": "many", "device_shape": "?"}], outputs=[7],
                   memory=[1, 2], dynamic="yes", transdata=[{"type": 3}, "t"], cost={"formattrans_share": "a"},
                   node_formats={"mm": {"input_formats": 3}, "relu": 1}, soc=None)
    p = tmp_path / "b"
    write_bundle(p, odd, _graph(), _weights())
    r = inspect(p, layers=True)
    text = render_text(r, layers=True)
    assert text.splitlines()[-1] == r.verdict()
    assert r.bundle["soc"] is None and r.bundle["formattrans_share"] is None
    # what the emulator would refuse (exit 2) inspect reports as a failed check (exit 1)
    assert not r and any(p.startswith("manifest fields have the types") and "inputs[0]" in p
                         for p in r.problems)


def _converted(tmp_path, real_model, name, **kw):
    out = tmp_path / f"{name}.bundle"
    convert(real_model(name), out, backend="builtin", **kw)
    return out


@pytest.mark.realmodel
def test_bundle_from_the_converter(tmp_path, real_model):
    out = _converted(tmp_path, real_model, "silero_vad", input_shapes={"input": (4, 576)})
    src = onnx.load(str(real_model("silero_vad")), load_external_data=False)
    r = inspect(out, layers=True)
    assert r.kind == "bundle" and r, r.problems
    assert [i["name"] for i in r.inputs] == [i.name for i in src.graph.input
                                            if i.name not in {t.name for t in src.graph.initializer}]
    assert [o["name"] for o in r.outputs] == [o.name for o in src.graph.output]
    assert r.bundle["soc"] and r.bundle["weights"]["count"] > 0
    assert len(r.layout_ops) <= (r.bundle["transdata_naive_count"] or 0) or r.bundle["transdata_naive_count"] is None


@pytest.mark.realmodel
def test_dynamic_batch_bundle_from_the_converter(tmp_path, real_model):
    out = _converted(tmp_path, real_model, "ppocr_cls", input_shapes={"x": (-1, 3, 48, 192)},
                     dynamic_batch=[1, 4])
    r = inspect(out)
    assert r, r.problems
    assert r.bundle["dynamic"] == {"mode": "batch", "gears": [{"x": [1, 3, 48, 192]}, {"x": [4, 3, 48, 192]}]}
    assert r.inputs[0]["shape"] == [-1, 3, 48, 192]
    assert r.inputs[0]["nbytes"] == 4 * 3 * 48 * 192 * np.dtype(r.inputs[0]["dtype"]).itemsize  # largest gear
    g = onnx.load(str(real_model("ppocr_cls")), load_external_data=False).graph
    assert r.op_count <= len(g.node)  # lowering may fold constants, never adds ONNX nodes


def reseal(data: bytes, *, manifest: bytes | None = None, graph: bytes | None = None) -> bytes:
    """Replace sections of a bundle and recompute its checksums (layout from bundle.py's docstring)."""
    blob_off, blob_len, graph_off, graph_len, man_off, man_len = struct.unpack_from("<6Q", data, 16)
    blob = data[blob_off:blob_off + blob_len]
    g = data[graph_off:graph_off + graph_len] if graph is None else graph
    m = data[man_off:man_off + man_len] if manifest is None else manifest
    head = bytearray(data[:256])
    graph_off = blob_off + blob_len
    man_off = graph_off + len(g)
    struct.pack_into("<6Q", head, 16, blob_off, blob_len, graph_off, len(g), man_off, len(m))
    head[64:96] = hashlib.sha256(blob).digest()
    head[96:128] = hashlib.sha256(g).digest()
    head[128:160] = hashlib.sha256(m).digest()
    struct.pack_into("<Q", head, 160, man_off + len(m))
    head[168:200] = hashlib.sha256(bytes(head[:168])).digest()
    return bytes(head) + data[256:blob_off] + blob + g + m


def test_reseal_helper_round_trips(bundle_path):
    data = bundle_path.read_bytes()
    assert reseal(data) == data


@pytest.mark.realmodel
@pytest.mark.slow
def test_inspect_counts_nodes_as_convert_does(real_model, tmp_path):
    """MiniLM folds its shape computations at compile time: convert and inspect of its bundle must give
    the same node count (they gave 122 and 354)."""
    from npu_deploy.converters.lowering.convert import convert
    from npu_deploy.runtime.check.inspect import inspect

    r = convert(real_model("minilm"), tmp_path / "m.bundle", backend="builtin",
                input_shapes={"input_ids": (1, 32), "attention_mask": (1, 32)})
    plan = r.plan_report()
    assert plan.constant_folded > 0
    v = inspect(tmp_path / "m.bundle").verdict()
    assert f"{plan.nodes} nodes ({plan.constant_folded} constant-folded)" in v, v
