"""The one feed generator (``converters/files/feeds.py``): what each caller asks of it."""

from __future__ import annotations

import doctest

import numpy as np
from onnx import TensorProto, helper

from npu_deploy.converters.files import feeds
from npu_deploy.converters.files.feeds import InputSpec, generate_inputs, model_inputs


def spec(name, shape, dtype):
    return InputSpec(name, tuple(shape), np.dtype(dtype))


def test_docstring_examples_run():
    result = doctest.testmod(feeds)
    assert result.failed == 0 and result.attempted > 0


def test_a_range_of_zero_to_one_is_ais_bench_random_data():
    # ais_bench's --pure-data random: floats uniform in [0, 1), integers 0 or 1, one draw per input in order
    metas = [spec("a", (2, 3), "float32"), spec("b", (50,), "int64"), spec("c", (40,), "bool"), spec("d", (3, 5), "float16")]
    got = generate_inputs(metas, seed=3, val_range={"": (0, 1)})
    rng = np.random.default_rng(3)
    np.testing.assert_array_equal(got["a"], rng.random((2, 3)).astype(np.float32))
    np.testing.assert_array_equal(got["b"], rng.integers(0, 2, size=50))
    np.testing.assert_array_equal(got["c"], rng.random(40) < 0.5)
    np.testing.assert_array_equal(got["d"], rng.random((3, 5)).astype(np.float16))
    assert [got[k].dtype for k in "abcd"] == [np.float32, np.int64, np.bool_, np.float16]


def test_a_single_value_range_gives_constants_without_drawing():
    metas = [spec("i", (6,), "int32"), spec("m", (4,), "bool"), spec("t", (3,), "bool"), spec("x", (5,), "float32")]
    got = generate_inputs(metas, seed=0, val_range={"": (0, 1), "i": (0, 0), "m": (0, 0), "t": (1, 1)})
    assert not got["i"].any() and not got["m"].any() and got["t"].all()
    # the float is the stream's first draw: the constants took none
    np.testing.assert_array_equal(got["x"], np.random.default_rng(0).random(5).astype(np.float32))


def test_whole_numbers_for_pixel_inputs_and_shapes_from_gears():
    img = InputSpec("img", (-1, 3, 8, 8), np.dtype("float32"), gears=((2, 3, 8, 8), (4, 3, 8, 8)))
    got = generate_inputs([img], val_range={"img": (0, 255)}, whole={"img"})["img"]
    assert got.shape == (2, 3, 8, 8) and got.min() >= 0 and got.max() <= 255 and got.max() > 200
    assert np.array_equal(got, np.floor(got))
    # without a range: a structured normalised image, not noise in [0, 1)
    plain = generate_inputs([img])["img"]
    assert plain.min() < -1 and plain.max() > 1


def test_model_inputs_skip_initializers_and_mark_dynamic_dims():
    g = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["y"])], "g",
                          [helper.make_tensor_value_info("ids", TensorProto.INT64, ["B", 7]),
                           helper.make_tensor_value_info("table", TensorProto.FLOAT, [11, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [helper.make_tensor("table", TensorProto.FLOAT, [11, 2], [0.0] * 22)])
    m = helper.make_model(g)
    assert model_inputs(m) == [InputSpec("ids", (-1, 7), np.dtype("int64"))]
    assert feeds.index_ranges(m) == {"ids": 11}
    ids = generate_inputs(model_inputs(m), shapes={"ids": (30, 7)}, index_ranges=feeds.index_ranges(m))["ids"]
    assert ids.shape == (30, 7) and ids.min() >= 0 and ids.max() == 10
