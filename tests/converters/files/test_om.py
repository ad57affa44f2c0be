"""The `.om` reader against files built from the documented layout by ``tests/standins/omfile.py``.

The oracle is the builder: it serialises the ModelDef with a protobuf class generated from the
reference's field numbers and packs header/tables with struct; the reader decodes the wire format itself.
"""

from __future__ import annotations

import struct
from collections import Counter

import pytest

from npu_deploy.converters.files.om import (GE_PROTO_DTYPES, OmError, is_om, preflight_info, read_om)
from tests.standins.omfile import (ModelDef, build_om, build_om_bytes, op, tensor, transdata)

LAYOUTS = [(1, "tiny"), (2, "tiny"), (2, "64")]


def _resnetish(**kw):
    base = dict(
        soc_version="Ascend310P3", model_name="resnet50", atc_version="7.0.RC1",
        atc_cmdline="atc --model=resnet50.onnx --framework=5 --output=resnet50 --soc_version=Ascend310P3",
        inputs=[tensor("actual_input_1", "float16", [1, 3, 224, 224], "NCHW"),
                tensor("mask", "int64", [1, 7], "ND")],
        outputs=[tensor("prob", "float16", [1, 1000], "ND"), tensor("feat", "float32", [1, 2048], "NCHW")],
        ops=[transdata("trans_TransData_0", "NCHW", "NC1HWC0", [1, 3, 224, 224],
                       out_shape=[1, 1, 224, 224, 16], inputs=["actual_input_1:0"]),
             op("conv1", "Conv2D", inputs=["trans_TransData_0:0"],
                input_desc=[tensor("a", "float16", [1, 1, 224, 224, 16], "NC1HWC0")],
                output_desc=[tensor("b", "float16", [1, 4, 112, 112, 16], "NC1HWC0")]),
             op("relu", "Relu", engine="AIcoreEngine"),
             op("argmax", "ArgMaxV2", engine="AIcpu"),
             op("cast_1", "Cast", input_desc=[tensor("c", "float16", [1, 1000], "ND")],
                output_desc=[tensor("d", "float32", [1, 1000], "ND")], attrs={"dst_type": 0}),
             op("transpose_1", "Transpose", input_desc=[tensor("e", "float32", [1, 7, 2], "ND")],
                output_desc=[tensor("f", "float32", [1, 2, 7], "ND")], attrs={"perm": [0, 2, 1]}),
             transdata("trans_TransData_9", "NC1HWC0", "NCHW", [1, 128, 1, 1, 16],
                       out_shape=[1, 2048, 1, 1])],
    )
    base.update(kw)
    return base


def _oracle_modeldef(data: bytes, model: int = 0):
    """Find the MODEL_DEF bytes with plain struct reads (as §2.7) and parse them with the builder's
    protobuf class."""
    version, = struct.unpack_from("<I", data, 8)
    model_length = struct.unpack_from("<Q", data, 184)[0] if version >= 0x20000000 else 0
    off = 256
    wide = model_length != 0
    n, = struct.unpack_from("<I", data, off)
    ents = ([struct.unpack_from("<I4xQQ", data, off + 8 + 24 * k) for k in range(n)] if wide
            else [struct.unpack_from("<III", data, off + 4 + 12 * k) for k in range(n)])
    start = off + (8 + 24 * n if wide else 4 + 12 * n)
    t, o, s = next(e for e in ents if e[0] == 0)
    md = ModelDef()
    md.ParseFromString(data[start + o:start + o + s])
    return md


@pytest.mark.parametrize("header_version,table", LAYOUTS)
def test_header_and_partition_table(tmp_path, header_version, table):
    path = build_om(tmp_path / "m.om", header_version=header_version, table=table,
                    platform_version="1.11.z.0", header_name="resnet50_header", **_resnetish())
    data = path.read_bytes()
    om = read_om(path)
    h = om.header
    assert om.variant == "om" and is_om(path)
    assert h.magic == "IMOD" and h.headsize == 256
    assert h.version == (0x20000000 if header_version == 2 else 0x10000000)
    assert h.version_text == f"{header_version}.0"
    assert h.name == "resnet50_header"
    assert h.platform_version == "1.11.z.0" and h.platform_type == 1
    assert h.is_encrypt == 0 and h.model_num == 1
    assert h.model_length == (len(data) - 256 if table == "64" else 0)
    assert h.length == len(data) - 256
    # partitions: in the order written, contiguous, and their bytes are what the builder put there
    assert [p.type_name for p in om.partitions] == ["MODEL_DEF", "WEIGHTS_DATA", "TBE_KERNELS", "TASK_INFO"]
    head = 256 + (8 + 24 * 4 if table == "64" else 4 + 12 * 4)
    assert om.partitions[0].offset == head
    for a, b in zip(om.partitions, om.partitions[1:]):
        assert b.offset == a.offset + a.size
    assert om.partitions[-1].offset + om.partitions[-1].size == len(data)
    p0, p1 = om.partitions[0], om.partitions[1]
    assert ModelDef.FromString(data[p0.offset:p0.offset + p0.size]) == _oracle_modeldef(data)
    assert data[p1.offset:p1.offset + p1.size] == b"\0" * 64
    assert data[om.partitions[2].offset:om.partitions[2].offset + 4] == struct.pack("<I", 0x5D776EFD)
    assert om.notes == []


@pytest.mark.parametrize("header_version,table", LAYOUTS)
def test_modeldef_summary_matches_protobuf_oracle(tmp_path, header_version, table):
    path = build_om(tmp_path / "m.om", header_version=header_version, table=table, **_resnetish())
    md = _oracle_modeldef(path.read_bytes())
    om = read_om(path)
    m = om.main
    assert m.name == md.name == "resnet50"
    assert m.version == md.version
    # model attributes
    assert om.soc_version == md.attr["soc_version"].s.decode() == "Ascend310P3"
    assert m.attrs["atc_version"] == "7.0.RC1"
    assert m.attrs["atc_cmdline"] == md.attr["atc_cmdline"].s.decode()
    assert m.attrs["memory_size"] == md.attr["memory_size"].i
    # op histogram over every graph, against the protobuf oracle
    want = Counter(o.type for g in md.graph for o in g.op)
    assert m.op_types == dict(want)
    assert m.op_count == sum(want.values())
    engines = Counter(o.attr["_ge_attr_op_kernel_lib_name"].s.decode() for g in md.graph for o in g.op)
    assert m.engines == dict(engines)
    # inputs in index order, outputs from NetOutput
    assert [(t.name, t.dtype, t.shape, t.format) for t in om.inputs] == [
        ("actual_input_1", "float16", [1, 3, 224, 224], "NCHW"), ("mask", "int64", [1, 7], "ND")]
    assert [(t.name, t.dtype, t.shape, t.format) for t in om.outputs] == [
        ("prob", "float16", [1, 1000], "ND"), ("feat", "float32", [1, 2048], "NCHW")]
    assert om.inputs[0].size == 1 * 3 * 224 * 224 * 2
    assert om.inputs[1].np_dtype.itemsize == 8
    # every layout op with its formats
    lay = {o.name: o for o in m.layout_ops}
    assert set(lay) == {"trans_TransData_0", "trans_TransData_9", "cast_1", "transpose_1"}
    t0 = lay["trans_TransData_0"]
    assert (t0.input_formats, t0.output_formats) == (["NCHW"], ["NC1HWC0"])
    assert t0.attrs == {"src_format": "NCHW", "dst_format": "NC1HWC0"}
    assert t0.output_shapes == [[1, 1, 224, 224, 16]] and t0.engine == "AIcoreEngine"
    assert lay["trans_TransData_9"].output_formats == ["NCHW"]
    assert lay["cast_1"].attrs == {"dst_type": 0}
    assert lay["transpose_1"].attrs == {"perm": [0, 2, 1]}
    assert m.dynamic_mode is None and m.gears == []


def test_inputs_ordered_by_index_attr_not_appearance(tmp_path):
    # Data ops written in reverse appearance order, with index attrs saying the true order
    md = ModelDef(name="m", version=2)
    g = md.graph.add(name="m")
    for name, idx in (("second", 1), ("first", 0)):
        o = g.op.add(name=name, type="Data")
        o.attr["index"].i = idx
        d = o.output_desc.add(name=name, dtype=1, layout="ND")
        d.shape.dim.extend([2, -1])
    g.op.add(name="out", type="NetOutput")
    path = tmp_path / "m.om"
    path.write_bytes(build_om_bytes(model_def=md.SerializeToString()))
    om = read_om(path)
    assert [t.name for t in om.inputs] == ["first", "second"]
    assert om.inputs[0].shape == [2, -1]
    assert om.outputs == [] and om.soc_version is None


def test_packed_format_words_and_origin_format(tmp_path):
    path = build_om(tmp_path / "m.om", inputs=[tensor("w", "float16", [4, 1, 16, 16], 516,
                                                      origin_format="HWCN")],
                    outputs=[tensor("y", "float32", [16, 16], 29 | 4 << 24)],
                    ops=[transdata("t", "HWCN", 516, [1, 1, 2, 4], attr_as_int=True)])
    om = read_om(path)
    assert om.inputs[0].format == "FRACTAL_Z:2" and om.inputs[0].format_word == 516
    assert om.inputs[0].origin_format == "HWCN"
    assert om.outputs[0].format == "FRACTAL_NZ[C0=8]"
    t = om.main.layout_ops[0]
    assert t.attrs["src_format"] == "HWCN" and t.attrs["dst_format"] == "FRACTAL_Z:2"
    assert t.output_formats == ["FRACTAL_Z:2"]


@pytest.mark.parametrize("header_version,table", LAYOUTS)
def test_dynamic_batch_gears_and_preflight(tmp_path, header_version, table):
    path = build_om(tmp_path / "d.om", header_version=header_version, table=table,
                    inputs=[tensor("data", "float32", [-1, 3, 416, 416], "NCHW"),
                            tensor("img_info", "float32", [-1, 4])],
                    outputs=[tensor("y", "float32", [-1, 10])], dynamic_batch=[1, 2, 4, 8],
                    soc_version="Ascend310")
    pf = preflight_info(path)
    assert pf.soc_version == "Ascend310" and pf.dynamic_mode == "batch"
    assert pf.batch_gears == [1, 2, 4, 8] and pf.dims_gears == [] and pf.hw_gears == []
    assert [t.name for t in pf.inputs] == ["data", "img_info", "ascend_mbatch_shape_data"]
    assert pf.inputs[0].shape == [-1, 3, 416, 416]
    assert pf.inputs[0].size == 8 * 3 * 416 * 416 * 4  # largest gear
    assert pf.atc_version == "7.0.0.1"


def test_dynamic_hw_and_dims(tmp_path):
    hw = build_om(tmp_path / "hw.om", inputs=[tensor("x", "float16", [1, 3, -1, -1], "NCHW")],
                  outputs=[tensor("y", "float16", [1, 3])], dynamic_hw=[(416, 416), (832, 832)])
    pf = preflight_info(hw)
    assert pf.dynamic_mode == "hw" and pf.hw_gears == [(416, 416), (832, 832)]
    assert pf.inputs[0].shape == [1, 3, -1, -1]
    dims = build_om(tmp_path / "dims.om", inputs=[tensor("x", "float32", [-1, -1, -1, 3])],
                    outputs=[tensor("y", "float32", [1])],
                    dynamic_dims=[[1, 200, 200], [2, 200, 200], [1, 224, 224], [2, 224, 224]])
    pf = preflight_info(dims)
    assert pf.dynamic_mode == "dims" and pf.batch_gears == []
    assert pf.dims_gears == [[1, 200, 200], [2, 200, 200], [1, 224, 224], [2, 224, 224]]
    assert pf.inputs[-1].name == "ascend_mbatch_shape_data"


def test_gear_input_without_gear_list_and_unknown_shape(tmp_path):
    p = build_om(tmp_path / "g.om", inputs=[tensor("x", "float32", [-1, 3])], outputs=[tensor("y")],
                 dynamic_batch=[1, 4], write_case=False)
    assert preflight_info(p).dynamic_mode == "gears"
    p = build_om(tmp_path / "s.om", inputs=[tensor("x", "float32", [-1, 3])], outputs=[tensor("y")],
                 is_unknown_model=1)
    assert preflight_info(p).dynamic_mode == "shape"
    p = build_om(tmp_path / "static.om", inputs=[tensor("x", "float32", [2, 3])], outputs=[tensor("y")])
    pf = preflight_info(p)
    assert pf.dynamic_mode is None and pf.batch_gears == [] and pf.dims_gears == []


def test_multi_model_file(tmp_path):
    path = build_om(tmp_path / "multi.om", table="64", model_num=3, inputs=[tensor("x")],
                    outputs=[tensor("y")])
    om = read_om(path)
    assert om.header.model_num == 3 and len(om.models) == 3
    assert [p.model_index for p in om.partitions] == [0] * 4 + [1] * 4 + [2] * 4
    assert preflight_info(path).dynamic_mode == "shape"  # model_num > 1 = root (dynamic) model


def test_old_file_without_soc_and_unknown_dtype(tmp_path):
    path = build_om(tmp_path / "old.om", header_version=1, soc_version=None, atc_version="1.75.22.0.220",
                    framework_type=None, inputs=[tensor("x", 99, [1])], outputs=[tensor("y", "bfloat16", [2])])
    om = read_om(path)
    assert om.soc_version is None and "soc_version" not in om.main.attrs
    assert om.inputs[0].dtype == "ge_dtype:99" and om.inputs[0].np_dtype is None
    assert om.outputs[0].dtype == "bfloat16" and om.outputs[0].np_dtype.itemsize == 2
    assert preflight_info(path).soc_version is None


def test_every_documented_dtype_decodes(tmp_path):
    names = [n for n in GE_PROTO_DTYPES.values() if n not in ("string",)]
    path = build_om(tmp_path / "dt.om", inputs=[tensor(f"i{k}", n, [2]) for k, n in enumerate(names)],
                    outputs=[tensor("y")])
    assert [t.dtype for t in read_om(path).inputs] == names


def test_encrypted_and_foreign_containers(tmp_path):
    enc = build_om(tmp_path / "enc.om", is_encrypt=1, inputs=[tensor("x")], outputs=[tensor("y")])
    om = read_om(enc)
    assert om.variant == "encrypted" and om.models == [] and om.header.is_encrypt == 1
    assert "encrypted" in om.notes[0]
    pf = preflight_info(enc)
    assert pf.encrypted and pf.soc_version is None
    pico = tmp_path / "svp.om"
    pico.write_bytes(b"PICO" + bytes(300))
    assert read_om(pico).variant == "PICO" and not is_om(pico)
    zipped = tmp_path / "model.om2"
    zipped.write_bytes(b"PK\x03\x04" + bytes(100))
    assert read_om(zipped).variant == "ZIP"
    with pytest.raises(OmError, match="ATC .om files only"):
        preflight_info(zipped)


def test_no_model_def_partition(tmp_path):
    path = tmp_path / "flow.om"
    path.write_bytes(build_om_bytes(partitions=[(6, b"flow"), (7, b"sub")], model_type=3, table="64"))
    om = read_om(path)
    assert [p.type_name for p in om.partitions] == ["FLOW_MODEL", "FLOW_SUBMODEL"]
    assert om.models == [] and "no MODEL_DEF" in om.notes[0]
    with pytest.raises(OmError, match="no MODEL_DEF"):
        preflight_info(path)


def test_aligned_offsets_are_noted(tmp_path):
    # hand-made tiny table whose second partition starts 16 bytes after the first ends
    parts = [(0, b""), (1, b"w" * 8)]
    body = struct.pack("<I", 2) + struct.pack("<III", 0, 0, 0) + struct.pack("<III", 1, 16, 8) + bytes(24)
    head = bytearray(build_om_bytes(partitions=parts)[:256])
    struct.pack_into("<I", head, 76, len(body))
    path = tmp_path / "a.om"
    path.write_bytes(bytes(head) + body)
    om = read_om(path)
    assert om.partitions[1].offset == 256 + 28 + 16
    assert "expected 0" in om.notes[0]


# --- bad input: one clear OmError each --------------------------------------------------------------

def _valid(table="64"):
    return build_om_bytes(table=table, **_resnetish())


def _write(tmp_path, data, name="bad.om"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


@pytest.mark.parametrize("mutate,message", [
    (lambda d: b"", "not an ATC .om"),
    (lambda d: b"IMOD", "truncated"),
    (lambda d: b"XMOD" + d[4:], "not an ATC .om"),
    (lambda d: d[:4] + struct.pack("<I", 128) + d[8:], "header size"),
    (lambda d: d[:-1], "truncated"),
    (lambda d: d + b"\0", "trailing bytes"),
    (lambda d: d[:256] + struct.pack("<I", 10 ** 6) + d[260:], "absurd partition count"),
    (lambda d: d[:156] + struct.pack("<I", 0) + d[160:], "absurd model_num"),
    (lambda d: d[:156] + struct.pack("<I", 2) + d[160:], "past the end"),
    # first entry's size made huge
    (lambda d: d[:256 + 8 + 16] + struct.pack("<Q", 1 << 40) + d[256 + 8 + 24:], "past the end"),
    # first entry's offset made huge
    (lambda d: d[:256 + 8 + 8] + struct.pack("<Q", 1 << 62) + d[256 + 8 + 16:], "past the end"),
    # second entry's type = first's type
    (lambda d: d[:256 + 8 + 24] + struct.pack("<I", 0) + d[256 + 8 + 28:], "appears twice"),
])
def test_bad_container_is_one_clear_error(tmp_path, mutate, message):
    p = _write(tmp_path, mutate(_valid()))
    with pytest.raises(OmError, match=message) as e:
        read_om(p)
    assert "\n" not in str(e.value) and str(p) in str(e.value)


@pytest.mark.parametrize("model_def,message", [
    (b"\xff" * 11, "varint"),
    (b"\x0a\x10abc", "declares 16 bytes"),
    (b"\x0b", "wire type 3"),
    (b"\x00\x01", "field number 0"),
    (b"\x10\x01\x0a", "varint runs past"),
    (b"\x0d\x01\x02", "fixed32 runs past"),
    (b"\x09\x01", "fixed64 runs past"),
    (b"\x08\x01", "wire type 0, expected 2"),                       # ModelDef.name as a varint
    (b"\x3a\x04\x32\x02\x10\x01", "OpDef.type"),                     # graph.op.type as a varint
    (b"\x3a\x0c\x32\x0a\x12\x04Data\x8a\x02\x01\x0f", "wire type 7"),  # a Data op's input_desc: wire type 7
])
def test_malformed_modeldef_is_one_clear_error(tmp_path, model_def, message):
    p = _write(tmp_path, build_om_bytes(model_def=model_def))
    with pytest.raises(OmError, match="malformed ModelDef") as e:
        read_om(p)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_absurd_gear_count(tmp_path):
    p = build_om(tmp_path / "g.om", inputs=[tensor("x")], outputs=[tensor("y")],
                 ops=[op("case", "Case", attrs={"batch_num": 10 ** 9})])
    with pytest.raises(OmError, match="absurd gear count"):
        read_om(p)


def test_missing_file_and_folder(tmp_path):
    with pytest.raises(OmError, match="no such file"):
        read_om(tmp_path / "nope.om")
    with pytest.raises(OmError, match="folder"):
        read_om(tmp_path)
    assert not is_om(tmp_path / "nope.om")


def test_keep_ops_lists_every_op_with_its_formats(tmp_path):
    path = build_om(tmp_path / "m.om", **_resnetish())
    md = _oracle_modeldef(path.read_bytes())
    assert read_om(path).main.ops is None
    ops = read_om(path, keep_ops=True).main.ops
    assert [(o.name, o.type) for o in ops] == [(o.name, o.type) for g in md.graph for o in g.op]
    conv = next(o for o in ops if o.name == "conv1")
    assert (conv.input_formats, conv.output_formats) == (["NC1HWC0"], ["NC1HWC0"])
    assert conv.output_shapes == [[1, 4, 112, 112, 16]]
    assert {o.engine for o in ops if o.type == "ArgMaxV2"} == {"AIcpu"}


def test_subgraph_ops_are_counted(tmp_path):
    path = build_om(tmp_path / "m.om", inputs=[tensor("x")], outputs=[tensor("y")],
                    ops=[op("a", "Relu"), op("b", "Relu", graph=1), transdata("t", "ND", "FRACTAL_NZ", [16, 16],
                                                                               graph=2)])
    m = read_om(path).main
    assert m.graphs == ["model", "model_sub_1", "model_sub_2"]
    assert m.op_types["Relu"] == 2 and m.layout_ops[0].graph == "model_sub_2"


def test_absurd_rank_is_refused(tmp_path):
    p = build_om(tmp_path / "r.om", inputs=[tensor("x", "float32", [1] * 129)], outputs=[tensor("y")])
    with pytest.raises(OmError, match="absurd rank of 129"):
        read_om(p)


def _ld(field: int, payload: bytes) -> bytes:
    """Hand-encode a length-delimited protobuf field (keys and lengths below 128 bytes here)."""
    assert len(payload) < 128 and field < 16
    return bytes([field << 3 | 2, len(payload)]) + payload


def test_unpacked_repeated_dims_and_unknown_fields_are_accepted(tmp_path):
    # ShapeDef.dim written unpacked (one varint per dim), plus unknown fields of every wire type
    shape = b"\x08\x02" + b"\x08\x03" + b"\x08" + b"\xff" * 9 + b"\x01"      # dims 2, 3, -1
    unknown = b"\x78\x05" + b"\x79" + bytes(8) + b"\x7d" + bytes(4) + _ld(14, b"xyz")  # fields 15 (0, 1, 5), 14
    desc = _ld(1, b"x") + b"\x10\x02" + _ld(3, shape) + _ld(4, b"NHWC") + unknown
    data_op = _ld(1, b"x") + _ld(2, b"Data") + bytes([0x92, 0x02, len(desc)]) + desc  # output_desc (34)
    graph = _ld(1, b"g") + _ld(6, data_op)
    model_def = _ld(1, b"hand") + b"\x10\x02" + _ld(7, graph) + unknown
    p = tmp_path / "hand.om"
    p.write_bytes(build_om_bytes(model_def=model_def))
    om = read_om(p)
    assert om.main.name == "hand"
    assert [(t.name, t.dtype, t.shape, t.format) for t in om.inputs] == [("x", "float16", [2, 3, -1], "NHWC")]


def _mapped_ops():
    return [transdata("trans_TransData_0", "NCHW", "NC1HWC0", [1, 3, 8, 8], out_shape=[1, 1, 8, 8, 16],
                      inputs=["x:0"], original_names=[]),
            op("convrelu", "Conv2D", inputs=["trans_TransData_0:0", "w:0", "", "shape_const:-1"],
               output_desc=[tensor("o", "float16", [1, 1, 8, 8, 16], "NC1HWC0", origin=("relu", 0)),
                            tensor("o2", "float16", [1], "ND", origin=("conv", 7))],
               original_names=["conv", "relu"]),
            op("plain", "Relu", inputs=["convrelu:0"], output_desc=[tensor("p", "float16", [1], "ND")])]


def test_keep_ops_reads_edges_and_the_fusion_mapping(tmp_path):
    """ATC's mapping attributes (accuracy-debug.md §4) as the builder's protobuf class wrote them."""
    path = build_om(tmp_path / "m.om", inputs=[tensor("x", "float32", [1, 3, 8, 8], "NCHW")],
                    outputs=[tensor("plain", "float16", [1], "ND", source="plain:0")], ops=_mapped_ops())
    md = _oracle_modeldef(path.read_bytes())
    proto = {o.name: o for o in md.graph[0].op}
    ops = {o.name: o for o in read_om(path, keep_ops=True).main.ops}
    for name, o in ops.items():
        assert o.inputs == list(proto[name].input)
        assert o.id == (proto[name].id or None)
    assert ops["trans_TransData_0"].original_names == []
    assert ops["convrelu"].original_names == ["conv", "relu"]
    assert ops["plain"].original_names is None and ops["x"].original_names is None
    assert [(g.name, g.output_index) if g else None for g in ops["convrelu"].output_origins] == [
        ("relu", 0), ("conv", 7)]
    assert ops["plain"].output_origins == [None]
    assert ops["Node_Output"].inputs == ["plain:0"]
    # the layout-op summary (no keep_ops) carries the same fields for its TransData
    lay = read_om(path).main.layout_ops[0]
    assert (lay.name, lay.inputs, lay.original_names) == ("trans_TransData_0", ["x:0"], [])


@pytest.mark.parametrize("index", [-1, 1 << 40])
def test_absurd_origin_output_index_falls_back_to_the_position(tmp_path, index):
    ops = [op("a", "Relu", output_desc=[tensor("o", "float16", [1], "ND", origin=("relu", index))],
              original_names=["relu"])]
    path = build_om(tmp_path / "m.om", inputs=[tensor("x")], outputs=[tensor("y")], ops=ops)
    got = next(o for o in read_om(path, keep_ops=True).main.ops if o.name == "a").output_origins[0]
    assert (got.name, got.output_index) == ("relu", 0)


def test_origin_attribute_of_the_wrong_type_is_ignored(tmp_path):
    md = ModelDef()
    g = md.graph.add(name="g")
    o = g.op.add(name="a", type="Relu")
    d = o.output_desc.add(name="o", layout="ND")
    d.attr["_datadump_origin_name"].i = 5            # an int where a string belongs
    o.attr["_datadump_original_op_names"].i = 3      # not a list of names
    p = tmp_path / "w.om"
    p.write_bytes(build_om_bytes(model_def=md.SerializeToString()))
    a = read_om(p, keep_ops=True).main.ops[0]
    assert a.output_origins == [None] and a.original_names == []
