"""Format algebra against an independent oracle: per-element index maps written from the formulas of
``shared/reference/formats.md`` §2 and §4 (not from the registry patterns), on small random shapes.

Properties, for random shapes, dtypes, C0 and origins:
* storage shape == the reference's shape formula;
* pack(x) == the oracle loop's array, byte for byte (padding therefore zero);
* unpack(pack(x)) == x; offset()/offsets() == the oracle offset;
both with the fast copy path and with plain numpy assignment.
"""

from __future__ import annotations

import contextlib
import itertools

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npu_deploy.converters.formats import _fastcopy
from npu_deploy.converters import formats as F


def ceil(a, b):
    return (a + b - 1) // b


# ---------------------------------------------------------------------------------- the oracle
# Each entry: (storage shape, offset function) for a logical shape in the reference's own layout.

def o_nc1hwc0(shape, c0):
    n_, c_, h_, w_ = shape
    c1 = ceil(c_, c0)
    return (n_, c1, h_, w_, c0), lambda n, c, h, w: (((n * c1 + c // c0) * h_ + h) * w_ + w) * c0 + c % c0


def o_ndc1hwc0(shape, c0):
    n_, c_, d_, h_, w_ = shape
    c1 = ceil(c_, c0)
    return ((n_, d_, c1, h_, w_, c0),
            lambda n, c, d, h, w: ((((n * d_ + d) * c1 + c // c0) * h_ + h) * w_ + w) * c0 + c % c0)


def o_fz(shape, c0):
    n_, c_, h_, w_ = shape
    c1, n1 = ceil(c_, c0), ceil(n_, 16)
    return ((c1 * h_ * w_, n1, 16, c0),
            lambda n, c, h, w: ((((c // c0) * h_ + h) * w_ + w) * n1 + n // 16) * 16 * c0 + (n % 16) * c0 + c % c0)


def o_fz_2d(shape, c0):
    k_, n_ = shape
    n1 = ceil(n_, 16)
    return (ceil(k_, c0), n1, 16, c0), lambda k, n: ((k // c0 * n1 + n // 16) * 16 + n % 16) * c0 + k % c0


def o_fz_groups(shape_hwcn, c0, g):
    """§4.6, literally: HWCN weight with C = Cin_g, N = Cout."""
    h_, w_, cin_g, cout = shape_hwcn
    cout_g = cout // g
    lcm = np.lcm
    e = min(int(lcm(lcm(cin_g, c0) // cin_g, lcm(cout_g, 16) // cout_g)), g)
    cin_opt = ceil(e * cin_g, c0) * c0
    cout_opt = ceil(e * cout_g, 16) * 16
    c1 = cin_opt // c0
    gp = ceil(g, e)

    def off(h, w, c, n):
        gi, nl = divmod(n, cout_g)
        ev = gi % e
        ci, co = ev * cin_g + c, ev * cout_g + nl
        return (((((gi // e) * c1 + ci // c0) * h_ + h) * w_ + w) * cout_opt + co) * c0 + ci % c0

    return (gp * c1 * h_ * w_, cout_opt // 16, 16, c0), off


def o_fz_c04(shape, c0):
    n_, c_, h_, w_ = shape
    k1, n1 = ceil(4 * h_ * w_, c0), ceil(n_, 16)

    def off(n, c, h, w):
        k = (h * w_ + w) * 4 + c
        return ((k // c0 * n1 + n // 16) * 16 + n % 16) * c0 + k % c0

    return (k1, n1, 16, c0), off


def o_fz3d(shape, c0):
    n_, c_, d_, h_, w_ = shape
    c1, n1 = ceil(c_, c0), ceil(n_, 16)
    return ((d_ * c1 * h_ * w_, n1, 16, c0),
            lambda n, c, d, h, w: (((((d * c1 + c // c0) * h_ + h) * w_ + w) * n1 + n // 16) * 16 + n % 16) * c0
            + c % c0)


def o_c1hwncoc0(shape_hwcn, c0):
    h_, w_, c_, n_ = shape_hwcn
    c1 = ceil(c_, c0)
    return ((c1, h_, w_, n_, c0, c0),
            lambda h, w, c, n: (((((c // c0) * h_ + h) * w_ + w) * n_ + n) * c0 + c % c0) * c0 + c % c0)


def o_nz(shape, c0):
    *batch, m_, n_ = shape
    m1, n1 = ceil(m_, 16), ceil(n_, c0)

    def off(*idx):
        *b, i, j = idx
        bf = 0
        for bi, bs in zip(b, batch):
            bf = bf * bs + bi
        return (((bf * n1 + j // c0) * m1 + i // 16) * 16 + i % 16) * c0 + j % c0

    return (*batch, n1, m1, 16, c0), off


def o_plain(order_from, order_to):
    def make(shape, c0):
        dims = dict(zip(order_from, shape))
        out_shape = tuple(dims[a] for a in order_to)

        def off(*idx):
            at = dict(zip(order_from, idx))
            o = 0
            for a in order_to:
                o = o * dims[a] + at[a]
            return o

        return out_shape, off

    return make


# format -> (oracle, logical rank of the oracle's layout, the origin to call the API with)
ORACLES = {
    "NC1HWC0": (o_nc1hwc0, 4, "NCHW"),
    "NC1HWC0_C04": (lambda s, c0: o_nc1hwc0(s, 4), 4, "NCHW"),
    "NDC1HWC0": (o_ndc1hwc0, 5, "NCDHW"),
    "FRACTAL_Z": (o_fz, 4, "NCHW"),
    "FRACTAL_Z_C04": (o_fz_c04, 4, "NCHW"),
    "FRACTAL_Z_3D": (o_fz3d, 5, "NCDHW"),
    "C1HWNCoC0": (o_c1hwncoc0, 4, "HWCN"),
    "FRACTAL_NZ": (o_nz, None, "ND"),
    "NHWC": (o_plain("nchw", "nhwc"), 4, "NCHW"),
    "HWCN": (o_plain("nchw", "hwcn"), 4, "NCHW"),
    "NDHWC": (o_plain("ncdhw", "ndhwc"), 5, "NCDHW"),
    "NCDHW": (o_plain("ncdhw", "ncdhw"), 5, "NCDHW"),
    "NCHW": (o_plain("nchw", "nchw"), 4, "NCHW"),
}

DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.int8, np.uint8, np.int32, np.int16, np.int64,
          np.float64, np.bool_, ml_dtypes.float8_e4m3fn]


def oracle_pack(x, storage, off):
    flat = np.zeros(int(np.prod(storage)), x.dtype)
    for idx in np.ndindex(*x.shape):
        flat[off(*idx)] = x[idx]
    return flat.reshape(storage)


def random_array(rng, shape, dtype):
    dt = np.dtype(dtype)
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * dt.itemsize, dtype=np.uint8)
    if dt == np.bool_:
        raw = raw % 2
    return raw.view(dt).reshape(shape)  # any bit pattern, NaNs included: results are compared as bytes


def assert_same_bytes(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    assert a.tobytes() == b.tobytes()


@contextlib.contextmanager
def copy_mode(mode):
    """"gather": the shipped path (small tensors: one np.take through the recipe's index map);
    "pieces": the recipe's piece copies through the fast copy (gather off); "plain": the derived
    interpreter with plain numpy assignment per piece (fast copy off)."""
    old = _fastcopy.ENABLED, F._GATHER_MAX, F._GATHER_FALLBACK_MAX
    _fastcopy.ENABLED = mode != "plain"
    if mode == "pieces":
        F._GATHER_MAX = F._GATHER_FALLBACK_MAX = 0
    F._clear_recipes()
    try:
        yield
    finally:
        _fastcopy.ENABLED, F._GATHER_MAX, F._GATHER_FALLBACK_MAX = old
        F._clear_recipes()


def check(fmt, shape, dtype, c0=None, rng=None, fast="gather", **kw):
    oracle, _, origin = ORACLES[fmt]
    origin = kw.pop("origin", origin)
    rng = rng or np.random.default_rng(0)
    x = random_array(rng, shape, dtype)
    c0_eff = c0 if c0 is not None else F.default_c0(dtype)
    storage, off = oracle(shape, c0_eff)
    assert F.storage_shape(fmt, shape, dtype, c0=c0, origin=origin, **kw) == tuple(storage)
    want = oracle_pack(x, storage, off)
    with copy_mode(fast if isinstance(fast, str) else ("gather" if fast else "plain")):
        got = F.pack(x, fmt, c0=c0, origin=origin, **kw)
        assert_same_bytes(got, want)
        back = F.unpack(got, fmt, shape, origin=origin, **kw)  # C0 read from the storage shape
        assert_same_bytes(back, x)
        # again, from the cached recipe, into dirty preallocated buffers (padding must be re-zeroed)
        out = np.empty_like(want)
        out.view(np.uint8).fill(0x5A)
        assert F.pack(x, fmt, c0=c0, origin=origin, out=out, **kw) is out
        assert_same_bytes(out, want)
        back = np.empty_like(x)
        back.view(np.uint8).fill(0xA5)
        assert F.unpack(got, fmt, shape, origin=origin, out=back, **kw) is back
        assert_same_bytes(back, x)
    offs = F.offsets(fmt, shape, dtype, c0=c0, origin=origin, **kw)
    assert offs.shape == tuple(shape)
    for idx in itertools.islice(np.ndindex(*shape), 0, None, max(1, int(np.prod(shape)) // 50)):
        assert F.offset(fmt, shape, idx, dtype, c0=c0, origin=origin, **kw) == off(*idx) == offs[idx]
    assert sorted(offs.reshape(-1).tolist()) == sorted(off(*i) for i in np.ndindex(*shape))
    assert F.nbytes(fmt, shape, dtype, c0=c0, origin=origin, **kw) == int(np.prod(storage)) * np.dtype(dtype).itemsize


# ---------------------------------------------------------------------------------- strategies
small = st.integers(1, 5)
chan = st.integers(1, 40)


@st.composite
def cases(draw):
    fmt = draw(st.sampled_from(sorted(ORACLES)))
    dtype = draw(st.sampled_from(DTYPES))
    if fmt == "C1HWNCoC0":
        dtype = draw(st.sampled_from([np.float16, np.float32, np.int8]))
    c0 = None
    if fmt in ("NC1HWC0", "NDC1HWC0", "FRACTAL_Z", "FRACTAL_Z_3D", "FRACTAL_NZ", "C1HWNCoC0"):
        c0 = draw(st.sampled_from([None, None, 8, 16, 32, 4]))
    if fmt == "FRACTAL_NZ":
        batch = draw(st.lists(st.integers(1, 3), max_size=2))
        shape = (*batch, draw(st.integers(1, 40)), draw(st.integers(1, 40)))
    elif fmt == "FRACTAL_Z_C04":
        shape = (draw(st.integers(1, 40)), draw(st.integers(1, 4)), draw(small), draw(small))
    elif fmt == "C1HWNCoC0":
        shape = (draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(chan), draw(st.integers(1, 3)))
    elif ORACLES[fmt][1] == 5:
        shape = (draw(st.integers(1, 20)), draw(chan), draw(st.integers(1, 3)), draw(small), draw(small))
    else:
        shape = (draw(st.integers(1, 20)), draw(chan), draw(small), draw(small))
    if np.prod(shape) > 1500:
        shape = tuple(max(1, s // 2) for s in shape)
    return fmt, shape, dtype, c0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.sampled_from(["gather", "pieces", "plain"]), st.integers(0, 2**32 - 1))
def test_against_oracle(case, fast, seed):
    fmt, shape, dtype, c0 = case
    check(fmt, shape, dtype, c0, np.random.default_rng(seed), fast=fast)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 3), st.integers(1, 17), st.integers(1, 6),
       st.sampled_from([np.float16, np.float32, np.int8]), st.integers(0, 2**32 - 1))
def test_grouped_fractal_z_against_oracle(h, w, cin_g, groups, cout_g, dtype, seed):
    shape = (h, w, cin_g, groups * cout_g)
    rng = np.random.default_rng(seed)
    x = random_array(rng, shape, dtype)
    storage, off = o_fz_groups(shape, F.default_c0(dtype), groups)
    assert F.storage_shape("FRACTAL_Z", shape, dtype, groups=groups, origin="HWCN") == storage
    got = F.pack(x, "FRACTAL_Z", groups=groups, origin="HWCN")
    assert_same_bytes(got, oracle_pack(x, storage, off))
    assert_same_bytes(F.unpack(got, "FRACTAL_Z", shape, groups=groups, origin="HWCN"), x)
    for idx in np.ndindex(*shape):
        assert F.offset("FRACTAL_Z", shape, idx, dtype, groups=groups, origin="HWCN") == off(*idx)
    # the same weight given as NCHW [Cout, Cin_g, H, W] lays out identically
    nchw = np.ascontiguousarray(x.transpose(3, 2, 0, 1))
    assert F.pack(nchw, "FRACTAL_Z", groups=groups).tobytes() == got.tobytes()


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 40), st.integers(1, 40), st.sampled_from([None, 8, 16, 32]),
       st.sampled_from([np.float16, np.float32, np.int8]))
def test_fc_weight_is_nz_of_transpose(k, n, c0, dtype):
    x = random_array(np.random.default_rng(k * 100 + n), (k, n), dtype)
    storage, off = o_fz_2d((k, n), c0 or F.default_c0(dtype))
    got = F.pack(x, "FRACTAL_Z", c0=c0)
    assert_same_bytes(got, oracle_pack(x, storage, off))
    assert got.tobytes() == F.pack(np.ascontiguousarray(x.T), "FRACTAL_NZ", c0=c0).tobytes()


# Awkward shapes and every dtype, deterministically (hypothesis covers the rest).
AWKWARD = [
    ("NC1HWC0", (1, 1, 1, 1)), ("NC1HWC0", (2, 17, 3, 1)), ("NC1HWC0", (1, 33, 1, 7)), ("NC1HWC0", (3, 64, 2, 2)),
    ("FRACTAL_Z", (1, 1, 1, 1)), ("FRACTAL_Z", (17, 33, 3, 3)), ("FRACTAL_Z", (16, 16, 1, 1)),
    ("FRACTAL_NZ", (1, 1)), ("FRACTAL_NZ", (16, 16)), ("FRACTAL_NZ", (2, 3, 17, 33)), ("FRACTAL_NZ", (33, 1)),
    ("FRACTAL_Z_3D", (17, 3, 2, 3, 3)), ("NDC1HWC0", (2, 35, 2, 1, 3)), ("FRACTAL_Z_C04", (33, 3, 7, 7)),
    ("C1HWNCoC0", (3, 3, 33, 1)), ("NC1HWC0_C04", (2, 3, 5, 5)),
]


@pytest.mark.parametrize("fmt,shape", AWKWARD)
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.int8, np.uint8, np.int32])
def test_awkward_shapes(fmt, shape, dtype):
    if fmt == "C1HWNCoC0" and dtype not in (np.float16, np.float32, np.int8):
        # GE's C1HWNCoC0 transfer supports fp32, fp16 and int8 only: other dtypes are refused, clearly.
        x = np.ones(shape, dtype)
        with pytest.raises(F.FormatError, match="does not support dtype"):
            F.pack(x, fmt, origin="HWCN")
        return
    check(fmt, shape, dtype)


@pytest.mark.parametrize("fmt,shape,c0", [
    ("NC1HWC0", (3, 70, 20, 24), None), ("FRACTAL_NZ", (3, 100, 130), None), ("FRACTAL_NZ", (64, 300), 8),
    ("FRACTAL_Z", (70, 40, 3, 3), None), ("NDC1HWC0", (2, 40, 3, 10, 12), None)])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.int8])
def test_fast_path_equals_plain_numpy_on_larger_tensors(fmt, shape, c0, dtype, monkeypatch):
    """With the fast copy's thresholds lowered, every strategy (tasks, threads, hoisting, gathers) runs
    on these tensors: it must give exactly the plain result."""
    monkeypatch.setattr(_fastcopy, "_SMALL", 1)
    monkeypatch.setattr(_fastcopy, "_TASK_BYTES", 4096)
    monkeypatch.setattr(_fastcopy, "_PARALLEL_BYTES", 1)
    monkeypatch.setenv("NPU_DEPLOY_THREADS", "2")
    x = random_array(np.random.default_rng(1), shape, dtype)
    old = _fastcopy.ENABLED
    try:
        _fastcopy.ENABLED = False
        want = F.pack(x, fmt, c0=c0)
        _fastcopy.ENABLED = True
        got = F.pack(x, fmt, c0=c0)
        assert_same_bytes(got, want)
        assert_same_bytes(F.unpack(got, fmt, shape), x)
    finally:
        _fastcopy.ENABLED = old
    # and the plain result is right: spot-check offsets against the oracle formula
    oracle, _, _ = ORACLES[fmt]
    _, off = oracle(shape, c0 or F.default_c0(dtype))
    flat = want.reshape(-1)
    rng = np.random.default_rng(2)
    for _ in range(300):
        idx = tuple(int(rng.integers(0, s)) for s in shape)
        assert flat[off(*idx)].tobytes() == x[idx].tobytes()


def test_non_contiguous_and_strided_inputs():
    base = random_array(np.random.default_rng(3), (4, 40, 30, 30), np.float16)
    x = base[::2, :, ::-1, 1:]                       # negative and odd strides
    got = F.pack(x, "NC1HWC0")
    assert_same_bytes(got, F.pack(np.ascontiguousarray(x), "NC1HWC0"))
    m = random_array(np.random.default_rng(4), (300, 200), np.float16).T
    assert_same_bytes(F.pack(m, "FRACTAL_NZ"), F.pack(np.ascontiguousarray(m), "FRACTAL_NZ"))


# ---------------------------------------------------------------------------------- real weights
def model_constants(path):
    """name -> array of every initializer and Constant-node tensor of a real ONNX model."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].HasField("t"):
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return model, values


def oracle_pack_vectorised(x, storage, off):
    flat = np.zeros(int(np.prod(storage)), x.dtype)
    flat[np.asarray(off(*np.indices(x.shape)))] = x
    return flat.reshape(storage)


@pytest.mark.realmodel
@pytest.mark.parametrize("name", ["ppocr_cls", "ppocr_rec"])
def test_real_weights_against_oracle(real_model, name):
    """Every Conv weight (grouped and depthwise included, with the model's own ``group``) to FRACTAL_Z,
    every constant MatMul weight to FRACTAL_Z (FC) and FRACTAL_NZ, as fp16 and int8 bytes."""
    from onnx import helper

    model, values = model_constants(real_model(name))
    n_conv = n_grouped = n_matmul = 0
    for node in model.graph.node:
        if node.op_type == "Conv" and node.input[1] in values:
            w = values[node.input[1]]
            groups = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "group"), 1)
            for dtype in (np.float16, np.int8):
                x = w.astype(dtype) if dtype == np.float16 else w.view(np.uint8)[..., ::4].astype(np.int8)
                x = np.ascontiguousarray(x)
                c0 = F.default_c0(dtype)
                if groups == 1:
                    storage, off = o_fz(x.shape, c0)
                    got = F.pack(x, "FRACTAL_Z")
                else:
                    hwcn = np.ascontiguousarray(x.transpose(2, 3, 1, 0))
                    storage, off = o_fz_groups(hwcn.shape, c0, groups)
                    got = F.pack(x, "FRACTAL_Z", groups=groups)          # given as NCHW
                    x = hwcn
                    n_grouped += 1
                assert_same_bytes(got, oracle_pack_vectorised(x, storage, off))
                back = F.unpack(got, "FRACTAL_Z", x.shape, groups=groups, origin="HWCN" if groups > 1 else None)
                assert_same_bytes(back, x)
            n_conv += 1
        elif node.op_type == "MatMul" and node.input[1] in values and values[node.input[1]].ndim == 2:
            w = values[node.input[1]].astype(np.float16)
            storage, off = o_fz_2d(w.shape, 16)
            assert_same_bytes(F.pack(w, "FRACTAL_Z"), oracle_pack_vectorised(w, storage, off))
            storage, off = o_nz(w.shape, 16)
            nz = F.pack(w, "FRACTAL_NZ")
            assert_same_bytes(nz, oracle_pack_vectorised(w, storage, off))
            assert_same_bytes(F.unpack(nz, "FRACTAL_NZ", w.shape), w)
            n_matmul += 1
    assert n_conv > 30 and n_grouped > 5
    if name == "ppocr_rec":
        assert n_matmul > 0


def o_fz3d_groups(shape_ncdhw, c0, g):
    """§4.6 applied to FRACTAL_Z_3D with D after the group index, as msit's ``to_fractal_z_3d``
    orders it: (real_g, d, cin1_g, h, w, cout_g, c0)."""
    cout, cin_g, d_, h_, w_ = shape_ncdhw
    cout_g = cout // g
    lcm = np.lcm
    e = min(int(lcm(lcm(cin_g, c0) // cin_g, lcm(cout_g, 16) // cout_g)), g)
    cin_opt = ceil(e * cin_g, c0) * c0
    cout_opt = ceil(e * cout_g, 16) * 16
    c1 = cin_opt // c0

    def off(n, c, d, h, w):
        gi, nl = divmod(n, cout_g)
        ev = gi % e
        ci, co = ev * cin_g + c, ev * cout_g + nl
        return ((((((gi // e) * d_ + d) * c1 + ci // c0) * h_ + h) * w_ + w) * cout_opt + co) * c0 + ci % c0

    return (ceil(g, e) * d_ * c1 * h_ * w_, cout_opt // 16, 16, c0), off


@pytest.mark.parametrize("shape,groups", [((8, 3, 2, 3, 3), 2), ((48, 1, 2, 3, 3), 48), ((12, 5, 1, 2, 2), 3),
                                          ((64, 4, 3, 1, 1), 16)])
@pytest.mark.parametrize("dtype", [np.float16, np.int8])
def test_grouped_fractal_z_3d_against_oracle(shape, groups, dtype):
    x = random_array(np.random.default_rng(7), shape, dtype)
    storage, off = o_fz3d_groups(shape, F.default_c0(dtype), groups)
    assert F.storage_shape("FRACTAL_Z_3D", shape, dtype, groups=groups) == storage
    got = F.pack(x, "FRACTAL_Z_3D", groups=groups)
    assert_same_bytes(got, oracle_pack_vectorised(x, storage, off))
    assert_same_bytes(F.unpack(got, "FRACTAL_Z_3D", shape, groups=groups), x)
