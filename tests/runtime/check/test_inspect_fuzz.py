"""Fuzz ``inspect`` on mutated bundles: only the documented errors (exit 2) may come out, and whatever
is returned must render as text and JSON.

Raw byte mutations mostly stop at a checksum; to reach the manifest and graph parsing, mutated sections
are re-sealed (checksums recomputed) before inspecting. Seeds come from ``write_bundle`` and, when it is
available, from the real converter.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npu_deploy.converters.files.bundle import write_bundle
from npu_deploy.runtime.check.inspect import inspect, render_text
from npu_deploy.errors import NpuDeployError
from tests.fuzzing import byte_edits, examples, mutate
from tests.runtime.check.test_inspect_bundle import _graph, _weights, manifest, reseal

FUZZ = settings(max_examples=examples(60), deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def _converter_seed(d) -> bytes:
    """A bundle from the real converter, on a small Conv/BN/MatMul model (dynamic batch)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from npu_deploy.converters.lowering.convert import convert

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "cw"),
             numpy_helper.from_array(rng.standard_normal((8 * 4 * 4, 10)).astype(np.float32), "mw"),
             numpy_helper.from_array(np.array([-1, 8 * 4 * 4], np.int64), "shape")]
    nodes = [helper.make_node("Conv", ["x", "cw"], ["c"], name="conv", pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "shape"], ["f"], name="flat"),
             helper.make_node("MatMul", ["f", "mw"], ["y"], name="fc")]
    g = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], inits)
    src = d / "small.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(src))
    out = d / "small.bundle"
    convert(src, out, backend="builtin", input_shapes={"x": (2, 3, 8, 8)})
    return out.read_bytes()


@pytest.fixture(scope="module", params=["write_bundle", "converter"])
def seed(request, tmp_path_factory):
    d = tmp_path_factory.mktemp("seed")
    if request.param == "converter":
        return _converter_seed(d)
    p = d / "seed.bundle"
    write_bundle(p, manifest(), _graph(), _weights())
    return p.read_bytes()


def test_seeds_are_clean(tmp_path, seed):
    p = tmp_path / "seed.bundle"
    p.write_bytes(seed)
    r = inspect(p)
    assert r, r.problems


def _check(tmp_path, data: bytes) -> None:
    p = tmp_path / "fuzz.bundle"
    p.write_bytes(data)
    try:
        r = inspect(p, layers=True, ops=True)
    except NpuDeployError as e:
        assert e.exit_code == 2 and "\n" not in str(e)
        return
    text = render_text(r, ops=True, layers=True)
    assert text.splitlines()[-1] == r.verdict()
    json.loads(r.to_json())


@FUZZ
@given(edits=byte_edits(1 << 14, 4))
def test_raw_byte_mutations(tmp_path, seed, edits):
    _check(tmp_path, mutate(seed, edits))


json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12)


@FUZZ
@given(key=st.sampled_from(sorted(manifest()) + ["weights", "schema", "schema_version"]), value=json_value)
def test_resealed_manifest_with_hostile_values(tmp_path, seed, key, value):
    import struct
    man_off, man_len = struct.unpack_from("<2Q", seed, 16 + 32)
    m = json.loads(seed[man_off:man_off + man_len])
    m[key] = value
    _check(tmp_path, reseal(seed, manifest=json.dumps(m).encode()))


@FUZZ
@given(key=st.sampled_from(["inputs", "outputs", "transdata", "weights"]), field=st.text(max_size=12),
       value=json_value)
def test_resealed_manifest_entries_with_hostile_fields(tmp_path, seed, key, field, value):
    import struct
    man_off, man_len = struct.unpack_from("<2Q", seed, 16 + 32)
    m = json.loads(seed[man_off:man_off + man_len])
    if m.get(key):
        name = field if field in m[key][0] or not field else next(iter(m[key][0]))
        m[key][0][name] = value
    _check(tmp_path, reseal(seed, manifest=json.dumps(m).encode()))


@FUZZ
@given(edits=st.lists(st.tuples(st.integers(0, 1 << 12), st.integers(0, 255)), min_size=1, max_size=4),
       cut=st.one_of(st.none(), st.integers(0, 1 << 12)))
def test_resealed_graph_mutations(tmp_path, seed, edits, cut):
    import struct
    graph_off, graph_len = struct.unpack_from("<2Q", seed, 16 + 16)
    g = bytearray(seed[graph_off:graph_off + graph_len])
    for pos, val in edits:
        g[pos % len(g)] = val
    if cut is not None:
        del g[cut % (len(g) + 1):]
    _check(tmp_path, reseal(seed, graph=bytes(g)))


@pytest.fixture(scope="module")
def onnx_seed(tmp_path_factory):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((3, 4), np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
                           helper.make_node("Relu", ["y"], ["z"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["N", 4])], [w])
    d = tmp_path_factory.mktemp("onnx")
    p = d / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(p),
              save_as_external_data=True, location="w.bin", size_threshold=0)
    return p.read_bytes(), (d / "w.bin").read_bytes()


@FUZZ
@given(edits=st.lists(st.tuples(st.integers(0, 1 << 12), st.integers(0, 255)), min_size=1, max_size=4),
       cut=st.one_of(st.none(), st.integers(0, 1 << 12)))
def test_mutated_onnx(tmp_path, onnx_seed, edits, cut):
    data, weights = onnx_seed
    buf = bytearray(data)
    for pos, val in edits:
        buf[pos % len(buf)] = val
    if cut is not None:
        del buf[cut % (len(buf) + 1):]
    (tmp_path / "w.bin").write_bytes(weights)
    p = tmp_path / "m.onnx"
    p.write_bytes(bytes(buf))
    try:
        r = inspect(p, ops=True)
    except NpuDeployError as e:
        assert e.exit_code == 2 and "\n" not in str(e)
        return
    assert render_text(r, ops=True).splitlines()[-1] == r.verdict()
    json.loads(r.to_json())
