"""ACL operator dump files (converters/files/dump.py).

The oracle for the reader is a minimal protobuf encoder written here from the documented layout
(reference/accuracy-debug.md §2: field numbers and wire types), independent of the module's descriptor.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npu_deploy.converters.files import dump
from npu_deploy.converters.files.dump import (DT, DumpError, DumpTensor, dump_file_name, read_dump, read_dump_folder,
                                        write_dump, write_dump_folder)
from tests.fuzzing import examples


# ------------------------------------------------------------------ the test's own protobuf encoder
def varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def f_varint(num: int, value: int) -> bytes:
    return varint(num << 3 | 0) + varint(value)


def f_bytes(num: int, payload: bytes) -> bytes:
    return varint(num << 3 | 2) + varint(len(payload)) + payload


def shape_msg(dims) -> bytes:
    # repeated uint64 dim = 1, written unpacked (a reader must accept both encodings)
    return b"".join(f_varint(1, d) for d in dims)


def shape_packed(dims) -> bytes:
    return f_bytes(1, b"".join(varint(d) for d in dims))


# numbers from the reference, typed out here (not taken from the module)
DT_FLOAT, DT_FLOAT16, DT_INT32, DT_INT64 = 1, 2, 7, 8
F_NCHW, F_ND, F_NC1HWC0, F_FRACTAL_NZ = 0, 2, 3, 29


def op_input(dtype, fmt, shape, size, original_shape=None, sub_format=0) -> bytes:
    b = f_varint(1, dtype) + f_varint(2, fmt) + f_bytes(3, shape_msg(shape)) + f_varint(5, size)
    if original_shape is not None:
        b += f_bytes(6, shape_packed(original_shape))
    if sub_format:
        b += f_varint(7, sub_format)
    return b


def op_output(dtype, fmt, shape, size, original_shape=None, name=None, index=0, origin_fmt=None) -> bytes:
    b = f_varint(1, dtype) + f_varint(2, fmt) + f_bytes(3, shape_msg(shape)) + f_varint(6, size)
    if name is not None:
        orig = f_bytes(1, name.encode()) + f_varint(2, index) + f_varint(3, dtype)
        if origin_fmt is not None:
            orig += f_varint(4, origin_fmt)
        b += f_bytes(4, orig)
    if original_shape is not None:
        b += f_bytes(7, shape_msg(original_shape))
    return b


def dump_bytes(op_name, inputs, outputs, blobs, version="2.0", dump_time=1234, extra=b"") -> bytes:
    header = f_bytes(1, version.encode()) + f_varint(2, dump_time)
    header += b"".join(f_bytes(3, o) for o in outputs)
    header += b"".join(f_bytes(4, i) for i in inputs)
    header += f_bytes(6, op_name.encode()) + extra
    return struct.pack("<Q", len(header)) + header + b"".join(blobs)


# --------------------------------------------------------------------------- oracles for layouts
def nz_oracle(x: np.ndarray) -> np.ndarray:
    """(M, N) -> (N1, M1, 16, 16) by index loops, zero padded."""
    m, n = x.shape
    m1, n1 = -(-m // 16), -(-n // 16)
    out = np.zeros((n1, m1, 16, 16), x.dtype)
    for i in range(m):
        for j in range(n):
            out[j // 16, i // 16, i % 16, j % 16] = x[i, j]
    return out


def nc1hwc0_oracle(x: np.ndarray, c0: int = 16) -> np.ndarray:
    n, c, h, w = x.shape
    c1 = -(-c // c0)
    out = np.zeros((n, c1, h, w, c0), x.dtype)
    for ci in range(c):
        out[:, ci // c0, :, :, ci % c0] = x[:, ci]
    return out


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def test_dt_table_matches_the_reference():
    expected = {1: "float32", 2: "float16", 3: "int8", 4: "uint8", 5: "int16", 6: "uint16", 7: "int32",
                8: "int64", 9: "uint32", 10: "uint64", 11: "bool", 12: "float64", 27: "bfloat16"}
    assert {k: v.name for k, v in DT.items()} == expected


def test_reads_a_hand_built_file_with_nz_and_5hd(tmp_path, rng):
    a = rng.standard_normal((20, 35)).astype(np.float16)
    b = rng.standard_normal((2, 19, 3, 5)).astype(np.float16)
    y = rng.integers(-9, 9, (4,)).astype(np.int32)
    a_nz, b_5hd = nz_oracle(a), nc1hwc0_oracle(b)
    inputs = [op_input(DT_FLOAT16, F_FRACTAL_NZ, a_nz.shape, a_nz.nbytes, original_shape=a.shape),
              op_input(DT_FLOAT16, F_NC1HWC0, b_5hd.shape, b_5hd.nbytes, original_shape=b.shape)]
    outputs = [op_output(DT_INT32, F_ND, y.shape, y.nbytes, name="model/out:0", index=1)]
    p = tmp_path / "MyOp.model_layer.3.2.1682067845380164"
    p.write_bytes(dump_bytes("model/layer", inputs, outputs, [a_nz.tobytes(), b_5hd.tobytes(), y.tobytes()]))
    d = read_dump(p)
    assert (d.op_type, d.op_name, d.task_id, d.stream_id, d.timestamp) == \
        ("MyOp", "model/layer", 3, 2, 1682067845380164)
    assert (d.version, d.dump_time) == ("2.0", 1234)
    assert [t.format for t in d.inputs] == ["FRACTAL_NZ", "NC1HWC0"]
    assert d.inputs[0].shape == (3, 2, 16, 16) and d.inputs[0].original_shape == (20, 35)
    np.testing.assert_array_equal(d.inputs[0].data, a_nz)
    np.testing.assert_array_equal(d.inputs[0].logical(), a)
    np.testing.assert_array_equal(d.inputs[1].logical(), b)
    out = d.outputs[0]
    assert (out.dtype, out.original_name, out.original_index) == (np.dtype(np.int32), "model/out:0", 1)
    np.testing.assert_array_equal(out.logical(), y)


def test_unknown_fields_are_ignored_and_original_shape_may_be_absent(tmp_path):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    unknown = f_varint(99, 5) + f_bytes(100, b"future")
    inputs = [op_input(DT_FLOAT, F_ND, x.shape, x.nbytes) + f_varint(42, 1)]
    p = tmp_path / "Relu.r.1.0.5"
    p.write_bytes(dump_bytes("r", inputs, [], [x.tobytes()], extra=unknown))
    d = read_dump(p)
    assert d.inputs[0].original_shape == (2, 3)
    np.testing.assert_array_equal(d.inputs[0].logical(), x)


def test_channels_last_origin_from_original_op_format(tmp_path, rng):
    x = rng.standard_normal((1, 5, 2, 3)).astype(np.float16)  # logical NHWC [N, H, W, C]
    nchw = x.transpose(0, 3, 1, 2)
    phys = nc1hwc0_oracle(nchw)
    outputs = [op_output(DT_FLOAT16, F_NC1HWC0, phys.shape, phys.nbytes, original_shape=x.shape,
                         name="t", origin_fmt=1)]  # FORMAT_NHWC = 1
    p = tmp_path / "Conv2D.c.1.0.1"
    p.write_bytes(dump_bytes("c", [], outputs, [phys.tobytes()]))
    t = read_dump(p).outputs[0]
    assert t.original_format == "NHWC"
    np.testing.assert_array_equal(t.logical(), x)


def test_round_trip_through_the_writer(tmp_path, rng):
    a = rng.standard_normal((3, 20, 35)).astype(np.float32)
    b = rng.standard_normal((1, 7, 4, 4)).astype(np.float16)
    ins = [DumpTensor.from_logical(a, "FRACTAL_NZ"), DumpTensor.from_logical(b, "NC1HWC0")]
    outs = [DumpTensor.from_logical(np.array(3.5, np.float64), original_name="s", original_index=2)]
    p = tmp_path / dump_file_name("MatMul", "blk/mm", 4, 1, 99)
    write_dump(p, op_name="blk/mm", inputs=ins, outputs=outs, dump_time=7)
    d = read_dump(p)
    assert p.name == "MatMul.blk_mm.4.1.99" and d.op_name == "blk/mm" and d.dump_time == 7
    np.testing.assert_array_equal(d.inputs[0].logical(), a)
    np.testing.assert_array_equal(d.inputs[1].data, nc1hwc0_oracle(b))
    np.testing.assert_array_equal(d.inputs[1].logical(), b)
    assert d.outputs[0].shape == () and d.outputs[0].logical() == 3.5
    assert (d.outputs[0].original_name, d.outputs[0].original_index) == ("s", 2)
    # header length and tensor bytes as documented: 8 + header + raw bytes, inputs first
    raw = p.read_bytes()
    (hlen,) = struct.unpack("<Q", raw[:8])
    assert len(raw) == 8 + hlen + sum(t.data.nbytes for t in d.inputs + d.outputs)
    assert raw[8 + hlen:8 + hlen + 16] == d.inputs[0].data.tobytes()[:16]


def test_writer_output_is_read_by_an_independent_descriptor(tmp_path):
    """A second descriptor, written separately here from the reference schema, parses the writer's header."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="t.proto", package="t", syntax="proto3")
    sh = fdp.message_type.add(name="Shape")
    sh.field.add(name="dim", number=1, type=F.TYPE_UINT64, label=F.LABEL_REPEATED)
    oo = fdp.message_type.add(name="OriginalOp")
    oo.field.add(name="name", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    oo.field.add(name="output_index", number=2, type=F.TYPE_UINT32, label=F.LABEL_OPTIONAL)
    out = fdp.message_type.add(name="Out")
    out.field.add(name="data_type", number=1, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    out.field.add(name="format", number=2, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    out.field.add(name="shape", number=3, type=F.TYPE_MESSAGE, type_name=".t.Shape", label=F.LABEL_OPTIONAL)
    out.field.add(name="original_op", number=4, type=F.TYPE_MESSAGE, type_name=".t.OriginalOp",
                  label=F.LABEL_OPTIONAL)
    out.field.add(name="size", number=6, type=F.TYPE_UINT64, label=F.LABEL_OPTIONAL)
    dd = fdp.message_type.add(name="D")
    dd.field.add(name="output", number=3, type=F.TYPE_MESSAGE, type_name=".t.Out", label=F.LABEL_REPEATED)
    dd.field.add(name="op_name", number=6, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    D = message_factory.GetMessageClass(pool.FindMessageTypeByName("t.D"))
    x = np.ones((2, 17), np.float16)
    p = tmp_path / "Add.a.1.0.1"
    write_dump(p, op_name="a", inputs=[], outputs=[DumpTensor.from_logical(x, "FRACTAL_NZ", original_name="y",
                                                                           original_index=0)])
    raw = p.read_bytes()
    (hlen,) = struct.unpack("<Q", raw[:8])
    m = D.FromString(raw[8:8 + hlen])
    o = m.output[0]
    assert (m.op_name, o.data_type, o.format, list(o.shape.dim), o.size) == ("a", 2, 29, [2, 1, 16, 16], 1024)
    assert o.original_op.name == "y"
    assert len(raw) == 8 + hlen + 1024


# ---------------------------------------------------------------------------------- damaged files
def _good(tmp_path) -> tuple[Path, bytes]:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    raw = dump_bytes("op", [op_input(DT_FLOAT, F_ND, x.shape, x.nbytes)],
                     [op_output(DT_FLOAT, F_ND, x.shape, x.nbytes, name="y")], [x.tobytes(), x.tobytes()])
    return tmp_path / "Abs.op.1.0.1", raw


DAMAGED = {
    "empty": (lambda raw: b"", "header_len"),
    "truncated header length": (lambda raw: raw[:5], "header_len"),
    "header_len too large": (lambda raw: struct.pack("<Q", 10 ** 12) + raw[8:], "header_len"),
    "header cut": (lambda raw: raw[:20], "header_len"),
    "tensor bytes cut": (lambda raw: raw[:-3], "size"),
    "not protobuf": (lambda raw: struct.pack("<Q", 4) + b"\xff\xff\xff\xff" + raw[12:], "DumpData"),
}


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_damaged_files_are_one_line_naming_the_field(tmp_path, case):
    p, raw = _good(tmp_path)
    damage, field = DAMAGED[case]
    p.write_bytes(damage(raw))
    with pytest.raises(DumpError) as e:
        read_dump(p)
    msg = str(e.value)
    assert "\n" not in msg and str(p) in msg and field in msg
    assert e.value.exit_code == 2


@pytest.mark.parametrize("tensor, field", [
    (op_input(99, F_ND, (3,), 12), "input[0].data_type"),
    (op_input(28, F_ND, (3,), 12), "input[0].data_type"),          # DT_INT4: packed, no numpy type
    (op_input(DT_FLOAT, 250, (3,), 12), "input[0].format"),
    (op_input(DT_FLOAT, F_ND, (3,), 13), "input[0].size"),         # size disagrees with dtype * shape
    (op_input(DT_FLOAT, F_ND, (2 ** 64 - 1,), 12), "input[0].shape"),   # a negative dim as uint64
    (op_input(DT_FLOAT, F_ND, (2 ** 40, 2 ** 40), 12), "input[0].size"),  # huge product
    (op_input(DT_FLOAT, F_ND, (3,), 12, original_shape=(2 ** 63,)), "input[0].original_shape"),
])
def test_bad_tensor_descriptions(tmp_path, tensor, field):
    p = tmp_path / "X.x.1.0.1"
    p.write_bytes(dump_bytes("x", [tensor], [], [b"\0" * 12]))
    with pytest.raises(DumpError, match=rf"{str(p)}.*{field.replace('[', '.').replace(']', '.')}") as e:
        read_dump(p)
    assert "\n" not in str(e.value)


def test_sizes_beyond_the_file_are_checked_before_reading(tmp_path):
    # each size is right for its shape, but together they need more than the file holds
    p = tmp_path / "X.x.1.0.1"
    p.write_bytes(dump_bytes("x", [op_input(DT_FLOAT, F_ND, (1000,), 4000)], [], [b"\0" * 100]))
    with pytest.raises(DumpError, match="need 4,000 bytes after the header but 100 are there"):
        read_dump(p)


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_reader_only_raises_dump_error(tmp_path_factory, data):
    folder = tmp_path_factory.mktemp("fz")
    x = np.arange(24, dtype=np.float16).reshape(2, 12)
    nz = nz_oracle(x)
    raw = bytearray(dump_bytes("op", [op_input(DT_FLOAT16, F_FRACTAL_NZ, nz.shape, nz.nbytes, original_shape=x.shape)],
                               [op_output(DT_FLOAT16, F_ND, x.shape, x.nbytes, name="y")],
                               [nz.tobytes(), x.tobytes()]))
    mode = data.draw(st.sampled_from(["flip", "cut", "splice"]))
    if mode == "flip":
        for _ in range(data.draw(st.integers(1, 8))):
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] = data.draw(st.integers(0, 255))
    elif mode == "cut":
        raw = raw[:data.draw(st.integers(0, len(raw)))]
    else:
        i = data.draw(st.integers(8, len(raw)))
        raw[i:i] = data.draw(st.binary(max_size=40))
    p = folder / "Op.op.1.0.1"
    p.write_bytes(bytes(raw))
    try:
        d = read_dump(p)
    except DumpError as e:
        assert "\n" not in str(e) and str(p) in str(e)
        return
    for t in d.inputs + d.outputs:
        assert t.data.nbytes == int(np.prod(t.shape)) * t.dtype.itemsize
        try:
            t.logical()
        except dump.FormatError:
            pass  # a damaged original shape that does not fit the storage: refused by the format core


# ------------------------------------------------------------------------------------ folders
class _Stored:
    def __init__(self, fmt, dtype, shape, storage):
        self.format, self.dtype, self.shape, self.storage, self.c0, self.origin = \
            fmt, np.dtype(dtype), tuple(shape), tuple(storage), None, None


class _T:
    def __init__(self, tensor, x, fmt="ND"):
        phys = x if fmt == "ND" else nz_oracle(x)
        self.tensor, self.stored, self.data = tensor, _Stored(fmt, x.dtype, x.shape, phys.shape), phys


class _Op:
    def __init__(self, name, op_type, inputs, outputs):
        self.name, self.op_type, self.inputs, self.outputs = name, op_type, inputs, outputs


def test_folder_round_trip_with_long_names_and_mapping(tmp_path, rng):
    a = rng.standard_normal((4, 20)).astype(np.float16)
    long_name = "enc/" + "x" * 300
    ops = [_Op("mm/0", "MatMul", [_T("in", a)], [_T("t1", a, "FRACTAL_NZ")]),
           _Op("trans_TransData_1", "TransData", [_T("t1", a, "FRACTAL_NZ")], [_T("t1", a)]),
           _Op(long_name, "Split", [_T("t1", a)], [_T("s0", a[:2]), _T("s1", a[2:])])]
    files = write_dump_folder(tmp_path, ops, start_us=1_000)
    assert [f.name for f in files[:2]] == ["MatMul.mm_0.1.0.1000", "TransData.trans_TransData_1.2.0.1001"]
    assert len(files[2].name) < 255
    rows = (tmp_path / "mapping.csv").read_text().splitlines()
    assert rows == [f"{files[2].name},Split.{long_name.replace('/', '_')}.3.0.1002"]
    (tmp_path / "op_stats.csv").write_text("statistics,not,a,dump\n")
    dumps = read_dump_folder(tmp_path)
    assert [(d.op_type, d.op_name, d.task_id, d.timestamp) for d in dumps] == \
        [("MatMul", "mm/0", 1, 1000), ("TransData", "trans_TransData_1", 2, 1001), ("Split", long_name, 3, 1002)]
    assert dumps[0].outputs[0].format == "FRACTAL_NZ"
    np.testing.assert_array_equal(dumps[0].outputs[0].logical(), a)
    assert [(t.original_name, t.original_index) for t in dumps[2].outputs] == [("s0", 0), ("s1", 1)]
    assert (dumps[1].outputs[0].original_name, dumps[1].outputs[0].original_index) == ("t1", 0)
    np.testing.assert_array_equal(dumps[2].outputs[1].logical(), a[2:])


def test_read_dump_folder_from_the_dump_root(tmp_path, rng):
    leaf = dump.dump_run_folder(tmp_path, "model", when=0, iteration=0)
    x = rng.standard_normal((3,)).astype(np.float32)
    write_dump_folder(leaf, [_Op("a", "Abs", [_T("i", x)], [_T("o", np.abs(x))])], start_us=5)
    assert leaf.relative_to(tmp_path).parts == ("19700101000000", "0", "model", "1", "0")
    assert [d.op_name for d in read_dump_folder(tmp_path)] == ["a"]
    write_dump_folder(leaf.parent / "1", [_Op("a", "Abs", [_T("i", x)], [_T("o", x)])], start_us=5)
    with pytest.raises(DumpError, match="holds 2 dump folders"):
        read_dump_folder(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DumpError, match="no dump files"):
        read_dump_folder(tmp_path / "empty")


def test_writer_refuses_dtype_mismatch(tmp_path):
    t = DumpTensor(data=np.zeros(3, np.float32), dtype=np.dtype(np.float16), format="ND", shape=(3,),
                   original_shape=(3,))
    with pytest.raises(dump.FormatError):
        write_dump(tmp_path / "X.x.1.0.1", op_name="x", inputs=[t], outputs=[])
    assert not list(tmp_path.iterdir())


def test_a_plain_tensor_with_an_nchw_original_format_is_taken_as_is(tmp_path):
    # proto3 writes FORMAT_NCHW (0) as "unset"; a real dump also says NCHW (or ND) for 2-D tensors
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for origin_fmt in (0, 2, 1):
        p = tmp_path / f"Abs.a.1.0.{origin_fmt}"
        p.write_bytes(dump_bytes("a", [], [op_output(DT_FLOAT, F_ND, x.shape, x.nbytes, original_shape=x.shape,
                                                     name="y", origin_fmt=origin_fmt)], [x.tobytes()]))
        np.testing.assert_array_equal(read_dump(p).outputs[0].logical(), x)
