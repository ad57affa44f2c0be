"""`npu-deploy optimize` on mutated models, through the real entry point: a damaged model is refused with
one line and exit 2 (nothing written), or optimized; never an internal error (exit 4).

The mutation the fuzzer found (10 cases of ``ValueError: cannot reshape array of size 864 into shape
(32,3,3,1)`` in the input generator): a stored tensor whose dims disagree with its data, which
``onnx.checker`` accepts. Here the mutations are structured (dims of initializers and Constant values)
on top of byte flips, on the README example model and on a real model."""

from __future__ import annotations

import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import write_example
from tests.fuzzing import byte_edits, examples, mutate


def _stored(m: onnx.ModelProto) -> list[onnx.TensorProto]:
    return list(m.graph.initializer) + [a.t for n in m.graph.node if n.op_type == "Constant" for a in n.attribute
                                        if a.type == onnx.AttributeProto.TENSOR]


def _run(run_cli, path, out, shape):
    code, text, err = run_cli("optimize", path, "-o", out, "--input-shape", shape)
    assert code in (0, 2), err
    assert "internal error" not in err and "Traceback" not in err
    if code == 2:
        assert len(err.strip().splitlines()) == 1 and not out.exists()
    return code, err


def test_an_initializer_whose_dims_disagree_with_its_data_is_refused(run_cli, tmp_path):
    m = onnx.load(write_example(tmp_path / "m.onnx"))
    w = next(t for t in m.graph.initializer if t.name == "stem.w")
    assert list(w.dims) == [32, 3, 3, 3]
    w.dims[-1] = 1
    onnx.checker.check_model(m)  # the checker lets it through
    onnx.save(m, tmp_path / "bad.onnx")
    code, err = _run(run_cli, tmp_path / "bad.onnx", tmp_path / "o.onnx", "x:1,3,64,64")
    assert code == 2 and "initializer 'stem.w' with dims [32, 3, 3, 1] does not match its data" in err


@pytest.mark.slow
@settings(max_examples=examples(12), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pick=st.integers(0, 10_000), dim=st.integers(0, 7), value=st.integers(0, 70), edits=byte_edits(max_size=2),
       flip=st.booleans())
def test_mutated_example_model_is_refused_or_optimized(run_cli, tmp_path, pick, dim, value, edits, flip):
    src = tmp_path / "m.onnx"
    if not src.exists():
        write_example(src)
    m = onnx.load(src)
    stored = _stored(m)
    t = stored[pick % len(stored)]
    if t.dims:
        t.dims[dim % len(t.dims)] = value
    else:
        t.dims.append(value)
    data = m.SerializeToString()
    (tmp_path / "bad.onnx").write_bytes(mutate(data, edits) if flip else data)
    out = tmp_path / "o.onnx"
    out.unlink(missing_ok=True)
    _run(run_cli, tmp_path / "bad.onnx", out, "x:1,3,64,64")


@pytest.mark.slow
@pytest.mark.realmodel
@settings(max_examples=examples(6), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pick=st.integers(0, 10_000), dim=st.integers(0, 7), value=st.integers(0, 300))
def test_mutated_silero_is_refused_or_optimized(run_cli, real_model, tmp_path, pick, dim, value):
    m = onnx.load(real_model("silero_vad"))
    stored = [t for t in _stored(m) if t.dims]
    t = stored[pick % len(stored)]
    t.dims[dim % len(t.dims)] = value
    onnx.save(m, tmp_path / "bad.onnx")
    out = tmp_path / "o.onnx"
    out.unlink(missing_ok=True)
    _run(run_cli, tmp_path / "bad.onnx", out, "input:1,576")
