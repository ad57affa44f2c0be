"""Stand-in ``acl.mdl``: load, describe, datasets, dynamic batch, execute, unload."""

from __future__ import annotations

import dataclasses
import os
import struct
import threading

from acl._core import (MBATCH_NAME, Dataset, Execution, Model, ModelSpec, S, TensorDesc, TensorSpec, api,
                       default_compute)


def _spec_for(path: str) -> ModelSpec | None:
    real = os.path.realpath(path)
    spec = S.registry.get(real)
    if spec is None:
        from acl import _standin

        spec = _standin.spec_from_file(path)
    if spec is not None and real in S.computes:
        spec = dataclasses.replace(spec, compute=S.computes[real])
    return spec


@api("acl.mdl.load_from_file", "s", ret="pair")
def load_from_file(path: str) -> tuple[int, int]:
    rc = S.need_ctx("acl.mdl.load_from_file")
    if rc:
        return 0, rc
    if not os.path.isfile(path):
        return 0, 145002
    with open(path, "rb") as f:
        if f.read(4) != b"IMOD":
            return 0, 145006
    spec = _spec_for(path)
    if spec is None:
        return 0, 100003
    if spec.soc_version and spec.soc_version != S.soc_name:
        return 0, 507008
    mid = S.new("model")
    S.models[mid] = Model(spec, path, S.current_ctx, S.contexts[S.current_ctx])
    return mid, 0


@api("acl.mdl.unload", "i")
def unload(model_id: int) -> int:
    rc = S.need_ctx("acl.mdl.unload")
    if rc:
        return rc
    if model_id not in S.models:
        S.violate(f"acl.mdl.unload of unknown/unloaded model {model_id}")
        return 100011
    live = [hex(h) for h, ds in S.datasets.items() if model_id in ds.models]
    if live:
        S.violate(f"acl.mdl.unload({model_id}) before destroying its dataset(s) {live}")
    del S.models[model_id]
    return 0


@api("acl.mdl.create_desc", "", ret="none")
def create_desc() -> int:
    h = S.new("desc", 16)
    S.descs[h] = None
    return h


@api("acl.mdl.get_desc", "ii")
def get_desc(desc: int, model_id: int) -> int:
    if desc not in S.descs:
        return 100000
    if model_id not in S.models:
        return 100011
    S.descs[desc] = model_id
    return 0


@api("acl.mdl.destroy_desc", "i")
def destroy_desc(desc: int) -> int:
    if desc not in S.descs:
        S.violate(f"acl.mdl.destroy_desc of unknown/destroyed desc {hex(desc)}")
        return 100000
    if S.descs[desc] in S.models:
        S.violate(f"acl.mdl.destroy_desc({hex(desc)}) before acl.mdl.unload({S.descs[desc]})")
    del S.descs[desc]
    return 0


def _model_of(name: str, desc: int) -> Model | None:
    mid = S.descs.get(desc)
    if mid is None or mid not in S.models:
        S.violate(f"{name} on a desc that is not filled by acl.mdl.get_desc (or whose model is unloaded)")
        return None
    return S.models[mid]


def _tensor(name: str, desc: int, i: int, outputs: bool) -> tuple[Model, TensorSpec] | None:
    m = _model_of(name, desc)
    if m is None:
        return None
    ts = m.spec.outputs if outputs else m.spec.all_inputs
    if not 0 <= i < len(ts):
        return None
    return m, ts[i]


@api("acl.mdl.get_num_inputs", "i", ret="none")
def get_num_inputs(desc: int) -> int:
    m = _model_of("acl.mdl.get_num_inputs", desc)
    return len(m.spec.all_inputs) if m else 0


@api("acl.mdl.get_num_outputs", "i", ret="none")
def get_num_outputs(desc: int) -> int:
    m = _model_of("acl.mdl.get_num_outputs", desc)
    return len(m.spec.outputs) if m else 0


def _size(name: str, desc: int, i: int, outputs: bool) -> int:
    r = _tensor(name, desc, i, outputs)
    if r is None:
        return 0
    return r[0].spec.reported_size(i, outputs)


@api("acl.mdl.get_input_size_by_index", "ii", ret="none")
def get_input_size_by_index(desc: int, i: int) -> int:
    return _size("acl.mdl.get_input_size_by_index", desc, i, False)


@api("acl.mdl.get_output_size_by_index", "ii", ret="none")
def get_output_size_by_index(desc: int, i: int) -> int:
    return _size("acl.mdl.get_output_size_by_index", desc, i, True)


def _attr(name: str, desc: int, i: int, outputs: bool, attr: str, missing):
    r = _tensor(name, desc, i, outputs)
    return getattr(r[1], attr) if r else missing


@api("acl.mdl.get_input_format", "ii", ret="none")
def get_input_format(desc: int, i: int) -> int:
    return _attr("acl.mdl.get_input_format", desc, i, False, "format", -1)


@api("acl.mdl.get_output_format", "ii", ret="none")
def get_output_format(desc: int, i: int) -> int:
    return _attr("acl.mdl.get_output_format", desc, i, True, "format", -1)


@api("acl.mdl.get_input_data_type", "ii", ret="none")
def get_input_data_type(desc: int, i: int) -> int:
    return _attr("acl.mdl.get_input_data_type", desc, i, False, "dtype", -1)


@api("acl.mdl.get_output_data_type", "ii", ret="none")
def get_output_data_type(desc: int, i: int) -> int:
    return _attr("acl.mdl.get_output_data_type", desc, i, True, "dtype", -1)


@api("acl.mdl.get_input_name_by_index", "ii", ret="none")
def get_input_name_by_index(desc: int, i: int) -> str:
    return _attr("acl.mdl.get_input_name_by_index", desc, i, False, "name", "")


@api("acl.mdl.get_output_name_by_index", "ii", ret="none")
def get_output_name_by_index(desc: int, i: int) -> str:
    return _attr("acl.mdl.get_output_name_by_index", desc, i, True, "name", "")


def _dims(name: str, desc: int, i: int, outputs: bool, current: bool = False) -> tuple[dict, int]:
    r = _tensor(name, desc, i, outputs)
    if r is None:
        return {}, 100000
    m, t = r
    if not outputs:
        dims = list(t.dims)                    # inputs: -1 on the dynamic axes
    else:
        gear = (m.last_gear or m.spec.max_gear) if current else m.spec.max_gear
        dims = m.spec.output_dims(gear)[i]     # outputs: the largest gear; current: the gear that ran
    return {"name": t.name, "dimCount": len(dims), "dims": dims}, 0


@api("acl.mdl.get_input_dims", "ii", ret="dict")
def get_input_dims(desc: int, i: int) -> tuple[dict, int]:
    return _dims("acl.mdl.get_input_dims", desc, i, False)


@api("acl.mdl.get_output_dims", "ii", ret="dict")
def get_output_dims(desc: int, i: int) -> tuple[dict, int]:
    return _dims("acl.mdl.get_output_dims", desc, i, True)


@api("acl.mdl.get_cur_output_dims", "ii", ret="dict")
def get_cur_output_dims(desc: int, i: int) -> tuple[dict, int]:
    return _dims("acl.mdl.get_cur_output_dims", desc, i, True, current=True)


def _index(name: str, desc: int, tname: str, outputs: bool) -> tuple[int, int]:
    m = _model_of(name, desc)
    if m is None:
        return 0, 100000
    for k, t in enumerate(m.spec.outputs if outputs else m.spec.all_inputs):
        if t.name == tname:
            return k, 0
    return 0, 100000


@api("acl.mdl.get_input_dims_range", "ii", ret="dict")
def get_input_dims_range(desc: int, i: int) -> tuple[dict, int]:
    """aclmdlGetInputDimsRange: ``{"rangeCount": n, "range": [[low, high], ...]}`` (the C struct's field
    names); a fixed dim has low == high, as for every dim of a static model."""
    r = _tensor("acl.mdl.get_input_dims_range", desc, i, False)
    if r is None:
        return {}, 100000
    m, t = r
    if m.spec.kind == "shape" and i < len(m.spec.ranges):
        rng = [[int(lo), int(hi)] for lo, hi in m.spec.ranges[i]]
    else:
        rng = [[d, d] for d in t.dims]
    return {"rangeCount": len(rng), "range": rng}, 0


@api("acl.mdl.get_input_index_by_name", "is", ret="pair")
def get_input_index_by_name(desc: int, name: str) -> tuple[int, int]:
    return _index("acl.mdl.get_input_index_by_name", desc, name, False)


@api("acl.mdl.get_output_index_by_name", "is", ret="pair")
def get_output_index_by_name(desc: int, name: str) -> tuple[int, int]:
    return _index("acl.mdl.get_output_index_by_name", desc, name, True)


@api("acl.mdl.get_dynamic_batch", "i", ret="dict")
def get_dynamic_batch(desc: int) -> tuple[dict, int]:
    m = _model_of("acl.mdl.get_dynamic_batch", desc)
    if m is None:
        return {}, 100000
    gears = list(m.spec.batch_gears)
    return {"batchCount": len(gears), "batch": gears}, 0


@api("acl.mdl.get_dynamic_hw", "ii", ret="dict")
def get_dynamic_hw(desc: int, index: int) -> tuple[dict, int]:
    m = _model_of("acl.mdl.get_dynamic_hw", desc)
    if m is None:
        return {}, 100000
    hw = [list(g) for g in m.spec.gears] if m.spec.kind == "hw" else []
    return {"hwCount": len(hw), "hw": hw}, 0


@api("acl.mdl.get_input_dynamic_gear_count", "ii", ret="pair")
def get_input_dynamic_gear_count(desc: int, index: int) -> tuple[int, int]:
    m = _model_of("acl.mdl.get_input_dynamic_gear_count", desc)
    if m is None:
        return 0, 100000
    if m.spec.kind != "dims":
        return 0, 100019
    return len(m.spec.gears), 0


@api("acl.mdl.get_input_dynamic_dims", "iii", ret="pair")
def get_input_dynamic_dims(desc: int, index: int, count: int) -> tuple[list, int]:
    m = _model_of("acl.mdl.get_input_dynamic_dims", desc)
    if m is None:
        return [], 100000
    if m.spec.kind != "dims":
        return [], 100019
    if count != len(m.spec.gears):
        return [], 100000
    out = []
    for g in m.spec.gears:
        flat = [d for dims in m.spec.input_dims(g) for d in dims]
        out.append({"dimCount": len(flat), "name": "", "dims": flat})
    return out, 0


@api("acl.mdl.create_dataset", "", ret="none")
def create_dataset() -> int:
    h = S.new("ds", 16)
    S.datasets[h] = Dataset()
    return h


@api("acl.mdl.add_dataset_buffer", "ii", ret="pair")
def add_dataset_buffer(ds: int, buf: int) -> tuple[int, int]:
    if ds not in S.datasets or buf not in S.buffers:
        return 0, 100000
    S.datasets[ds].buffers.append(buf)
    return ds, 0


@api("acl.mdl.get_dataset_num_buffers", "i", ret="none")
def get_dataset_num_buffers(ds: int) -> int:
    return len(S.datasets[ds].buffers) if ds in S.datasets else 0


@api("acl.mdl.get_dataset_buffer", "ii", ret="none")
def get_dataset_buffer(ds: int, i: int) -> int:
    d = S.datasets.get(ds)
    return d.buffers[i] if d is not None and 0 <= i < len(d.buffers) else 0


@api("acl.mdl.destroy_dataset", "i")
def destroy_dataset(ds: int) -> int:
    if ds not in S.datasets:
        S.violate(f"acl.mdl.destroy_dataset of unknown/destroyed dataset {hex(ds)}")
        return 100000
    for h in S.datasets[ds].descs.values():     # the dataset's own copies go with it
        S.tensor_descs.pop(h, None)
    del S.datasets[ds]
    return 0


def _hold(d: Dataset, ds: int, index: int, dtype: int, dims, fmt: int) -> None:
    old = d.descs.get(index)
    if old is not None:
        S.tensor_descs.pop(old, None)
    h = S.new("tdesc", 16)
    S.tensor_descs[h] = TensorDesc(dtype, tuple(dims), fmt, owner=ds)
    d.descs[index] = h


@api("acl.mdl.set_dataset_tensor_desc", "iii", ret="pair")
def set_dataset_tensor_desc(ds: int, tdesc: int, index: int) -> tuple[int, int]:
    """aclmdlSetDatasetTensorDesc: the dataset keeps a copy; the caller still destroys its desc."""
    d = S.datasets.get(ds)
    td = S.tensor_descs.get(tdesc)
    if d is None or td is None:
        S.violate(f"acl.mdl.set_dataset_tensor_desc on unknown dataset {hex(ds)} or tensor desc {hex(tdesc)}")
        return 0, 100000
    if not 0 <= index < len(d.buffers):
        S.violate(f"acl.mdl.set_dataset_tensor_desc: index {index} but the dataset has {len(d.buffers)} buffers")
        return 0, 100000
    _hold(d, ds, index, td.dtype, td.dims, td.format)
    return ds, 0


@api("acl.mdl.get_dataset_tensor_desc", "ii", ret="none")
def get_dataset_tensor_desc(ds: int, index: int) -> int:
    """aclmdlGetDatasetTensorDesc: the desc the dataset holds (0 when none); it stays the dataset's."""
    d = S.datasets.get(ds)
    if d is None:
        return 0
    return d.descs.get(index, 0)


def _set_gear(name: str, kind: str, model_id: int, ds: int, index: int, gear: tuple, bad_code: int) -> int:
    rc = S.need_ctx(name)
    if rc:
        return rc
    m = S.models.get(model_id)
    if m is None:
        return 100011
    if m.spec.kind != kind:
        return 100019
    d = S.datasets.get(ds)
    if d is None or index != len(m.spec.inputs) or index >= len(d.buffers):
        S.violate(f"{name}: index {index} is not the {MBATCH_NAME} buffer of the dataset")
        return 100000
    if gear not in m.spec.gears:
        return bad_code
    ptr, size = S.buffers[d.buffers[index]]
    r = S.device_region(ptr, 4 * len(gear))
    if r is None or isinstance(r, str) or size < 4 * len(gear):
        S.violate(f"{name}: the {MBATCH_NAME} buffer is not valid device memory")
        return 100000
    alloc, off = r
    alloc.data[off:off + 4 * len(gear)] = struct.pack(f"<{len(gear)}i", *gear)
    d.gear = gear
    return 0


@api("acl.mdl.set_dynamic_batch_size", "iiii")
def set_dynamic_batch_size(model_id: int, ds: int, index: int, batch: int) -> int:
    return _set_gear("acl.mdl.set_dynamic_batch_size", "batch", model_id, ds, index, (batch,), 145013)


@api("acl.mdl.set_dynamic_hw_size", "iiiii")
def set_dynamic_hw_size(model_id: int, ds: int, index: int, h: int, w: int) -> int:
    return _set_gear("acl.mdl.set_dynamic_hw_size", "hw", model_id, ds, index, (h, w), 100000)


@api("acl.mdl.set_input_dynamic_dims", "iiid")
def set_input_dynamic_dims(model_id: int, ds: int, index: int, dims: dict) -> int:
    """``dims`` = ``{"dimCount": n, "name": "", "dims": [all dims of all real inputs concatenated]}``."""
    name = "acl.mdl.set_input_dynamic_dims"
    m = S.models.get(model_id)
    values = dims.get("dims")
    if (not isinstance(values, list) or not all(isinstance(v, int) for v in values)
            or dims.get("dimCount") != len(values)):
        S.violate(f"{name}: malformed dims {dims!r}")
        return 100000
    gear = None
    if m is not None and m.spec.kind == "dims":
        for g in m.spec.gears:
            if [d for ds_ in m.spec.input_dims(g) for d in ds_] == values:
                gear = g
        if gear is None:
            S.violate(f"{name}: {values} match no gear (all inputs' dims concatenated)")
            return 100000
    return _set_gear(name, "dims", model_id, ds, index, gear or (), 100000)


def _check_buffers(name: str, m: Model, d: Dataset, specs: list[TensorSpec], what: str) -> int:
    for k, t in enumerate(specs):
        ptr, size = S.buffers.get(d.buffers[k], [0, 0])
        if d.buffers[k] not in S.buffers:
            S.violate(f"{name}: {what} {k} data buffer was destroyed")
            return 100000
        need = m.spec.reported_size(k, what == "output")
        if size < need:
            S.violate(f"{name}: {what} {t.name!r} buffer is {size} bytes, the model needs {need}")
            return 100000
        r = S.device_region(ptr, size)
        if not isinstance(r, tuple):
            S.violate(f"{name}: {what} {t.name!r} buffer: {r or 'host memory, not device memory'}")
            return 107000
    return 0


def _shape_run(name: str, m: Model, d: Dataset) -> tuple | None:
    """The run's gear (actual values at the -1 dims) from the input dataset's tensor descs, or None
    after recording why the run is refused."""
    dims_per_input = []
    if len(m.spec.ranges) != len(m.spec.inputs):
        S.violate(f"{name}: the model records {len(m.spec.ranges)} input ranges for {len(m.spec.inputs)} inputs")
        return None
    for k, (t, rng) in enumerate(zip(m.spec.inputs, m.spec.ranges)):
        h = d.descs.get(k)
        td = S.tensor_descs.get(h) if h is not None else None
        if td is None:
            S.violate(f"{name}: shape-range model input {k} {t.name!r} has no tensor desc "
                      f"(acl.mdl.set_dataset_tensor_desc before execute)")
            return None
        if td.dtype != t.dtype or len(td.dims) != len(t.dims):
            S.violate(f"{name}: input {t.name!r} desc is dtype {td.dtype} rank {len(td.dims)}, the model has "
                      f"dtype {t.dtype} rank {len(t.dims)}")
            return None
        if len(rng) != len(td.dims):
            S.violate(f"{name}: input {t.name!r} records {len(rng)} dim ranges for rank {len(td.dims)}")
            return None
        for axis, (v, (lo, hi)) in enumerate(zip(td.dims, rng)):
            if v < 0 or v < lo or (hi != -1 and v > hi):
                S.violate(f"{name}: input {t.name!r} dim {axis} = {v} is outside its range {lo}~{hi}")
                return None
        dims_per_input.append(list(td.dims))
    return m.spec.shape_gear(dims_per_input)


def _check_run_buffers(name: str, d: Dataset, specs: list[TensorSpec], dims: list[list[int]], what: str) -> int:
    for k, (t, shape) in enumerate(zip(specs, dims)):
        if d.buffers[k] not in S.buffers:
            S.violate(f"{name}: {what} {k} data buffer was destroyed")
            return 100000
        ptr, size = S.buffers[d.buffers[k]]
        need = t.nbytes_of(shape)
        if size < need:
            S.violate(f"{name}: {what} {t.name!r} buffer is {size} bytes, shape {shape} needs {need}")
            return 100000
        r = S.device_region(ptr, max(size, 1))
        if not isinstance(r, tuple):
            S.violate(f"{name}: {what} {t.name!r} buffer: {r or 'host memory, not device memory'}")
            return 107000
    return 0


def _execute(name: str, model_id: int, in_ds: int, out_ds: int) -> int:
    rc = S.need_ctx(name)
    if rc:
        return rc
    m = S.models.get(model_id)
    if m is None:
        return 100011
    if S.contexts[S.current_ctx] != m.device:
        S.violate(f"{name}: current context is on another device than the model")
        return 107003
    di, do = S.datasets.get(in_ds), S.datasets.get(out_ds)
    if di is None or do is None:
        return 100000
    ins, outs = m.spec.all_inputs, m.spec.outputs
    if len(di.buffers) != len(ins):
        S.violate(f"{name}: input dataset has {len(di.buffers)} buffers, the model has {len(ins)} inputs")
        return 100017
    if len(do.buffers) != len(outs):
        S.violate(f"{name}: output dataset has {len(do.buffers)} buffers, the model has {len(outs)} outputs")
        return 100018
    if m.spec.kind == "shape":
        gear = _shape_run(name, m, di)
        if gear is None:
            return 100000
        in_dims, out_dims = m.spec.input_dims(gear), m.spec.output_dims(gear)
        rc = (_check_run_buffers(name, di, ins, in_dims, "input")
              or _check_run_buffers(name, do, outs, out_dims, "output"))
    else:
        rc = _check_buffers(name, m, di, ins, "input") or _check_buffers(name, m, do, outs, "output")
    if rc:
        return rc
    di.models.add(model_id)
    do.models.add(model_id)
    if m.spec.kind != "shape":
        gear = di.gear if di.gear is not None else m.spec.max_gear
    data: dict[str, bytes] = {}
    for k, (t, dims) in enumerate(zip(m.spec.inputs, m.spec.input_dims(gear))):
        ptr, _ = S.buffers[di.buffers[k]]
        alloc, off = S.device_region(ptr, 1)
        data[t.name] = bytes(alloc.data[off:off + t.nbytes_of(dims)])
    compute = m.spec.compute or default_compute
    results = compute(m.spec, data, m.spec.user_gear(gear))
    for k, (t, dims, blob) in enumerate(zip(outs, m.spec.output_dims(gear), results)):
        if len(blob) != t.nbytes_of(dims):
            raise AssertionError(f"stand-in model compute returned {len(blob)} bytes for output {t.name!r}, "
                                 f"expected {t.nbytes_of(dims)}")
        ptr, _ = S.buffers[do.buffers[k]]
        alloc, off = S.device_region(ptr, 1)
        alloc.data[off:off + len(blob)] = blob
        if m.spec.kind == "shape":
            _hold(do, out_ds, k, t.dtype, dims, t.format)
    m.last_gear = gear
    S.executions.append(Execution(model_id, gear[0] if m.spec.kind == "batch" else None, data,
                                  [bytes(b) for b in results], threading.current_thread().name, gear))
    return 0


@api("acl.mdl.execute", "iii")
def execute(model_id: int, in_ds: int, out_ds: int) -> int:
    return _execute("acl.mdl.execute", model_id, in_ds, out_ds)


@api("acl.mdl.execute_async", "iiii")
def execute_async(model_id: int, in_ds: int, out_ds: int, stream: int) -> int:
    if stream not in S.streams:
        return 107000
    if S.streams[stream] != S.current_ctx:
        return 107003
    return _execute("acl.mdl.execute_async", model_id, in_ds, out_ds)


@api("acl.mdl.query_size", "s", ret="triple")
def query_size(path: str) -> tuple[int, int, int]:
    if not os.path.isfile(path):
        return 0, 0, 145002
    return 1 << 20, os.path.getsize(path), 0
