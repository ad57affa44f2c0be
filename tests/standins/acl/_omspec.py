"""How the stand-in ``acl.mdl.load_from_file`` learns what an ``.om`` looks like when the test did not
register a :class:`ModelSpec`: it decodes the file with the protobuf classes of the test builder
``omfile.py`` (header and partition table per reference §2.1/§2.2), never with the package's reader.
"""

from __future__ import annotations

import struct

from acl._core import MBATCH_NAME, ModelSpec, TensorSpec

# ge proto DataType -> aclDataType (reference §2.4 / §3.3)
_GE_TO_ACL = {1: 0, 2: 1, 3: 2, 4: 4, 5: 6, 6: 7, 7: 3, 8: 9, 9: 8, 10: 10, 11: 12, 12: 11, 27: 27}
_ACL_FORMAT = {"NCHW": 0, "NHWC": 1, "ND": 2, "NC1HWC0": 3, "FRACTAL_Z": 4, "NC1HWC0_C04": 12, "HWCN": 16,
               "NDHWC": 27, "FRACTAL_NZ": 29, "NCDHW": 30, "NDC1HWC0": 32, "NC": 35, "NCL": 47}


def _model_def_bytes(data: bytes) -> bytes | None:
    if len(data) < 256 or data[:4] != b"IMOD":
        return None
    version = struct.unpack_from("<I", data, 8)[0]
    wide = version >= 0x20000000 and struct.unpack_from("<Q", data, 184)[0] != 0
    pos = 256
    count = struct.unpack_from("<I", data, pos)[0]
    entries = []
    if wide:
        pos += 8
        for _ in range(count):
            t, off, size = struct.unpack_from("<I4xQQ", data, pos)
            entries.append((t, off, size))
            pos += 24
    else:
        pos += 4
        for _ in range(count):
            entries.append(struct.unpack_from("<III", data, pos))
            pos += 12
    for t, off, size in entries:
        if t == 0 and pos + off + size <= len(data):
            return data[pos + off: pos + off + size]
    return None


def _ints(attr) -> list[int] | None:
    if attr.WhichOneof("value") == "list":
        return list(attr.list.i)
    return None


def spec_from_om(path: str) -> ModelSpec | None:
    try:
        import omfile
    except ImportError:
        return None
    with open(path, "rb") as f:
        raw = _model_def_bytes(f.read())
    if raw is None:
        return None
    md = omfile.ModelDef.FromString(raw)
    if not md.graph:
        return None
    soc = md.attr["soc_version"].s.decode() if "soc_version" in md.attr else None
    ops = list(md.graph[0].op)
    gears: list[list[int]] = []
    kind = 0
    for op in ops:
        if op.type == "Case" and "batch_num" in op.attr:
            kind = op.attr["mbatch_dynamic_type"].i if "mbatch_dynamic_type" in op.attr else 1
            gears = [_ints(op.attr[f"_pred_value_{i}"]) for i in range(op.attr["batch_num"].i)]
    data_ops = sorted((op for op in ops if op.type == "Data" and op.name != MBATCH_NAME),
                      key=lambda op: op.attr["index"].i if "index" in op.attr else 0)

    def tspec(name: str, td, dims: list[int]) -> TensorSpec:
        return TensorSpec(name, tuple(dims), _GE_TO_ACL[td.dtype], _ACL_FORMAT.get(td.layout, 2),
                          size=td.size if td.size else None)

    inputs = []
    ranges = []
    for op in data_ops:
        td = op.output_desc[0]
        dims = _ints(op.attr["_mbatch_origin_input_dims"]) if "_mbatch_origin_input_dims" in op.attr else None
        inputs.append(tspec(op.name, td, dims if dims is not None else list(td.shape.dim)))
        # shape-range model: GE's descriptor attr "shape_range", one [low, high] per dim (ge_tensor.cc)
        rows = ([tuple(r.list_i) for r in td.attr["shape_range"].list_list_int.list_list_i]
                if "shape_range" in td.attr else [])
        # without one, a -1 dim is unbounded from 1 (ATC's reading of a bare -1), a fixed dim is itself
        ranges.append(tuple(rows) if rows else tuple((1, -1) if d < 0 else (d, d) for d in td.shape.dim))
    outputs = []
    net = [op for op in ops if op.type == "NetOutput"]
    names = [s.decode().rsplit(":", 1)[0] for s in md.attr["attr_model_out_nodes_name"].list.s] \
        if "attr_model_out_nodes_name" in md.attr else []
    if net:
        for k, td in enumerate(net[0].input_desc):
            dims = list(td.shape.dim)
            if kind == 1 and gears and dims and dims[0] == max(g[0] for g in gears):
                dims[0] = -1
            outputs.append(tspec(names[k] if k < len(names) else td.name, td, dims))
    by_kind = {1: "batch_gears", 2: "hw_gears", 3: "dims_gears"}
    extra = {}
    if gears and kind in by_kind:
        extra[by_kind[kind]] = tuple(g[0] for g in gears) if kind == 1 else tuple(tuple(g) for g in gears)
    if any("shape_range" in op.output_desc[0].attr for op in data_ops):
        extra["ranges"] = tuple(ranges)
    return ModelSpec(inputs, outputs, soc_version=soc, **extra)
