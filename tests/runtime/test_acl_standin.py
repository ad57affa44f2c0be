"""The stand-in ``acl`` itself: it must refuse what the documented pyACL contract refuses, or the ACL
backend tests would prove nothing. Each test drives the stand-in directly, the way a buggy caller would."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from tests.standins.omfile import build_om, tensor

STANDINS = Path(__file__).resolve().parents[1] / "standins"


@pytest.fixture
def acl(monkeypatch):
    from npu_deploy.runtime import device

    device.shutdown()
    for name in [n for n in sys.modules if n == "acl" or n.startswith("acl.")]:
        del sys.modules[name]
    monkeypatch.syspath_prepend(str(STANDINS))
    import acl as mod

    mod._standin.reset()
    yield mod
    for name in [n for n in sys.modules if n == "acl" or n.startswith("acl.")]:
        del sys.modules[name]


def up(acl):
    assert acl.init() == 0
    assert acl.rt.set_device(0) == 0
    ctx, ret = acl.rt.create_context(0)
    assert ret == 0
    return ctx


def model(acl, tmp_path, **kw):
    path = build_om(tmp_path / "m.om", inputs=[tensor("x", "float32", [2, 4], "ND")],
                    outputs=[tensor("y", "float32", [2, 4], "ND")], **kw)
    mid, ret = acl.mdl.load_from_file(str(path))
    assert ret == 0
    desc = acl.mdl.create_desc()
    assert acl.mdl.get_desc(desc, mid) == 0
    return mid, desc


def dataset(acl, sizes):
    ds = acl.mdl.create_dataset()
    ptrs = []
    for s in sizes:
        p, ret = acl.rt.malloc(s, 0)
        assert ret == 0
        buf = acl.create_data_buffer(p, s)
        assert acl.mdl.add_dataset_buffer(ds, buf)[1] == 0
        ptrs.append((p, buf))
    return ds, ptrs


def test_wrong_argument_types_raise_typeerror(acl):
    up(acl)
    with pytest.raises(TypeError, match=r"acl.rt.malloc args parse failed"):
        acl.rt.malloc("16", 0)
    with pytest.raises(TypeError, match=r"acl.rt.memcpy args parse failed"):
        acl.rt.memcpy(1, 2, 3, 4)
    with pytest.raises(TypeError, match=r"acl.mdl.load_from_file args parse failed"):
        acl.mdl.load_from_file(Path("m.om"))
    with pytest.raises(TypeError):
        acl.rt.set_device(0.0)
    with pytest.raises(TypeError):
        acl.rt.set_device(device_id=0)
    assert acl.rt.malloc(np.int64(16), 0)[1] == 0      # ints with __index__ are accepted, as by the C API


def test_return_conventions(acl):
    assert acl.rt.malloc(16, 0) == (0, 100001)         # before init: (value, ret)
    assert acl.init() == 0
    assert acl.init() == 100002                        # second init
    assert isinstance(acl.rt.set_device(0), int)
    ctx, ret = acl.rt.create_context(0)
    assert ret == 0 and isinstance(ctx, int) and ctx
    assert acl.get_soc_name() == "Ascend310P3"
    assert acl.rt.destroy_context(ctx) == 0
    assert acl.rt.reset_device(0) == 0
    assert acl.finalize() == 0
    assert acl.finalize() == 100037


def test_context_is_per_thread(acl):
    ctx = up(acl)
    got = {}

    def other():
        got["before"] = acl.rt.malloc(16, 0)[1]
        got["set"] = acl.rt.set_context(ctx)
        p, got["after"] = acl.rt.malloc(16, 0)
        acl.rt.free(p)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert got == {"before": 107002, "set": 0, "after": 0}
    assert any("without a current context" in v for v in acl._standin.violations())


def test_memcpy_rules(acl):
    up(acl)
    p, _ = acl.rt.malloc(16, 0)
    host = np.zeros(4, np.float32)
    h = host.__array_interface__["data"][0]
    assert acl.rt.memcpy(p, 16, h, 20, 1) == 100000                  # count > destMax
    assert acl.rt.memcpy(p, 32, h, 32, 1) == 100000                  # beyond the allocation
    assert acl.rt.memcpy(h, 16, p, 16, 1) == 107000                  # H2D into host memory
    assert acl.rt.memcpy(p, 16, h, 16, 2) == 107000                  # D2H from host memory
    host[:] = [1, 2, 3, 4]
    assert acl.rt.memcpy(p, 16, h, 16, 1) == 0
    back = np.empty(4, np.float32)
    assert acl.rt.memcpy(back.__array_interface__["data"][0], 16, p, 16, 2) == 0
    np.testing.assert_array_equal(back, host)
    assert acl.rt.free(p) == 0
    assert acl.rt.free(p) == 107000                                  # double free
    assert acl.rt.memcpy(p, 16, h, 16, 1) == 107000                  # use after free
    assert len(acl._standin.violations()) == 6


def test_model_rules(acl, tmp_path):
    up(acl)
    assert acl.mdl.load_from_file(str(tmp_path / "none.om")) == (0, 145002)
    (tmp_path / "x.om").write_bytes(b"not an om")
    assert acl.mdl.load_from_file(str(tmp_path / "x.om"))[1] == 145006
    assert acl.mdl.execute(7, 1, 2) == 100011                       # execute before load
    mid, desc = model(acl, tmp_path)
    assert acl.mdl.get_num_inputs(desc) == 1 and acl.mdl.get_input_size_by_index(desc, 0) == 32
    assert acl.mdl.get_input_dims(desc, 0) == ({"name": "x", "dimCount": 2, "dims": [2, 4]}, 0)
    assert acl.mdl.get_input_dims(desc, 5) == ({}, 100000)
    ins, _ = dataset(acl, [16])                                      # smaller than the model's 32 bytes
    outs, _ = dataset(acl, [32])
    assert acl.mdl.execute(mid, ins, outs) == 100000
    assert acl.mdl.set_dynamic_batch_size(mid, ins, 1, 2) == 100019  # static model
    empty = acl.mdl.create_dataset()
    assert acl.mdl.execute(mid, empty, outs) == 100017
    acl._standin.fail("acl.mdl.execute", 507011)
    ins2, _ = dataset(acl, [32])
    assert acl.mdl.execute(mid, ins2, outs) == 507011
    assert acl.mdl.execute(mid, ins2, outs) == 0


def test_soc_mismatch_at_load(acl, tmp_path):
    up(acl)
    path = build_om(tmp_path / "m.om", soc_version="Ascend910B1", inputs=[tensor("x", "float32", [1], "ND")],
                    outputs=[tensor("y", "float32", [1], "ND")])
    assert acl.mdl.load_from_file(str(path)) == (0, 507008)


def test_dynamic_batch_rules(acl, tmp_path):
    up(acl)
    path = build_om(tmp_path / "d.om", inputs=[tensor("x", "float32", [-1, 4], "ND")],
                    outputs=[tensor("y", "float32", [-1, 4], "ND")], dynamic_batch=[1, 4])
    mid, ret = acl.mdl.load_from_file(str(path))
    desc = acl.mdl.create_desc()
    acl.mdl.get_desc(desc, mid)
    idx, ret = acl.mdl.get_input_index_by_name(desc, "ascend_mbatch_shape_data")
    assert (idx, ret) == (1, 0)
    assert acl.mdl.get_dynamic_batch(desc) == ({"batchCount": 2, "batch": [1, 4]}, 0)
    assert acl.mdl.get_input_dims(desc, 0)[0]["dims"] == [-1, 4]
    assert acl.mdl.get_input_size_by_index(desc, 0) == 64            # largest gear
    ins, _ = dataset(acl, [64, acl.mdl.get_input_size_by_index(desc, 1)])
    outs, _ = dataset(acl, [64])
    assert acl.mdl.set_dynamic_batch_size(mid, ins, 0, 4) == 100000  # not the gear input
    assert acl.mdl.set_dynamic_batch_size(mid, ins, 1, 3) == 145013  # not a gear
    assert acl.mdl.set_dynamic_batch_size(mid, ins, 1, 1) == 0
    assert acl.mdl.execute(mid, ins, outs) == 0
    assert acl._standin.executions()[-1].batch == 1
    assert acl.mdl.get_cur_output_dims(desc, 0)[0]["dims"] == [1, 4]


def test_leaks_and_teardown_order_are_reported(acl, tmp_path):
    ctx = up(acl)
    stream, _ = acl.rt.create_stream()
    mid, desc = model(acl, tmp_path)
    ins, _ = dataset(acl, [32])
    outs, _ = dataset(acl, [32])
    assert acl.mdl.execute(mid, ins, outs) == 0
    assert acl.mdl.unload(mid) == 0                # before destroying its datasets
    assert acl.rt.destroy_context(ctx) == 0        # stream and memory still alive
    leaks = acl._standin.leaks()
    assert any("device memory" in x for x in leaks) and any("dataset" in x for x in leaks)
    assert any("stream" in x for x in leaks) and any("desc" in x for x in leaks)
    v = acl._standin.violations()
    assert any("unload" in x and "dataset" in x for x in v)
    assert any("destroy_context" in x and "stream" in x for x in v)
    with pytest.raises(AssertionError, match="not clean"):
        acl._standin.assert_clean()


def test_clean_sequence_from_the_reference_is_clean(acl, tmp_path):
    """The canonical sequence of reference §3.5, with the pieces it forgets, passes ``assert_clean``."""
    ctx = up(acl)
    stream, _ = acl.rt.create_stream()
    mid, desc = model(acl, tmp_path)
    ins, _ = dataset(acl, [32])
    outs, _ = dataset(acl, [32])
    assert acl.mdl.execute(mid, ins, outs) == 0
    for ds in (ins, outs):
        for k in range(acl.mdl.get_dataset_num_buffers(ds)):
            db = acl.mdl.get_dataset_buffer(ds, k)
            assert acl.rt.free(acl.get_data_buffer_addr(db)) == 0
            assert acl.destroy_data_buffer(db) == 0
        assert acl.mdl.destroy_dataset(ds) == 0
    assert acl.mdl.unload(mid) == 0 and acl.mdl.destroy_desc(desc) == 0
    assert acl.rt.destroy_stream(stream) == 0 and acl.rt.destroy_context(ctx) == 0
    assert acl.rt.reset_device(0) == 0 and acl.finalize() == 0
    acl._standin.assert_clean()


def test_device_run_mode_requires_device_to_device_copies(acl):
    acl._standin.reset(run_mode=0)
    up(acl)
    assert acl.rt.get_run_mode() == (0, 0)
    p, _ = acl.rt.malloc(16, 0)
    app = np.arange(4, dtype=np.float32)
    a = app.__array_interface__["data"][0]
    assert acl.rt.memcpy(p, 16, a, 16, 1) == 107000       # H2D is wrong on the device's own CPU
    assert acl.rt.memcpy(p, 16, a, 16, 3) == 0
    back = np.zeros(4, np.float32)
    assert acl.rt.memcpy(back.__array_interface__["data"][0], 16, p, 16, 3) == 0
    np.testing.assert_array_equal(back, app)


def test_hw_and_dims_gear_rules(acl, tmp_path):
    up(acl)
    hw = build_om(tmp_path / "hw.om", inputs=[tensor("x", "float32", [1, 1, -1, -1], "NCHW")],
                  outputs=[tensor("y", "float32", [1, 1, -1, -1], "NCHW")], dynamic_hw=[[2, 2], [4, 3]])
    mid, _ = acl.mdl.load_from_file(str(hw))
    desc = acl.mdl.create_desc()
    acl.mdl.get_desc(desc, mid)
    assert acl.mdl.get_dynamic_hw(desc, -1) == ({"hwCount": 2, "hw": [[2, 2], [4, 3]]}, 0)
    assert acl.mdl.get_input_size_by_index(desc, 0) == 48            # the largest gear, 4x3 fp32
    ins, _ = dataset(acl, [48, acl.mdl.get_input_size_by_index(desc, 1)])
    assert acl.mdl.set_dynamic_batch_size(mid, ins, 1, 2) == 100019  # not a batch model
    assert acl.mdl.set_dynamic_hw_size(mid, ins, 1, 3, 3) == 100000  # not a gear
    assert acl.mdl.set_dynamic_hw_size(mid, ins, 1, 2, 2) == 0

    dims = build_om(tmp_path / "dims.om", inputs=[tensor("a", "float32", [-1, 2], "ND")],
                    outputs=[tensor("y", "float32", [-1, 2], "ND")], dynamic_dims=[[1], [3]])
    mid2, _ = acl.mdl.load_from_file(str(dims))
    desc2 = acl.mdl.create_desc()
    acl.mdl.get_desc(desc2, mid2)
    assert acl.mdl.get_input_dynamic_gear_count(desc2, -1) == (2, 0)
    assert acl.mdl.get_input_dynamic_dims(desc2, -1, 2)[0][1] == {"dimCount": 2, "name": "", "dims": [3, 2]}
    ins2, _ = dataset(acl, [24, acl.mdl.get_input_size_by_index(desc2, 1)])
    assert acl.mdl.set_input_dynamic_dims(mid2, ins2, 1, {"dimCount": 2, "name": "", "dims": [2, 2]}) == 100000
    assert acl.mdl.set_input_dynamic_dims(mid2, ins2, 1, {"dimCount": 3, "name": "", "dims": [3, 2]}) == 100000
    assert acl.mdl.set_input_dynamic_dims(mid2, ins2, 1, {"dimCount": 2, "name": "", "dims": [3, 2]}) == 0
    with pytest.raises(TypeError, match="set_input_dynamic_dims args parse failed"):
        acl.mdl.set_input_dynamic_dims(mid2, ins2, 1, [3, 2])
