"""Format algebra: the worked test vectors of ``shared/reference/formats.md`` §7 (TV1–TV9) as exact
assertions, the enumerations of §1, format words, parsing, C0 rules and rank expansion.

Expected numbers below are copied from the reference document, never from the implementation.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from npu_deploy.converters import formats as F
from npu_deploy.errors import FormatError

FP16, BF16, FP32, INT8 = np.float16, ml_dtypes.bfloat16, np.float32, np.int8


def seq(shape, dtype=FP16):
    """Element values 1 + flat logical index (the reference's convention; 0 marks padding)."""
    return (np.arange(int(np.prod(shape))) + 1).reshape(shape).astype(dtype)


def flat_offsets(fmt, shape, dtype, **kw):
    return [F.offset(fmt, shape, idx, dtype, **kw) for idx in np.ndindex(*shape)]


# --------------------------------------------------------------------------------------- TV1
class TestTV1NC1HWC0:
    shape = (1, 3, 2, 2)

    @pytest.mark.parametrize("dtype", [FP16, BF16])
    def test_fp16_bf16(self, dtype):
        assert F.storage_shape("NC1HWC0", self.shape, dtype) == (1, 1, 2, 2, 16)
        assert F.nbytes("NC1HWC0", self.shape, dtype) == 128
        assert flat_offsets("NC1HWC0", self.shape, dtype) == [0, 16, 32, 48, 1, 17, 33, 49, 2, 18, 34, 50]
        y = F.pack(seq(self.shape, dtype), "NC1HWC0")
        assert y.shape == (1, 1, 2, 2, 16)
        assert y.reshape(-1)[:20].astype(np.float32).tolist() == [1, 5, 9] + [0] * 13 + [2, 6, 10, 0]

    def test_examples(self):
        for idx, off in [((0, 0, 0, 0), 0), ((0, 0, 0, 1), 16), ((0, 1, 0, 0), 1), ((0, 2, 1, 1), 50)]:
            assert F.offset("NC1HWC0", self.shape, idx, FP16) == off

    def test_int8(self):
        assert F.storage_shape("NC1HWC0", self.shape, INT8) == (1, 1, 2, 2, 32)
        assert F.nbytes("NC1HWC0", self.shape, INT8) == 128
        assert flat_offsets("NC1HWC0", self.shape, INT8) == [0, 32, 64, 96, 1, 33, 65, 97, 2, 34, 66, 98]

    def test_fp32_default_and_32_byte_rule(self):
        assert F.storage_shape("NC1HWC0", self.shape, FP32) == (1, 1, 2, 2, 16)
        assert F.nbytes("NC1HWC0", self.shape, FP32) == 256
        assert flat_offsets("NC1HWC0", self.shape, FP32) == [0, 16, 32, 48, 1, 17, 33, 49, 2, 18, 34, 50]
        assert F.storage_shape("NC1HWC0", self.shape, FP32, c0=8) == (1, 1, 2, 2, 8)
        assert flat_offsets("NC1HWC0", self.shape, FP32, c0=8) == [0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26]


# --------------------------------------------------------------------------------------- TV2
class TestTV2FractalZ:
    shape = (2, 5, 3, 3)

    def test_shape_and_offsets(self):
        assert F.storage_shape("FRACTAL_Z", self.shape, FP16) == (9, 1, 16, 16)
        assert int(np.prod(F.storage_shape("FRACTAL_Z", self.shape, FP16))) == 2304
        for idx, off in [((0, 0, 0, 0), 0), ((1, 0, 0, 0), 16), ((0, 1, 0, 0), 1), ((0, 0, 0, 1), 256),
                         ((1, 4, 2, 1), 1812), ((1, 4, 2, 2), 2068)]:
            assert F.offset("FRACTAL_Z", self.shape, idx, FP16) == off
        assert flat_offsets("FRACTAL_Z", self.shape, FP16)[:20] == [
            0, 256, 512, 768, 1024, 1280, 1536, 1792, 2048, 1, 257, 513, 769, 1025, 1281, 1537, 1793, 2049,
            2, 258]

    def test_values(self):
        y = F.pack(seq(self.shape), "FRACTAL_Z").reshape(-1)
        assert y[0:6].tolist() == [1, 10, 19, 28, 37, 0]
        assert y[16:21].tolist() == [46, 55, 64, 73, 82]

    def test_int8(self):
        assert F.storage_shape("FRACTAL_Z", self.shape, INT8) == (9, 1, 16, 32)
        assert F.offset("FRACTAL_Z", self.shape, (1, 4, 2, 1), INT8) == 3620


# --------------------------------------------------------------------------------------- TV3 / TV4
class TestTV3FractalNZ:
    shape = (20, 35)

    def test_fp16(self):
        assert F.storage_shape("FRACTAL_NZ", self.shape, FP16) == (3, 2, 16, 16)
        for idx, off in [((0, 0), 0), ((0, 1), 1), ((1, 0), 16), ((0, 15), 15), ((0, 16), 512),
                         ((15, 0), 240), ((16, 0), 256), ((19, 34), 1330)]:
            assert F.offset("FRACTAL_NZ", self.shape, idx, FP16) == off
        row0 = [F.offset("FRACTAL_NZ", self.shape, (0, j), FP16) for j in range(35)]
        assert row0 == list(range(16)) + list(range(512, 528)) + [1024, 1025, 1026]
        col0 = [F.offset("FRACTAL_NZ", self.shape, (i, 0), FP16) for i in range(20)]
        assert col0 == list(range(0, 256, 16)) + [256, 272, 288, 304]
        y = F.pack(seq(self.shape), "FRACTAL_NZ").reshape(-1)
        assert y.size == 1536
        assert y[16:18].tolist() == [36, 37]
        assert y[256:258].tolist() == [561, 562]
        assert y[512:514].tolist() == [17, 18]
        assert y[320] == 0

    def test_int8(self):
        assert F.storage_shape("FRACTAL_NZ", self.shape, INT8) == (2, 2, 16, 32)
        for idx, off in [((0, 16), 16), ((0, 32), 1024), ((1, 0), 32), ((16, 0), 512), ((19, 34), 1634)]:
            assert F.offset("FRACTAL_NZ", self.shape, idx, INT8) == off

    def test_fp32(self):
        assert F.storage_shape("FRACTAL_NZ", self.shape, FP32, c0=8) == (5, 2, 16, 8)
        for idx, off in [((0, 15), 263), ((0, 16), 512), ((16, 0), 128), ((19, 34), 1178)]:
            assert F.offset("FRACTAL_NZ", self.shape, idx, FP32, c0=8) == off
        assert F.storage_shape("FRACTAL_NZ", self.shape, FP32) == (3, 2, 16, 16)
        assert flat_offsets("FRACTAL_NZ", self.shape, FP32) == flat_offsets("FRACTAL_NZ", self.shape, FP16)


def test_tv4_batched_nz():
    shape = (2, 17, 33)
    assert F.storage_shape("FRACTAL_NZ", shape, FP16) == (2, 3, 2, 16, 16)
    for idx, off in [((0, 0, 0), 0), ((0, 0, 15), 15), ((0, 0, 16), 512), ((0, 15, 0), 240),
                     ((0, 16, 0), 256), ((0, 16, 1), 257), ((0, 0, 32), 1024), ((0, 16, 32), 1280),
                     ((1, 0, 0), 1536), ((1, 16, 32), 2816)]:
        assert F.offset("FRACTAL_NZ", shape, idx, FP16) == off


# --------------------------------------------------------------------------------------- TV5
def test_tv5_fc_weight_fractal_z():
    b = seq((20, 35))
    assert F.storage_shape("FRACTAL_Z", (20, 35), FP16) == (2, 3, 16, 16)
    assert F.offset("FRACTAL_Z", (20, 35), (17, 3), FP16) == 817
    assert F.offset("FRACTAL_Z", (20, 35), (0, 16), FP16) == 256
    # byte-identical to NZ of the transpose
    assert F.pack(b, "FRACTAL_Z").tobytes() == F.pack(np.ascontiguousarray(b.T), "FRACTAL_NZ").tobytes()


# --------------------------------------------------------------------------------------- TV6
class TestTV6GroupedFractalZ:
    def test_small(self):
        shape = (1, 1, 2, 4)  # HWCN: Cin_g = 2, Cout = 4
        assert F.encode_format_word("FRACTAL_Z", groups=2) == 516
        assert F.storage_shape("FRACTAL_Z", shape, FP16, groups=2, origin="HWCN") == (1, 1, 16, 16)
        for idx, off in [((0, 0, 0, 0), 0), ((0, 0, 1, 1), 17), ((0, 0, 0, 2), 34), ((0, 0, 1, 3), 51)]:
            assert F.offset("FRACTAL_Z", shape, idx, FP16, groups=2, origin="HWCN") == off
        y = F.pack(seq(shape), "FRACTAL_Z", groups=2, origin="HWCN").reshape(-1)
        # group 0 -> (co 0..1, ci 0..1), group 1 -> (co 2..3, ci 2..3); everything else zero
        x = seq(shape)
        expect = np.zeros(256, FP16)
        for c in range(2):
            for n in range(4):
                g, nl = divmod(n, 2)
                expect[(g * 2 + nl) * 16 + g * 2 + c] = x[0, 0, c, n]
        assert y.tolist() == expect.tolist()

    def test_depthwise_like(self):
        assert F.storage_shape("FRACTAL_Z", (3, 3, 3, 48), FP16, groups=16, origin="HWCN") == (27, 3, 16, 16)

    @pytest.mark.parametrize("fmt,shape", [("FRACTAL_Z", (20, 7, 3, 3)), ("FRACTAL_Z_3D", (17, 5, 2, 3, 1))])
    def test_groups_one_reduces_to_plain(self, fmt, shape):
        x = seq(shape)
        plan = F._make_plan(F.FORMATS[fmt], shape, np.dtype(FP16), None, 1, None, grouped=True)
        assert plan.layout is F.FORMATS[fmt].grouped[plan.layout.letters and ("4d" if len(shape) == 4 else "5d")]
        assert plan.storage == F.storage_shape(fmt, shape, FP16)
        out = np.empty(plan.storage, FP16)
        F._pack_derived(x, plan, out)
        assert out.tobytes() == F.pack(x, fmt).tobytes()


# --------------------------------------------------------------------------------------- TV7
def test_tv7_fractal_z_c04_and_nc1hwc0_c04():
    w = seq((2, 3, 2, 2))
    assert F.storage_shape("FRACTAL_Z_C04", w.shape, FP16) == (1, 1, 16, 16)
    y = F.pack(w, "FRACTAL_Z_C04").reshape(-1)
    assert y[0:8].tolist() == [1, 5, 9, 0, 2, 6, 10, 0]
    assert y[16:20].tolist() == [13, 17, 21, 0]
    assert F.offset("FRACTAL_Z_C04", w.shape, (1, 2, 1, 0), FP16) == 26
    a = seq((1, 3, 2, 2))
    assert F.storage_shape("NC1HWC0_C04", a.shape, FP16) == (1, 1, 2, 2, 4)
    assert F.pack(a, "NC1HWC0_C04").reshape(-1).tolist() == [1, 5, 9, 0, 2, 6, 10, 0, 3, 7, 11, 0, 4, 8, 12, 0]


# --------------------------------------------------------------------------------------- TV8
def test_tv8_c1hwncoc0():
    x = seq((1, 1, 3, 2))  # HWCN
    assert F.storage_shape("C1HWNCoC0", x.shape, FP16, origin="HWCN") == (1, 1, 1, 2, 16, 16)
    y = F.pack(x, "C1HWNCoC0", origin="HWCN").reshape(-1)
    nz = np.flatnonzero(y)
    assert nz.tolist() == [0, 17, 34, 256, 273, 290]
    assert y[nz].tolist() == [1, 3, 5, 2, 4, 6]


# --------------------------------------------------------------------------------------- TV9
def test_tv9_3d_formats():
    assert F.storage_shape("NDC1HWC0", (1, 3, 2, 2, 2), FP16) == (1, 2, 1, 2, 2, 16)
    assert F.offset("NDC1HWC0", (1, 3, 2, 2, 2), (0, 2, 1, 0, 1), FP16) == 82
    assert F.storage_shape("FRACTAL_Z_3D", (2, 5, 2, 1, 1), FP16) == (2, 1, 16, 16)
    assert F.offset("FRACTAL_Z_3D", (2, 5, 2, 1, 1), (1, 4, 1, 0, 0), FP16) == 276


# --------------------------------------------------------------------------------------- enums
def test_acl_format_enum_values():
    expect = {"NCHW": 0, "NHWC": 1, "ND": 2, "NC1HWC0": 3, "FRACTAL_Z": 4, "NC1HWC0_C04": 12, "HWCN": 16,
              "NDHWC": 27, "FRACTAL_NZ": 29, "NCDHW": 30, "NDC1HWC0": 32, "FRACTAL_Z_3D": 33, "NC": 35,
              "NCL": 47, "FRACTAL_NZ_C0_16": 50, "FRACTAL_NZ_C0_32": 51, "FRACTAL_NZ_C0_2": 52,
              "FRACTAL_NZ_C0_4": 53, "FRACTAL_NZ_C0_8": 54}
    assert F.ACL_FORMATS == expect
    assert F.ACL_FORMAT_UNDEFINED == -1
    for name, value in expect.items():
        assert F.FORMATS[name].acl == value == F.FORMATS[name].ge


def test_ge_only_formats_decode():
    for name, ge in [("FRACTAL_Z_C04", 13), ("C1HWNCoC0", 25), ("FRACTAL_ZN_LSTM", 38), ("FRACTAL_ZN_RNN", 44),
                     ("CHWN", 14), ("FRACTAL_Z_3D_TRANSPOSE", 37), ("NYUV_A", 46), ("C1HWC0", 49)]:
        f = F.get_format(ge)
        assert f.name == name and f.ge == ge and f.acl is None


def test_acl_dtype_enum_values_and_sizes():
    table = [("FLOAT", 0, 32), ("FLOAT16", 1, 16), ("INT8", 2, 8), ("INT32", 3, 32), ("UINT8", 4, 8),
             ("INT16", 6, 16), ("UINT16", 7, 16), ("UINT32", 8, 32), ("INT64", 9, 64), ("UINT64", 10, 64),
             ("DOUBLE", 11, 64), ("BOOL", 12, 8), ("COMPLEX64", 16, 64), ("COMPLEX128", 17, 128),
             ("BF16", 27, 16), ("INT4", 29, 4), ("UINT1", 30, 1), ("COMPLEX32", 33, 32), ("HIFLOAT8", 34, 8),
             ("FLOAT8_E5M2", 35, 8), ("FLOAT8_E4M3FN", 36, 8), ("FLOAT8_E8M0", 37, 8), ("FLOAT6_E3M2", 38, 6),
             ("FLOAT6_E2M3", 39, 6), ("FLOAT4_E2M1", 40, 4), ("FLOAT4_E1M2", 41, 4)]
    for name, value, bits in table:
        assert F.ACL_DTYPES[name] == value
        assert F.dtype_bits(value) == bits
    assert F.ACL_DTYPES["STRING"] == 13 and 5 not in F.ACL_DTYPES.values()
    assert F.GE_DTYPES["UNDEFINED"] == 28 and F.GE_DTYPES["QINT8"] == 18 and F.GE_DTYPES["HIFLOAT4"] == 42


@pytest.mark.parametrize("dtype,value", [
    (np.float32, 0), (np.float16, 1), (np.int8, 2), (np.int32, 3), (np.uint8, 4), (np.int16, 6),
    (np.uint16, 7), (np.uint32, 8), (np.int64, 9), (np.uint64, 10), (np.float64, 11), (np.bool_, 12),
    (np.complex64, 16), (np.complex128, 17), (ml_dtypes.bfloat16, 27), (ml_dtypes.float8_e5m2, 35),
    (ml_dtypes.float8_e4m3fn, 36)])
def test_dtype_acl_round_trip(dtype, value):
    assert F.dtype_to_acl(np.dtype(dtype)) == value
    assert F.acl_to_dtype(value) == np.dtype(dtype)
    assert F.itemsize(value) == np.dtype(dtype).itemsize


def test_acl_to_dtype_refuses_packed_and_unknown():
    with pytest.raises(FormatError, match="4-bit"):
        F.acl_to_dtype(29)
    with pytest.raises(FormatError, match="unknown aclDataType 5"):
        F.acl_to_dtype(5)
    with pytest.raises(FormatError):
        F.itemsize(29)


# --------------------------------------------------------------------------------------- format words
def test_format_word_examples():
    assert F.encode_format_word("FRACTAL_Z", groups=2) == 516
    assert F.encode_format_word("FRACTAL_NZ", c0=8) == 67108893
    assert F.encode_format_word("NC1HWC0", c0=16) == 83886083
    w = F.decode_format_word(67108893)
    assert (w.format.name, w.sub_format, w.c0) == ("FRACTAL_NZ", 0, 8)
    w = F.decode_format_word(516)
    assert (w.format.name, w.sub_format, w.groups, w.c0) == ("FRACTAL_Z", 2, 2, None)
    w = F.decode_format_word(83886083)
    assert (w.format.name, w.c0) == ("NC1HWC0", 16)


def test_format_word_round_trip_all():
    for name, f in F.FORMATS.items():
        for groups in (0, 1, 7, 0xFFFF):
            for c0 in (None, 1, 4, 8, 16, 32, 256):
                word = F.encode_format_word(name, groups, c0)
                w = F.decode_format_word(word)
                assert (w.format.name, w.sub_format, w.c0) == (name, groups, c0)
                assert word & 0xFF == f.ge and (word >> 8) & 0xFFFF == groups


@pytest.mark.parametrize("text,name,sub", [
    ("FORMAT_ND", "ND", 0), ("ND", "ND", 0), ("NC1HWC0:1", "NC1HWC0", 1), ("FORMAT_NC1HWC0:1", "NC1HWC0", 1),
    ("ACL_FORMAT_NCHW", "NCHW", 0), ("ACL_FRACTAL_Z_3D", "FRACTAL_Z_3D", 0), ("fractal_nz", "FRACTAL_NZ", 0),
    (" FRACTAL_Z:2 ", "FRACTAL_Z", 2), ("C1HWNCoC0", "C1HWNCoC0", 0), ("29", "FRACTAL_NZ", 0), (3, "NC1HWC0", 0),
    (516, "FRACTAL_Z", 2), ("FORMAT_FRACTAL_ZN_LSTM", "FRACTAL_ZN_LSTM", 0)])
def test_parse_format(text, name, sub):
    w = F.parse_format(text)
    assert (w.format.name, w.sub_format) == (name, sub)
    assert F.get_format(text).name == name


@pytest.mark.parametrize("bad", ["NCHW5", "FORMAT_", "", "NC1HWC0:x", -1, 0xFE, 1 << 30, 3.0, None, "ND:99999999"])
def test_parse_format_rejects(bad):
    with pytest.raises(FormatError) as e:
        F.parse_format(bad)
    assert "\n" not in str(e.value)


def test_unknown_format_lists_known():
    with pytest.raises(FormatError) as e:
        F.get_format("NC1HWC1")
    assert "NC1HWC0" in str(e.value) and "FRACTAL_NZ" in str(e.value)


def test_decode_only_format_says_so():
    with pytest.raises(FormatError, match="decoding only"):
        F.storage_shape("FRACTAL_ZN_LSTM", (32, 64), FP16)
    with pytest.raises(FormatError, match="decoding only"):
        F.pack(np.zeros((2, 2), FP16), "NYUV")
    with pytest.raises(FormatError, match="decoding only"):
        F.unpack(np.zeros((2, 2), FP16), "FRACTAL_ZN_RNN", (2, 2))


# --------------------------------------------------------------------------------------- C0 rules
@pytest.mark.parametrize("dtype,c0", [
    (np.float16, 16), (ml_dtypes.bfloat16, 16), (np.float32, 16), (np.int32, 16), (np.uint32, 16),
    (np.int16, 16), (np.uint16, 16), (np.int8, 32), (np.uint8, 32), (np.bool_, 32),
    (ml_dtypes.float8_e4m3fn, 32), (np.int64, 16)])
def test_default_c0(dtype, c0):
    assert F.default_c0(dtype) == c0


def test_c0_override_fixed_and_invalid():
    assert F.storage_shape("NC1HWC0", (1, 20, 2, 2), FP32, c0=8) == (1, 3, 2, 2, 8)
    assert F.resolve_c0("NC1HWC0_C04", FP16) == 4
    assert F.resolve_c0("FRACTAL_NZ_C0_32", FP16) == 32
    assert F.storage_shape("FRACTAL_NZ_C0_8", (20, 35), FP16) == (5, 2, 16, 8)
    with pytest.raises(FormatError, match="fixed C0"):
        F.storage_shape("NC1HWC0_C04", (1, 3, 2, 2), FP16, c0=16)
    for bad in (0, 3, 12, 512, -16):
        with pytest.raises(FormatError, match="power of two"):
            F.storage_shape("NC1HWC0", (1, 3, 2, 2), FP16, c0=bad)


def test_unpack_reads_c0_from_storage_shape():
    x = seq((1, 20, 3, 2), FP32)
    y8 = F.pack(x, "NC1HWC0", c0=8)
    assert y8.shape == (1, 3, 3, 2, 8)
    assert np.array_equal(F.unpack(y8, "NC1HWC0", x.shape), x)       # no c0 given: read, not guessed
    with pytest.raises(FormatError, match="C0 = 16 was given"):
        F.unpack(y8, "NC1HWC0", x.shape, c0=16)
    m = seq((20, 35), FP32)
    assert np.array_equal(F.unpack(F.pack(m, "FRACTAL_NZ", c0=8), "FRACTAL_NZ", m.shape), m)
    # a flat buffer (a raw dump) needs the C0 it was written with
    flat = F.pack(m, "FRACTAL_NZ", c0=8).reshape(-1)
    assert np.array_equal(F.unpack(flat, "FRACTAL_NZ", m.shape, c0=8), m)
    with pytest.raises(FormatError, match="storage"):
        F.unpack(flat, "FRACTAL_NZ", m.shape)


# --------------------------------------------------------------------------------------- rank < 4
@pytest.mark.parametrize("origin,shape,as4d", [
    ("NCHW", (5,), (1, 5, 1, 1)), ("NCHW", (5, 3), (1, 5, 3, 1)), ("NCHW", (5, 3, 2), (1, 5, 3, 2)),
    ("NHWC", (5,), (1, 1, 1, 5)), ("NHWC", (3, 2), (1, 3, 2, 1)), ("NHWC", (3, 2, 5), (1, 3, 2, 5)),
    ("HWCN", (5,), (1, 1, 5, 1)), ("HWCN", (5, 4), (1, 1, 5, 4)), ("HWCN", (2, 5, 4), (1, 2, 5, 4))])
@pytest.mark.parametrize("fmt", ["NC1HWC0", "FRACTAL_Z", "C1HWNCoC0"])
def test_rank_expansion(origin, shape, as4d, fmt):
    x = seq(shape)
    x4 = x.reshape(as4d)
    if fmt == "FRACTAL_Z" and len(shape) <= 2 and origin == "NCHW":
        pass  # with an explicit NCHW origin a 1-/2-D weight is still expanded like a conv weight
    got = F.pack(x, fmt, origin=origin)
    assert got.tobytes() == F.pack(x4, fmt, origin=origin).tobytes()
    assert F.storage_shape(fmt, shape, FP16, origin=origin) == got.shape
    assert np.array_equal(F.unpack(got, fmt, shape, origin=origin), x)
    for idx in np.ndindex(*shape):
        full = np.unravel_index(np.ravel_multi_index(idx, shape), as4d)
        assert F.offset(fmt, shape, idx, FP16, origin=origin) == F.offset(fmt, as4d, full, FP16, origin=origin)


def test_fractal_z_2d_default_is_fc_weight_and_nz_1d_is_a_row():
    assert F.storage_shape("FRACTAL_Z", (20, 35), FP16) == (2, 3, 16, 16)       # [K, N], not [1,C,H,1]
    # as a conv weight [1, 20, 35, 1]: C1·H·W = 2·35·1
    assert F.storage_shape("FRACTAL_Z", (20, 35), FP16, origin="NCHW") == (70, 1, 16, 16)
    assert F.storage_shape("FRACTAL_NZ", (40,), FP16) == (3, 1, 16, 16)        # GE: [1, n]
    v = seq((40,))
    assert np.array_equal(F.pack(v, "FRACTAL_NZ"), F.pack(v.reshape(1, 40), "FRACTAL_NZ"))
    assert F.offset("FRACTAL_NZ", (40,), (17,), FP16) == F.offset("FRACTAL_NZ", (1, 40), (0, 17), FP16)


def test_plain_formats_transpose_from_nchw():
    x = seq((2, 3, 4, 5))
    assert np.array_equal(F.pack(x, "NHWC"), x.transpose(0, 2, 3, 1))
    assert np.array_equal(F.pack(x, "HWCN"), x.transpose(2, 3, 1, 0))
    assert np.array_equal(F.pack(x, "CHWN"), x.transpose(1, 2, 3, 0))
    assert np.array_equal(F.pack(x, "NHWC", origin="NHWC"), x)
    x5 = seq((2, 3, 4, 5, 6))
    assert np.array_equal(F.pack(x5, "NDHWC"), x5.transpose(0, 2, 3, 4, 1))
    assert np.array_equal(F.pack(x5, "DHWCN"), x5.transpose(2, 3, 4, 1, 0))
    assert np.array_equal(F.unpack(x5.transpose(2, 3, 4, 1, 0).copy(), "DHWCN", x5.shape), x5)
    assert F.padding_overhead("NHWC", x.shape, FP16) == 0.0


def test_transdata_through_logical():
    x = seq((2, 20, 3, 5))
    nhwc = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    y = F.transdata(nhwc, "NHWC", "NC1HWC0", nhwc.shape)
    assert np.array_equal(y, F.pack(x, "NC1HWC0"))
    assert np.array_equal(F.transdata(y, "NC1HWC0", "NHWC", nhwc.shape), nhwc)
    assert np.array_equal(F.transdata(y, "NC1HWC0", "NCHW", x.shape), x)


def test_sizes_and_overhead():
    assert F.nbytes("NC1HWC0", (1, 3, 224, 224), FP16) == 224 * 224 * 16 * 2
    assert F.padding_overhead("NC1HWC0", (1, 3, 224, 224), FP16) == pytest.approx(16 / 3 - 1)
    assert F.padding_overhead("FRACTAL_NZ", (32, 32), FP16) == 0.0
    assert F.nbytes("FRACTAL_NZ", (20, 35), INT8) == 2048


def test_bad_inputs():
    with pytest.raises(FormatError, match="rank"):
        F.storage_shape("NC1HWC0", (1, 2, 3, 4, 5), FP16)
    with pytest.raises(FormatError, match="dynamic"):
        F.storage_shape("NC1HWC0", (-1, 3, 4, 4), FP16)
    with pytest.raises(FormatError, match="does not support dtype float64"):
        F.pack(np.zeros((1, 1, 2, 2)), "C1HWNCoC0")
    with pytest.raises(FormatError, match="not a numeric"):
        F.pack(np.array([["a"]]), "ND")
    with pytest.raises(FormatError, match="sub-byte"):
        F.pack(np.zeros((4, 4), ml_dtypes.int4), "FRACTAL_NZ")
    with pytest.raises(FormatError, match="C <= 4"):
        F.pack(np.zeros((1, 5, 2, 2), FP16), "FRACTAL_Z_C04")
    with pytest.raises(FormatError, match="multiple of the groups"):
        F.storage_shape("FRACTAL_Z", (6, 2, 3, 3), FP16, groups=4)
    with pytest.raises(FormatError, match="storage array has shape"):
        F.unpack(np.zeros((1, 1, 2, 2, 16), FP16), "NC1HWC0", (1, 3, 2, 3))
    with pytest.raises(FormatError, match="outside"):
        F.offset("NC1HWC0", (1, 3, 2, 2), (0, 3, 0, 0), FP16)
    with pytest.raises(FormatError, match="out="):
        F.pack(np.zeros((1, 3, 2, 2), FP16), "NC1HWC0", out=np.zeros((1, 1, 2, 2, 16), FP32))


def test_pack_into_out_zeroes_stale_padding():
    x = seq((2, 19, 3, 3))
    out = np.full(F.storage_shape("NC1HWC0", x.shape, FP16), 7, FP16)
    y = F.pack(x, "NC1HWC0", out=out)
    assert y is out
    assert np.array_equal(out, F.pack(x, "NC1HWC0"))
    assert out[:, 1, :, :, 3:].max() == 0


def test_every_packable_format_has_one_entry_and_describes_itself():
    packable = [f for f in F.FORMATS.values() if f.packable]
    names = {f.name for f in packable}
    for want in ["ND", "NCHW", "NHWC", "HWCN", "NDHWC", "NCDHW", "NC1HWC0", "NC1HWC0_C04", "NDC1HWC0",
                 "FRACTAL_Z", "FRACTAL_Z_C04", "FRACTAL_Z_3D", "FRACTAL_NZ", "C1HWNCoC0"]:
        assert want in names
    for f in packable:
        assert f.name in f.describe() and "->" in f.describe()


def test_docstring_examples_run():
    """The examples in the module's docstrings are executed, so they cannot rot."""
    import doctest

    from npu_deploy.converters.formats import _fastcopy

    for mod in (F, _fastcopy):
        result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0 and result.attempted > 0, mod.__name__
