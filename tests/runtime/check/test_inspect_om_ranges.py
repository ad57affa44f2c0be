"""``inspect`` of a shape-range ``.om``: each input's range, terminal and ``--json``, through the real
entry point. The files are built by ``tests/standins/omfile.py`` with the range in GE's spelling (the
descriptor attribute ``shape_range``, list_list_int, ge_tensor.cc); no real shape-range ``.om`` was
available, so that spelling is taken from GE's source, not from a file ATC wrote."""

from __future__ import annotations

import json

import pytest

from npu_deploy.converters.files.om import preflight_info, read_om
from tests.standins.omfile import build_om, tensor


def _range_om(tmp_path, **kw):
    return build_om(tmp_path / "r.om", is_unknown_model=1,
                    inputs=[tensor("x", "float32", [-1, 3, -1, -1], "NCHW",
                                   shape_range=[[1, 8], [3, 3], [32, 640], [32, -1]]),
                            tensor("scale", "float32", [2], "ND", shape_range=[[2, 2]])],
                    outputs=[tensor("y", "float32", [-1, 3, -1, -1], "NCHW")], **kw)


def test_reader_gives_each_inputs_range_and_the_shape_mode(tmp_path):
    om = read_om(_range_om(tmp_path))
    x, scale = om.inputs
    assert x.shape == [-1, 3, -1, -1]
    assert x.shape_range == [(1, 8), (3, 3), (32, 640), (32, -1)]       # -1 (unbounded) survives the varint
    assert scale.shape_range == [(2, 2)]
    assert om.outputs[0].shape_range is None                          # not recorded: not guessed
    pf = preflight_info(tmp_path / "r.om")
    assert pf.dynamic_mode == "shape" and pf.inputs[0].shape_range == x.shape_range


def test_range_alone_marks_a_shape_model_and_a_malformed_range_is_dropped(tmp_path):
    p = build_om(tmp_path / "a.om", inputs=[tensor("x", "float32", [-1, 4], "ND", shape_range=[[1, 4], [4, 4]])],
                 outputs=[tensor("y", "float32", [-1, 4], "ND")])
    assert preflight_info(p).dynamic_mode == "shape"                 # header flag not set: the range says it
    bad = build_om(tmp_path / "b.om", is_unknown_model=1,
                   inputs=[tensor("x", "float32", [-1, 4], "ND", shape_range=[[4, 1], [4, 4]]),
                           tensor("z", "float32", [-1, 4], "ND", shape_range=[[1, 4]])],
                   outputs=[tensor("y", "float32", [-1, 4], "ND")])
    assert [t.shape_range for t in read_om(bad).inputs] == [None, None]   # low > high; wrong rank


def test_inspect_terminal_and_json_show_the_ranges(tmp_path, run_cli):
    path = _range_om(tmp_path)
    out_json = tmp_path / "r.json"
    code, out, err = run_cli("inspect", path, "--json", out_json)
    assert code == 0, err
    dyn = next(line for line in out.splitlines() if line.split()[:1] == ["dynamic"])
    assert "shape: x:1~8,3,32~640,32~-1" in dyn and "scale:2" in dyn
    assert "dynamic shape" in out.splitlines()[-1]
    d = json.loads(out_json.read_text())
    assert d["om"]["dynamic"]["mode"] == "shape"
    assert d["om"]["dynamic"]["ranges"] == {"x": [[1, 8], 3, [32, 640], [32, -1]], "scale": [2]}
    assert d["inputs"][0]["shape_range"] == [[1, 8], [3, 3], [32, 640], [32, -1]]


def test_static_om_has_no_ranges(tmp_path, run_cli):
    path = build_om(tmp_path / "s.om", inputs=[tensor("x", "float32", [1, 4], "ND")],
                    outputs=[tensor("y", "float32", [1, 4], "ND")])
    out_json = tmp_path / "s.json"
    code, out, err = run_cli("inspect", path, "--json", out_json)
    assert code == 0, err
    d = json.loads(out_json.read_text())
    assert "ranges" not in d["om"]["dynamic"] and d["om"]["dynamic"]["mode"] is None
    assert d["inputs"][0]["shape_range"] is None


@pytest.mark.slow
def test_any_written_range_is_read_back_exactly_or_dropped(tmp_path):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as hs

    from tests.fuzzing import examples

    counter = iter(range(100_000))
    row = hs.lists(hs.integers(-3, 1 << 40), min_size=1, max_size=3)

    @settings(max_examples=examples(40), deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(rows=hs.lists(row, min_size=1, max_size=5), rank=hs.integers(1, 5))
    def check(rows, rank):
        p = build_om(tmp_path / f"f{next(counter)}.om", is_unknown_model=1,
                     inputs=[tensor("x", "float32", [-1] * rank, "ND", shape_range=rows)],
                     outputs=[tensor("y", "float32", [-1] * rank, "ND")])
        got = read_om(p).inputs[0].shape_range
        valid = len(rows) == rank and all(len(r) == 2 and 0 <= r[0] and (r[1] == -1 or r[0] <= r[1]) for r in rows)
        assert got == ([tuple(r) for r in rows] if valid else None)

    check()
