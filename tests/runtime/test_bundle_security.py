"""A bundle from a stranger cannot make the emulator read files: every route is refused at read.

The attack (issue 12): a bundle written by ``write_bundle``, then its lowered graph hand-edited so that
an initializer keeps its data "externally" in a file of the current folder, and the file re-sealed
(checksums recomputed, as an attacker would). onnxruntime, given such a graph, reads the file and
returns its bytes as an output. ``npu-deploy run`` must refuse the bundle (exit 2, one line) and
``inspect`` must call it not intact (exit 1), naming the tensor.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npu_deploy.converters.files.bundle import check_self_contained, read_bundle, write_bundle
from npu_deploy.runtime.check.inspect import inspect
from npu_deploy.errors import BundleError
from tests.runtime.check.test_inspect_bundle import reseal
from tests.runtime.bundles import io_entry

SECRET = b"PRIVATE KEY: not for bundles\n" * 3


def _graph(w: onnx.TensorProto, extra_nodes=(), extra_inits=()) -> onnx.ModelProto:
    """x -> z (Identity); the weight w -> y (Identity)."""
    nodes = [helper.make_node("Identity", ["x"], ["z"], name="pass"),
             helper.make_node("Identity", ["w"], ["y"], name="leak"), *extra_nodes]
    g = helper.make_graph(nodes, "lowered", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, [len(SECRET)]),
                           helper.make_tensor_value_info("z", TensorProto.FLOAT, [1])],
                          [w, *extra_inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _external(t: onnx.TensorProto, location: str = "secret.txt") -> onnx.TensorProto:
    """``t`` with its bytes replaced by a reference to ``location`` (what ``onnx.save_as_external_data``
    writes, pointed at a file the attacker wants read)."""
    t = onnx.TensorProto.FromString(t.SerializeToString())
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", "0"), ("length", str(len(SECRET)))):
        e = t.external_data.add()
        e.key, e.value = k, v
    return t


def _inline_w() -> onnx.TensorProto:
    return numpy_helper.from_array(np.zeros(len(SECRET), np.uint8), "w")


def _manifest() -> dict:
    return {"producer": "npu-deploy", "soc": "Ascend310P3", "precision_mode": "must_keep_origin_dtype",
            "inputs": [io_entry("x", [1])], "outputs": [io_entry("y", [len(SECRET)], "uint8"), io_entry("z", [1])]}


def _hostile(folder, graph: onnx.ModelProto, name="hostile.bundle"):
    """A clean bundle from the writer, then its graph section swapped for ``graph`` and re-sealed."""
    path = folder / name
    write_bundle(path, _manifest(), _graph(_inline_w()), [])
    path.write_bytes(reseal(path.read_bytes(), graph=graph.SerializeToString()))
    return path


@pytest.fixture
def attack(tmp_path, monkeypatch):
    """The crafted bundle, with the secret file in the current folder."""
    (tmp_path / "secret.txt").write_bytes(SECRET)
    monkeypatch.chdir(tmp_path)
    return _hostile(tmp_path, _graph(_external(_inline_w())))


def test_the_attack_is_real_in_onnxruntime(attack):
    """Oracle for the tests below: onnxruntime itself, handed the crafted graph, returns the file."""
    import onnxruntime as ort

    with pytest.raises(BundleError):
        read_bundle(attack)
    b = read_bundle(attack, check=False)
    sess = ort.InferenceSession(b.graph.SerializeToString(), providers=["CPUExecutionProvider"])
    b.close()
    (y,) = sess.run(["y"], {"x": np.zeros(1, np.float32)})
    assert y.tobytes() == SECRET


def test_emulator_refuses_the_crafted_bundle(attack):
    from npu_deploy.runtime.emulator import EmulatorBackend

    with pytest.raises(BundleError, match=r"initializer 'w' keeps its data in an external file \('secret.txt'\)"):
        with EmulatorBackend(attack) as b:
            b.run(None, {"x": np.zeros(1, np.float32)})  # the old code returned SECRET as y here


def test_run_refuses_with_one_line_and_writes_nothing(attack, tmp_path, run_cli):
    out = tmp_path / "outs"
    code, stdout, stderr = run_cli("run", attack, "--loop", "1", "--warmup", "0", "--output", out)
    assert code == 2, (stdout, stderr)
    assert len(stderr.strip().splitlines()) == 1 and "external file" in stderr and "'w'" in stderr
    assert "Traceback" not in stderr
    assert not out.exists() or not any(SECRET in p.read_bytes() for p in out.rglob("*") if p.is_file())


def test_inspect_reports_the_bundle_as_not_intact(attack, run_cli):
    r = inspect(attack)
    assert not r
    assert any("self-contained" in p and "initializer 'w'" in p and "external file" in p for p in r.problems)
    code, stdout, stderr = run_cli("inspect", attack)
    assert code == 1, (stdout, stderr)
    assert "integrity OK" not in stdout and "external file" in stdout


def _if_node(inner: onnx.TensorProto) -> onnx.NodeProto:
    branch = helper.make_graph([helper.make_node("Identity", [inner.name], ["b"])], "then", [],
                               [helper.make_tensor_value_info("b", TensorProto.UINT8, [len(SECRET)])], [inner])
    return helper.make_node("If", ["cond"], ["if_out"], name="branchy", then_branch=branch, else_branch=branch)


def _route_graphs():
    """Every route to external data, functions or foreign ops, each as a full lowered graph."""
    ext = _external(_inline_w())
    yield "initializer", _graph(ext), "initializer 'w'"
    const = helper.make_node("Constant", [], ["c"], name="const", value=_external(_inline_w()))
    yield "Constant attribute", _graph(_inline_w(), [const]), "node 'const' (Constant) attribute 'value'"
    inner = _external(numpy_helper.from_array(np.zeros(len(SECRET), np.uint8), "inner"))
    cond = numpy_helper.from_array(np.array(True), "cond")
    yield "subgraph initializer", _graph(_inline_w(), [_if_node(inner)], [cond]), "initializer 'inner'"
    m = _graph(_inline_w())
    vals = _external(numpy_helper.from_array(np.zeros(len(SECRET), np.uint8), "sp"))
    idx = numpy_helper.from_array(np.arange(len(SECRET), dtype=np.int64), "sp_idx")
    m.graph.sparse_initializer.append(helper.make_sparse_tensor(vals, idx, [len(SECRET)]))
    yield "sparse initializer", m, "sparse initializer 'sp'"
    m = _graph(_inline_w(), [helper.make_node("EPContext", ["x"], ["e"], name="ep", domain="com.microsoft",
                                              ep_cache_context="secret.txt", embed_mode=0)])
    yield "contrib op that reads a file", m, "node 'ep' (EPContext) is in op domain 'com.microsoft'"
    m = _graph(_inline_w(), [helper.make_node("Leak", ["x"], ["e"], name="custom", domain="my.custom.ops")])
    yield "custom domain", m, "op domain 'my.custom.ops'"
    m = _graph(_inline_w())
    m.functions.append(helper.make_function("my.fn", "Twice", ["a"], ["b"],
                                            [helper.make_node("Add", ["a", "a"], ["b"])],
                                            [helper.make_opsetid("", 17)]))
    yield "local function", m, "function 'my.fn':'Twice'"
    m = _graph(_inline_w())
    onnx.helper.set_model_props(m, {"ort_config": '{"session_options": {"enable_profiling": true}}'})
    yield "onnxruntime session options in the metadata", m, "metadata 'ort_config'"


ROUTES = list(_route_graphs())


@pytest.mark.parametrize("label,graph,named", ROUTES, ids=[r[0] for r in ROUTES])
def test_every_route_is_refused_at_read_and_at_write(tmp_path, label, graph, named):
    path = _hostile(tmp_path, graph)
    with pytest.raises(BundleError) as e:
        read_bundle(path)
    assert named in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(BundleError, match="lowered graph"):
        check_self_contained(graph)
    with pytest.raises(BundleError):  # the writer refuses it too: a converter never writes such a file
        write_bundle(tmp_path / "written.bundle", _manifest(), graph, [])
    assert not (tmp_path / "written.bundle").exists()
    r = inspect(path)
    assert not r and any(named in p for p in r.problems)


def test_clean_graphs_pass(tmp_path, example_onnx):
    import npu_deploy

    check_self_contained(_graph(_inline_w()))
    out = tmp_path / "example.bundle"
    npu_deploy.convert(str(example_onnx), output=str(out), backend="builtin")
    with read_bundle(out) as b:
        check_self_contained(b.graph)
    assert inspect(out)
