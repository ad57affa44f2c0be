"""Weights streamed into the bundle (converters/files/weight_stream.py): the slices' bytes are the bytes of
packing the whole tensor, for every packable format; the bundle writer holds one slice, not one weight
(tracemalloc peak on a generated external-data model); a data file cut short after loading is a clear
error and leaves no output."""

from __future__ import annotations

import contextlib
import os
import tracemalloc

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from npu_deploy.converters import formats
from npu_deploy.converters.files import weight_stream
from npu_deploy.converters.files.bundle import read_bundle, write_plan_bundle
from npu_deploy.converters.lowering import pipeline
from npu_deploy.converters.lowering.options import ConvertOptions
from npu_deploy.errors import ModelError

# logical shapes per layout kind: odd sizes, so that every block axis pads in its last slice
SHAPES = {"4d": [(20, 35, 3, 2), (1, 17, 1, 1), (20, 3, 3, 2)], "5d": [(18, 33, 2, 3, 2)], "matrix": [(37, 50), (19,)],
          "nd": [(37, 50), (3, 21, 40), (5,)]}


def _cases():
    for name, f in formats.FORMATS.items():
        if not f.packable:
            continue
        for kind, layout in f.layouts.items():
            for shape in SHAPES[kind]:
                if layout.rank is not None and len(shape) != layout.rank:
                    continue
                if len(shape) < layout.min_rank:
                    continue
                for dt in ("float16", "float32", "int8"):
                    if f.dtypes is not None and dt not in f.dtypes:
                        continue
                    origin = "ND" if kind == "matrix" else None
                    try:  # the C04 formats take C <= 4 only
                        formats.storage_shape(name, shape, dt, origin=origin)
                    except formats.FormatError:
                        continue
                    yield pytest.param(name, shape, dt, 1, origin, id=f"{name}-{'x'.join(map(str, shape))}-{dt}")
        for kind in f.grouped:
            shape = (24, 5, 3, 2) if kind == "4d" else (24, 5, 2, 3, 2)
            yield pytest.param(name, shape, "float16", 3, None, id=f"{name}-grouped-{kind}")


def test_every_packable_format_is_covered():
    covered = {c.values[0] for c in _cases()}
    assert covered == {n for n, f in formats.FORMATS.items() if f.packable}


def _whole_source(arr):
    @contextlib.contextmanager
    def source():
        yield arr, lambda: None
    return source


@pytest.mark.parametrize("fmt, shape, dtype, groups, origin", list(_cases()))
@pytest.mark.parametrize("chunk_bytes", [1, 700, 1 << 30])
def test_slices_are_the_bytes_of_the_whole_pack(fmt, shape, dtype, groups, origin, chunk_bytes):
    rng = np.random.default_rng(len(shape) * 31 + groups)
    src = (rng.standard_normal(shape) * 50).astype(np.float32)  # cast to the device dtype by the stream
    kw = {"groups": groups, "origin": origin}
    want = formats.pack(src.astype(dtype), fmt, **kw)
    s = weight_stream.stream_packed(_whole_source(src), fmt, shape, dtype, groups=groups, origin=origin,
                                    chunk_bytes=chunk_bytes)
    chunks = list(s.chunks())
    assert s.shape == want.shape and s.dtype == want.dtype
    assert b"".join(np.ascontiguousarray(c).tobytes() for c in chunks) == want.tobytes()
    split = weight_stream.leading_split(fmt, shape, dtype, groups=groups, origin=origin)
    if chunk_bytes == 1 and split is not None:  # one block per slice: as many slices as blocks
        axis, step = split
        assert len(chunks) == -(-shape[axis] // step)


def test_layouts_that_do_not_split_are_packed_whole():
    assert weight_stream.leading_split("FRACTAL_Z", (24, 5, 3, 2), np.float16, groups=3) is None
    assert weight_stream.leading_split("C1HWNCoC0", (4, 20, 3, 3), np.float16) is None
    assert weight_stream.leading_split("FRACTAL_Z_C04", (16, 3, 3, 3), np.float16) is None
    assert weight_stream.leading_split("FRACTAL_Z", (64, 32), np.float16, origin="ND") == (0, 16)
    assert weight_stream.leading_split("FRACTAL_NZ", (64, 32), np.float16) == (1, 16)
    assert weight_stream.leading_split("FRACTAL_Z", (64, 32, 3, 3), np.float16) == (1, 16)


def _external_model(folder, dims=(1024, 1024, 1024, 1024), conv=(64, 64, 3, 3)):
    """A MatMul chain (FRACTAL_Z weights sliced by rows) and a Conv (sliced by input channels, a
    strided read), every weight in one external data file."""
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    with open(folder / "w.data", "wb") as f:
        def add(name, arr):
            off = f.tell()
            f.write(arr.tobytes())
            t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=arr.shape)
            t.data_location = TensorProto.EXTERNAL
            for k, v in (("location", "w.data"), ("offset", str(off)), ("length", str(arr.nbytes))):
                e = t.external_data.add()
                e.key, e.value = k, v
            inits.append(t)
        for i, (k, n) in enumerate(zip(dims, dims[1:])):
            add(f"w{i}", rng.standard_normal((k, n), dtype=np.float32))
            nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"], name=f"mm{i}"))
            prev = f"m{i}"
        add("wc", rng.standard_normal(conv, dtype=np.float32))
        nodes.append(helper.make_node("Conv", ["img", "wc"], ["c"], name="conv", pads=[1, 1, 1, 1]))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, dims[0]]),
                                       helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, conv[1], 4, 4])],
                          [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [4, dims[-1]]),
                           helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, conv[0], 4, 4])], inits)
    path = folder / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def _planned(path, precision="force_fp16"):
    o = ConvertOptions(backend="builtin", precision_mode=precision)
    return pipeline.lower(path, None, o, until="plan from ONNX")


@pytest.mark.parametrize("precision", ["force_fp16", "must_keep_origin_dtype"])
def test_writer_holds_one_slice_not_one_weight(tmp_path, monkeypatch, precision):
    path = _external_model(tmp_path)
    ctx = _planned(path, precision)
    weight = 1024 * 1024 * 4  # bytes of one float32 MatMul weight (the conv weight is smaller)
    monkeypatch.setattr(weight_stream, "CHUNK_BYTES", 64 << 10)
    # once before measuring: the format registry's per-shape recipes (index maps on the numpy path, when
    # no compiled kernel is available) are cached on first use and are not the writer's working memory
    write_plan_bundle(tmp_path / "warm.bundle", ctx.loaded, ctx.plan)
    tracemalloc.start()
    try:
        write_plan_bundle(tmp_path / "m.bundle", ctx.loaded, ctx.plan)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # packing a weight whole holds its float32 source (plus the cast and the packed copy): >= 4 MiB here
    assert peak < weight / 8, f"writer peak {peak} bytes for {weight}-byte weights"
    with read_bundle(tmp_path / "m.bundle", verify=True) as b:
        dt = np.float16 if precision == "force_fp16" else np.float32
        for name in ("w0", "w2", "wc"):
            np.testing.assert_array_equal(b.unpack(name), ctx.loaded.constant_array(name).astype(dt))


def test_streamed_bundle_equals_the_whole_packed_one(tmp_path, monkeypatch):
    path = _external_model(tmp_path)
    ctx = _planned(path)
    write_plan_bundle(tmp_path / "big_slices.bundle", ctx.loaded, ctx.plan)
    monkeypatch.setattr(weight_stream, "CHUNK_BYTES", 1 << 40)  # every weight in one slice: the whole pack
    write_plan_bundle(tmp_path / "one_slice.bundle", ctx.loaded, ctx.plan)
    assert (tmp_path / "big_slices.bundle").read_bytes() == (tmp_path / "one_slice.bundle").read_bytes()


def test_data_file_cut_after_loading_is_a_clear_error_and_no_output(tmp_path):
    path = _external_model(tmp_path)
    ctx = _planned(path)
    os.truncate(tmp_path / "w.data", 1024 * 1024 * 4 + 100)  # w0 complete, w1 cut short
    out = tmp_path / "m.bundle"
    with pytest.raises(ModelError, match="truncated") as e:
        write_plan_bundle(out, ctx.loaded, ctx.plan)
    assert "'w1'" in str(e.value) and e.value.hint
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "w.data"]


# ---------------------------------------------------------------------- large inline weights left in the file
def _inline_model(folder, n=3, dim=768):
    """MatMul weights of 2.25 MiB each inside the .onnx (raw_data), a small bias, an int64 shape."""
    rng = np.random.default_rng(1)
    inits, nodes, prev = [], [], "x"
    for i in range(n):
        inits.append(onnx.numpy_helper.from_array(rng.standard_normal((dim, dim), dtype=np.float32), f"w{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"], name=f"mm{i}"))
        prev = f"m{i}"
    inits.append(onnx.numpy_helper.from_array(rng.standard_normal(dim).astype(np.float32), "b"))
    inits.append(onnx.numpy_helper.from_array(np.array([2, dim], np.int64), "shape"))
    nodes += [helper.make_node("Add", [prev, "b"], ["a"], name="add"),
              helper.make_node("Reshape", ["a", "shape"], ["y"], name="reshape")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, dim])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, dim])], inits)
    path = folder / "inline.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path, {t.name: onnx.numpy_helper.to_array(t) for t in inits}


def test_large_inline_weights_stay_in_the_file(tmp_path):
    from npu_deploy.converters.files.onnx_model import STRIP_BYTES, load_model

    path, values = _inline_model(tmp_path)
    loaded = load_model(path)
    # the protobuf in memory holds none of the large weights: a reference to their bytes in the .onnx
    assert loaded.model.ByteSize() < STRIP_BYTES < path.stat().st_size / 3
    assert {n for n, r in loaded.constants.items() if r.external} == {"w0", "w1", "w2"}
    for name, want in values.items():
        np.testing.assert_array_equal(loaded.constant_array(name), want)


def test_bundle_of_an_inline_model_is_the_same_as_when_read_whole(tmp_path, monkeypatch):
    from npu_deploy import convert
    from npu_deploy.converters.files import onnx_model

    path, _ = _inline_model(tmp_path)
    convert(path, tmp_path / "in_place.bundle", backend="builtin")
    monkeypatch.setattr(onnx_model, "STRIP_BYTES", 1 << 40)  # every weight parsed into the protobuf
    convert(path, tmp_path / "whole.bundle", backend="builtin")
    assert (tmp_path / "in_place.bundle").read_bytes() == (tmp_path / "whole.bundle").read_bytes()


def test_large_file_that_is_not_onnx_is_still_one_clear_error(tmp_path):
    from npu_deploy.converters.files.onnx_model import load_model

    bad = tmp_path / "noise.onnx"
    bad.write_bytes(np.random.default_rng(2).bytes(3 << 20))
    with pytest.raises(ModelError, match="not an ONNX model"):
        load_model(bad)
    # a real model cut inside a weight: the scan refuses it and the normal read reports it
    path, _ = _inline_model(tmp_path)
    data = path.read_bytes()
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError, match="not an ONNX model"):
        load_model(cut)


def test_aipp_on_a_model_whose_large_weights_stay_in_the_file(tmp_path):
    """--insert-op-conf lowers a temporary copy of the model: its large weights (referred to in place in
    the user's .onnx) are carried into that copy, and the bundle computes what numpy does."""
    from npu_deploy import convert
    from npu_deploy.converters.lowering import aipp
    from npu_deploy.runtime.session import InferenceSession

    w = np.random.default_rng(3).standard_normal((72, 4096), dtype=np.float32) * 0.05  # 1.1 MiB
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"]),
                           helper.make_node("Reshape", ["r", "s"], ["f"]),
                           helper.make_node("MatMul", ["f", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4096])],
                          [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(np.array([1, 72]), "s")])
    src = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), src)
    cfg = tmp_path / "a.cfg"
    aipp.write_config(cfg, [aipp.from_flags(input_format="RGB888_U8", size=(6, 4), mean=[100, 110, 120],
                                            std=[50, 60, 70])])
    convert(src, tmp_path / "m.bundle", backend="builtin", insert_op_conf=cfg,
            precision_mode="must_keep_origin_dtype")
    raw = np.arange(72, dtype=np.uint8).reshape(1, 4, 6, 3) * 3
    with InferenceSession(tmp_path / "m.bundle") as s:
        got = s.run(None, {"x": raw})[0]
    x = np.maximum((raw.astype(np.float32) - [100, 110, 120]) / [50, 60, 70], 0).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(got, x.reshape(1, 72).astype(np.float32) @ w, atol=1e-3)


def test_a_linked_inline_model_is_read_whole_and_converts(tmp_path):
    """A model that is a symlink to a file in another folder (a download cache's blobs): references to
    its own bytes would leave the model's folder, so it is read whole, as before."""
    from npu_deploy import convert
    from npu_deploy.converters.files.onnx_model import load_model

    (tmp_path / "blobs").mkdir()
    path, values = _inline_model(tmp_path / "blobs")
    (tmp_path / "snap").mkdir()
    link = tmp_path / "snap" / "model.onnx"
    link.symlink_to(path)
    loaded = load_model(link)
    assert not any(r.external for r in loaded.constants.values())
    convert(link, tmp_path / "linked.bundle", backend="builtin")
    convert(path, tmp_path / "direct.bundle", backend="builtin")
    with read_bundle(tmp_path / "linked.bundle") as a, read_bundle(tmp_path / "direct.bundle") as b:
        for name in values:
            np.testing.assert_array_equal(a.unpack(name), b.unpack(name))
