"""Fuzz ``inspect`` on mutated bundles: only the documented errors (exit 2) may come out, and whatever
is returned must render as text and JSON.

Raw byte mutations mostly stop at a checksum; to reach the manifest and graph parsing, mutated sections
are re-sealed (checksums recomputed) before inspecting. Seeds come from ``write_bundle`` and, when it is
available, from the real converter.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npu_deploy.converters.bundle import write_bundle
from npu_deploy.converters.inspect import inspect, render_text
from npu_deploy.errors import NpuDeployError
from tests.converters.test_inspect_bundle import _graph, _weights, manifest, reseal

FUZZ = settings(max_examples=120, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def seed(tmp_path_factory):
    p = tmp_path_factory.mktemp("seed") / "seed.bundle"
    write_bundle(p, manifest(), _graph(), _weights())
    return p.read_bytes()


def _check(tmp_path, data: bytes) -> None:
    p = tmp_path / "fuzz.bundle"
    p.write_bytes(data)
    try:
        r = inspect(p, layers=True, ops=True)
    except NpuDeployError as e:
        assert e.exit_code == 2 and "\n" not in str(e)
        return
    text = render_text(r, ops=True, layers=True)
    assert text.splitlines()[-1] == r.verdict()
    json.loads(r.to_json())


edit = st.tuples(st.sampled_from(["flip", "truncate", "insert"]), st.integers(0, 1 << 14), st.integers(0, 255))


@FUZZ
@given(edits=st.lists(edit, min_size=1, max_size=4))
def test_raw_byte_mutations(tmp_path, seed, edits):
    buf = bytearray(seed)
    for kind, pos, val in edits:
        i = pos % (len(buf) + 1)
        if kind == "flip" and i < len(buf):
            buf[i] ^= 1 << (val % 8)
        elif kind == "truncate":
            del buf[i:]
        elif kind == "insert":
            buf[i:i] = bytes([val])
    _check(tmp_path, bytes(buf))


json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12)


@FUZZ
@given(key=st.sampled_from(sorted(manifest()) + ["weights", "schema", "schema_version"]), value=json_value)
def test_resealed_manifest_with_hostile_values(tmp_path, seed, key, value):
    import struct
    man_off, man_len = struct.unpack_from("<2Q", seed, 16 + 32)
    m = json.loads(seed[man_off:man_off + man_len])
    m[key] = value
    _check(tmp_path, reseal(seed, manifest=json.dumps(m).encode()))


@FUZZ
@given(key=st.sampled_from(["inputs", "outputs", "transdata", "weights"]), field=st.text(max_size=12),
       value=json_value)
def test_resealed_manifest_entries_with_hostile_fields(tmp_path, seed, key, field, value):
    import struct
    man_off, man_len = struct.unpack_from("<2Q", seed, 16 + 32)
    m = json.loads(seed[man_off:man_off + man_len])
    if m.get(key):
        name = field if field in m[key][0] or not field else next(iter(m[key][0]))
        m[key][0][name] = value
    _check(tmp_path, reseal(seed, manifest=json.dumps(m).encode()))


@FUZZ
@given(edits=st.lists(st.tuples(st.integers(0, 1 << 12), st.integers(0, 255)), min_size=1, max_size=4),
       cut=st.one_of(st.none(), st.integers(0, 1 << 12)))
def test_resealed_graph_mutations(tmp_path, seed, edits, cut):
    import struct
    graph_off, graph_len = struct.unpack_from("<2Q", seed, 16 + 16)
    g = bytearray(seed[graph_off:graph_off + graph_len])
    for pos, val in edits:
        g[pos % len(g)] = val
    if cut is not None:
        del g[cut % (len(g) + 1):]
    _check(tmp_path, reseal(seed, graph=bytes(g)))
