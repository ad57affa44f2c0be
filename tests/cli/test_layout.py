"""``npu-deploy layout`` through the real entry point (``run_cli``).

Expected arrays come from an independent oracle (pad + reshape + transpose written from the reference
formulas), never from the code under test.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from npu_deploy.converters import formats as F


def nc1hwc0_oracle(x, c0):
    n, c, h, w = x.shape
    c1 = -(-c // c0)
    padded = np.zeros((n, c1 * c0, h, w), x.dtype)
    padded[:, :c] = x
    return padded.reshape(n, c1, c0, h, w).transpose(0, 1, 3, 4, 2).copy()


def nz_oracle(x, c0):
    m, n = x.shape
    m1, n1 = -(-m // 16), -(-n // c0)
    padded = np.zeros((m1 * 16, n1 * c0), x.dtype)
    padded[:m, :n] = x
    return padded.reshape(m1, 16, n1, c0).transpose(2, 0, 1, 3).copy()


def one_line_error(code, out, err, expect_code=2):
    assert code == expect_code, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("npu-deploy: error:"), err
    assert "Traceback" not in err
    return lines[0]


def no_leftovers(folder, out):
    assert not out.exists()
    assert not [p for p in folder.iterdir() if p.name.startswith(f".{out.name}.")]


# --------------------------------------------------------------------------------------- info
def test_info_quickstart(run_cli):
    code, out, err = run_cli("layout", "info", "NC1HWC0", "--shape", "1,3,224,224", "--dtype", "float16")
    assert code == 0, err
    assert "[1, 1, 224, 224, 16]" in out
    assert "aclFormat 3" in out
    assert f"{224 * 224 * 16 * 2:,}" in out                   # storage bytes
    assert "+433.3 %" in out                                   # 16/3 - 1
    assert out.strip().splitlines()[-1].startswith("NC1HWC0 [1, 3, 224, 224] float16 -> storage")


@pytest.mark.parametrize("fmt,shape,dtype,extra,storage,acl", [
    ("FRACTAL_NZ", "20,35", "float16", [], [3, 2, 16, 16], 29),
    ("FRACTAL_NZ", "20,35", "float32", ["--c0", "8"], [5, 2, 16, 8], 29),
    ("FRACTAL_Z", "2,5,3,3", "int8", [], [9, 1, 16, 32], 4),
    ("FRACTAL_Z", "1,1,2,4", "float16", ["--groups", "2", "--origin", "HWCN"], [1, 1, 16, 16], 4),
    ("NDC1HWC0", "1,3,2,2,2", "float16", [], [1, 2, 1, 2, 2, 16], 32),
    ("C1HWNCoC0", "1,1,3,2", "float16", ["--origin", "HWCN"], [1, 1, 1, 2, 16, 16], None),
])
def test_info_json(run_cli, fmt, shape, dtype, extra, storage, acl):
    code, out, err = run_cli("layout", "info", fmt, "--shape", shape, "--dtype", dtype, *extra, "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["schema"] == "npu-deploy/layout-info"
    assert d["storage_shape"] == storage
    assert d["acl_format"] == acl
    assert d["nbytes"] == int(np.prod(storage)) * np.dtype(dtype).itemsize
    assert F.LayoutInfo.load(d).storage_shape == storage
    if "--groups" in extra:
        assert d["format_word"] == 516


def test_info_without_shape_describes_the_format(run_cli):
    code, out, err = run_cli("layout", "info", "FORMAT_FRACTAL_NZ", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert (d["format"], d["acl_format"], d["packable"]) == ("FRACTAL_NZ", 29, True)
    code, out, err = run_cli("layout", "info", "NC1HWC0:1")
    assert code == 0 and "NC1HWC0 (ge 3, acl 3)" in out


@pytest.mark.parametrize("args,needle", [
    (["NC1HWC1", "--shape", "1,3,4,4"], "unknown format 'NC1HWC1'"),
    (["NC1HWC0", "--shape", "1,3,4,4,4,4"], "rank"),
    (["NC1HWC0", "--shape", "1,x,4,4"], "--shape"),
    (["NC1HWC0", "--shape", "1,3,4,4", "--dtype", "float128x"], "unknown dtype"),
    (["NC1HWC0", "--shape", "1,3,4,4", "--c0", "12"], "power of two"),
    (["C1HWNCoC0", "--shape", "1,3,4,4", "--dtype", "int32"], "does not support dtype int32"),
    (["FRACTAL_ZN_LSTM", "--shape", "32,64"], "decoding only"),
    (["NC1HWC0", "--shape", "1,-1,4,4"], "concrete"),
])
def test_info_bad_input(run_cli, args, needle):
    line = one_line_error(*run_cli("layout", "info", *args))
    assert needle in line


# --------------------------------------------------------------------------------------- convert
def test_convert_npy_nchw_to_nc1hwc0_and_back(run_cli, tmp_path):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 19, 5, 7)).astype(np.float16)
    src, dev, back = tmp_path / "x.npy", tmp_path / "x_5hd.npy", tmp_path / "back.npy"
    np.save(src, x)
    code, out, err = run_cli("layout", "convert", src, dev, "--from", "NCHW", "--to", "NC1HWC0")
    assert code == 0, err
    got = np.load(dev, allow_pickle=False)
    assert got.shape == (2, 2, 5, 7, 16)                      # the storage shape, 5-D
    assert got.tobytes() == nc1hwc0_oracle(x, 16).tobytes()
    code, out, err = run_cli("layout", "convert", dev, back, "--from", "NC1HWC0", "--to", "NCHW",
                             "--shape", "2,19,5,7")
    assert code == 0, err
    assert np.array_equal(np.load(back), x)


def test_convert_nhwc_input_uses_its_own_shape(run_cli, tmp_path):
    x = np.arange(2 * 5 * 7 * 19, dtype=np.float32).reshape(2, 5, 7, 19)      # NHWC
    src, dev = tmp_path / "x.npy", tmp_path / "y.npy"
    np.save(src, x)
    code, _, err = run_cli("layout", "convert", src, dev, "--from", "NHWC", "--to", "NC1HWC0", "--c0", "8")
    assert code == 0, err
    assert np.load(dev).tobytes() == nc1hwc0_oracle(x.transpose(0, 3, 1, 2), 8).tobytes()


def test_convert_nd_matrix_to_fractal_z_agrees_with_info(run_cli, tmp_path):
    """A 2-D ND matrix goes to FRACTAL_Z's 2-D (K, N) form (reference TV5: K=20, N=35 -> [2, 3, 16, 16]),
    the storage shape `layout info` reports, not a conv weight [1, 20, 35, 1] -> [70, 1, 16, 16]."""
    b = np.arange(20 * 35, dtype=np.float16).reshape(20, 35)
    np.save(tmp_path / "b.npy", b)
    code, out, err = run_cli("layout", "info", "FRACTAL_Z", "--shape", "20,35", "--json")
    assert code == 0, err
    want = json.loads(out)["storage_shape"]
    code, out, err = run_cli("layout", "convert", tmp_path / "b.npy", tmp_path / "fz.npy", "--from", "ND",
                             "--to", "FRACTAL_Z")
    assert code == 0, err
    fz = np.load(tmp_path / "fz.npy")
    assert list(fz.shape) == want == [2, 3, 16, 16]
    np.testing.assert_array_equal(fz, F.pack(b, "FRACTAL_Z", origin="ND"))
    code, out, err = run_cli("layout", "convert", tmp_path / "fz.npy", tmp_path / "back.npy", "--from",
                             "FRACTAL_Z", "--to", "ND", "--shape", "20,35")
    assert code == 0, err
    np.testing.assert_array_equal(np.load(tmp_path / "back.npy"), b)


def test_convert_raw_bin_dump_to_npy(run_cli, tmp_path):
    rng = np.random.default_rng(1)
    x = rng.integers(-128, 127, size=(40, 70), dtype=np.int8)
    dump = tmp_path / "dump.bin"
    nz_oracle(x, 32).tofile(dump)                               # what an int8 NZ tensor holds on device
    out = tmp_path / "x.npy"
    code, _, err = run_cli("layout", "convert", dump, out, "--from", "FRACTAL_NZ", "--to", "ND",
                           "--shape", "40,70", "--dtype", "int8")
    assert code == 0, err
    assert np.array_equal(np.load(out), x)


def test_convert_to_raw_bin_and_fp32_c0_8_dump(run_cli, tmp_path):
    x = np.random.default_rng(2).standard_normal((20, 35)).astype(np.float32)
    src, dump, back = tmp_path / "x.npy", tmp_path / "nz.bin", tmp_path / "back.npy"
    np.save(src, x)
    code, _, err = run_cli("layout", "convert", src, dump, "--from", "ND", "--to", "FRACTAL_NZ", "--c0", "8")
    assert code == 0, err
    assert dump.read_bytes() == nz_oracle(x, 8).tobytes()
    code, _, err = run_cli("layout", "convert", dump, back, "--from", "FRACTAL_NZ", "--to", "ND",
                           "--shape", "20,35", "--dtype", "float32", "--c0", "8")
    assert code == 0, err
    assert np.array_equal(np.load(back), x)


def test_convert_bf16_npy(run_cli, tmp_path):
    import ml_dtypes

    x = np.random.default_rng(3).standard_normal((1, 3, 4, 4)).astype(ml_dtypes.bfloat16)
    dump = tmp_path / "x.bin"
    x.tofile(dump)
    out = tmp_path / "y.npy"
    code, _, err = run_cli("layout", "convert", dump, out, "--from", "NCHW", "--to", "NC1HWC0",
                           "--shape", "1,3,4,4", "--dtype", "bf16")
    assert code == 0, err
    got = np.load(out, allow_pickle=False)
    assert got.view(np.uint16).tobytes() == nc1hwc0_oracle(x.view(np.uint16), 16).tobytes()


class TestConvertBadInput:
    """Every bad input: exit 2, one line on stderr, no OUT (and no temporary file) left behind."""

    @pytest.fixture
    def x_npy(self, tmp_path):
        p = tmp_path / "x.npy"
        np.save(p, np.ones((1, 3, 4, 4), np.float16))
        return p

    def run(self, run_cli, tmp_path, *args, needle, out_name="out.npy"):
        out = tmp_path / out_name
        code, stdout, err = run_cli("layout", "convert", *[str(a).replace("OUT", str(out)) for a in args])
        line = one_line_error(code, stdout, err)
        assert needle in line, line
        no_leftovers(tmp_path, out)
        return line

    def test_unknown_format(self, run_cli, tmp_path, x_npy):
        line = self.run(run_cli, tmp_path, x_npy, "OUT", "--from", "NCHW", "--to", "NC1HWC1", needle="unknown format")
        assert "FRACTAL_NZ" in line                                       # lists the known formats

    def test_shape_of_wrong_rank(self, run_cli, tmp_path, x_npy):
        self.run(run_cli, tmp_path, x_npy, "OUT", "--from", "NCHW", "--to", "NC1HWC0", "--shape", "1,3,4,4,1",
                 needle="rank")

    def test_bin_size_mismatch(self, run_cli, tmp_path):
        dump = tmp_path / "d.bin"
        dump.write_bytes(b"\0" * 1000)
        line = self.run(run_cli, tmp_path, dump, "OUT", "--from", "NC1HWC0", "--to", "NCHW",
                        "--shape", "1,3,4,4", "--dtype", "float16", needle="1,000 bytes")
        assert "512" in line                                              # 1·1·4·4·16 · 2 bytes

    def test_npy_storage_shape_mismatch(self, run_cli, tmp_path):
        p = tmp_path / "d.npy"
        np.save(p, np.zeros((1, 1, 4, 4, 16), np.float16))
        self.run(run_cli, tmp_path, p, "OUT", "--from", "NC1HWC0", "--to", "NCHW", "--shape", "1,3,4,5",
                 needle="storage")

    def test_dtype_not_supported_by_format(self, run_cli, tmp_path):
        p = tmp_path / "w.npy"
        np.save(p, np.zeros((1, 1, 3, 2), np.int64))
        self.run(run_cli, tmp_path, p, "OUT", "--from", "HWCN", "--to", "C1HWNCoC0", needle="does not support dtype")

    def test_non_numeric_dtype(self, run_cli, tmp_path):
        p = tmp_path / "s.npy"
        np.save(p, np.array([["a", "b"]]))
        self.run(run_cli, tmp_path, p, "OUT", "--from", "ND", "--to", "FRACTAL_NZ", needle="not a numeric")

    def test_dtype_mismatch_with_npy(self, run_cli, tmp_path, x_npy):
        self.run(run_cli, tmp_path, x_npy, "OUT", "--from", "NCHW", "--to", "NC1HWC0", "--dtype", "float32",
                 needle="holds float16")

    def test_missing_file(self, run_cli, tmp_path):
        self.run(run_cli, tmp_path, tmp_path / "nope.npy", "OUT", "--from", "NCHW", "--to", "NC1HWC0",
                 needle="cannot read")

    def test_corrupt_npy(self, run_cli, tmp_path):
        p = tmp_path / "bad.npy"
        p.write_bytes(b"\x93NUMPY\x01\x00garbage")
        self.run(run_cli, tmp_path, p, "OUT", "--from", "NCHW", "--to", "NC1HWC0", needle="cannot read")

    def test_not_npy_named_npy(self, run_cli, tmp_path):
        p = tmp_path / "bad.npy"
        p.write_bytes(b"hello world")
        self.run(run_cli, tmp_path, p, "OUT", "--from", "NCHW", "--to", "NC1HWC0", needle="not a .npy")

    def test_pickled_npy_is_refused(self, run_cli, tmp_path):
        p = tmp_path / "obj.npy"
        np.save(p, np.array([{"a": 1}], dtype=object), allow_pickle=True)
        self.run(run_cli, tmp_path, p, "OUT", "--from", "ND", "--to", "FRACTAL_NZ", needle="cannot read")

    def test_bin_without_dtype(self, run_cli, tmp_path):
        dump = tmp_path / "d.bin"
        dump.write_bytes(b"\0" * 512)
        self.run(run_cli, tmp_path, dump, "OUT", "--from", "NC1HWC0", "--to", "NCHW", "--shape", "1,3,4,4",
                 needle="--dtype and --shape")

    def test_device_format_without_shape(self, run_cli, tmp_path):
        p = tmp_path / "d.npy"
        np.save(p, np.zeros((1, 1, 4, 4, 16), np.float16))
        self.run(run_cli, tmp_path, p, "OUT", "--from", "NC1HWC0", "--to", "NCHW", needle="--shape is needed")

    def test_missing_from(self, run_cli, tmp_path, x_npy):
        self.run(run_cli, tmp_path, x_npy, "OUT", "--to", "NC1HWC0", needle="--from and --to")

    def test_bad_shape_text(self, run_cli, tmp_path, x_npy):
        self.run(run_cli, tmp_path, x_npy, "OUT", "--from", "NCHW", "--to", "NC1HWC0", "--shape", "1,three",
                 needle="--shape")

    def test_output_folder_missing(self, run_cli, tmp_path, x_npy):
        code, out, err = run_cli("layout", "convert", x_npy, tmp_path / "no" / "y.npy", "--from", "NCHW",
                                 "--to", "NC1HWC0")
        assert "does not exist" in one_line_error(code, out, err)

    def test_decoding_only_format(self, run_cli, tmp_path, x_npy):
        self.run(run_cli, tmp_path, x_npy, "OUT", "--from", "NCHW", "--to", "FRACTAL_ZN_LSTM", needle="decoding only")

    def test_groups_on_a_format_without_groups(self, run_cli, tmp_path, x_npy):
        self.run(run_cli, tmp_path, x_npy, "OUT", "--from", "NCHW", "--to", "NC1HWC0", "--groups", "2",
                 needle="has no groups")

    def test_c0_disagrees_with_storage(self, run_cli, tmp_path):
        p = tmp_path / "d.npy"
        np.save(p, np.zeros((1, 1, 4, 4, 16), np.float16))
        self.run(run_cli, tmp_path, p, "OUT", "--from", "NC1HWC0", "--to", "NCHW", "--shape", "1,3,4,4",
                 "--from-c0", "8", needle="C0 = 8 was given")


def test_existing_out_untouched_on_error(run_cli, tmp_path):
    out = tmp_path / "out.npy"
    out.write_bytes(b"keep me")
    dump = tmp_path / "d.bin"
    dump.write_bytes(b"\0" * 10)
    code, o, err = run_cli("layout", "convert", dump, out, "--from", "NC1HWC0", "--to", "NCHW",
                           "--shape", "1,3,4,4", "--dtype", "float16")
    one_line_error(code, o, err)
    assert out.read_bytes() == b"keep me"
