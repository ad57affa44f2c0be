"""Fuzz the bundle reader and the emulator on mutated converter output: only ``BundleError`` (or
another exit-2 error, one line) or a clean read and run may come out, never a crash (exit 4).

Seeds are bundles written by the real converter (the README example model; the real PP-OCR classifier
under ``-m realmodel``). Byte mutations mostly stop at a checksum, so most cases mutate one section
and re-seal the file (checksums recomputed), as a hostile writer would: a manifest value anywhere in
the JSON tree, or the graph's protobuf bytes.
"""

from __future__ import annotations

import json
import math
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npu_deploy.converters.files.bundle import read_bundle, validate_manifest
from npu_deploy.errors import NpuDeployError
from tests.fuzzing import byte_edits, examples, mutate
from tests.runtime.check.test_inspect_bundle import reseal

FUZZ = settings(max_examples=examples(60), deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])
_MAX_FEED = 1 << 16  # elements: larger (mutated) input shapes are read but not fed


@pytest.fixture(scope="module", params=["example", pytest.param("ppocr_cls", marks=pytest.mark.realmodel)])
def seed(request, tmp_path_factory) -> bytes:
    import npu_deploy
    from tests.conftest import real_model_path, write_example

    d = tmp_path_factory.mktemp("seed")
    if request.param == "example":
        src, shapes = write_example(d / "example.onnx"), None
    else:
        src, shapes = real_model_path("ppocr_cls"), {"x": (1, 3, 48, 192)}
    out = d / "seed.bundle"
    npu_deploy.convert(str(src), output=str(out), backend="builtin", input_shapes=shapes)
    return _Seed(out.read_bytes())


class _Seed(bytes):
    """The seed bundle's bytes, shown by name in hypothesis' failure reports (not 300 kB of repr)."""

    def __repr__(self) -> str:
        return f"<seed bundle, {len(self)} bytes>"


def _sections(data: bytes) -> tuple[dict, bytes]:
    _, _, graph_off, graph_len, man_off, man_len = struct.unpack_from("<6Q", data, 16)
    return json.loads(data[man_off:man_off + man_len]), data[graph_off:graph_off + graph_len]


def _paths(node, prefix=()):
    """Every JSON path (tuple of keys/indices) in the manifest, the root's children first."""
    if isinstance(node, dict):
        items = list(node.items())
    elif isinstance(node, list):
        items = list(enumerate(node))
    else:
        return
    for k, v in items:
        yield prefix + (k,)
        yield from _paths(v, prefix + (k,))


def _set(tree, path, value):
    for k in path[:-1]:
        tree = tree[k]
    tree[path[-1]] = value


def _exercise(tmp_path, data: bytes) -> None:
    """Read, activate and run; any error must be a one-line exit-2 NpuDeployError."""
    from npu_deploy.runtime.emulator import EmulatorBackend

    p = tmp_path / "fuzz.bundle"
    p.write_bytes(data)
    try:
        with read_bundle(p) as b:
            assert isinstance(b.manifest, dict)
        with EmulatorBackend(p) as backend:
            feeds = {}
            for m in backend.get_inputs():
                shape = tuple(1 if d < 0 else d for d in m.shape)
                if math.prod(shape) > _MAX_FEED or m.dtype.kind not in "biuf":
                    return
                feeds[m.name] = np.zeros(shape, m.dtype)
            backend.run(None, feeds)
    except NpuDeployError as e:
        assert e.exit_code == 2 and "\n" not in str(e), repr(e)


json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats(allow_nan=True)
    | st.text(max_size=8) | st.sampled_from(["ND", "NC1HWC0", "FRACTAL_NZ", "float16", "bfloat16", "x", "-1"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=10)


def test_seed_reads_and_runs(tmp_path, seed):
    manifest, _ = _sections(seed)
    validate_manifest(manifest)
    _exercise(tmp_path, seed)


@FUZZ
@given(data=st.data(), value=json_value)
@pytest.mark.slow
def test_resealed_manifest_value_anywhere(tmp_path, seed, data, value):
    manifest, _ = _sections(seed)
    paths = [p for p in _paths(manifest) if p[0] != "weights" or data.draw(st.booleans())]
    path = data.draw(st.sampled_from(paths))
    _set(manifest, path, value)
    _exercise(tmp_path, reseal(seed, manifest=json.dumps(manifest).encode()))


@FUZZ
@given(data=st.data())
@pytest.mark.slow
def test_resealed_manifest_key_dropped_or_list_emptied(tmp_path, seed, data):
    manifest, _ = _sections(seed)
    path = data.draw(st.sampled_from(list(_paths(manifest))))
    parent = manifest
    for k in path[:-1]:
        parent = parent[k]
    del parent[path[-1]]
    _exercise(tmp_path, reseal(seed, manifest=json.dumps(manifest).encode()))


@FUZZ
@given(edits=st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(1, 255)), min_size=1, max_size=4))
@pytest.mark.slow
def test_resealed_graph_bytes(tmp_path, seed, edits):
    """Mutated protobuf: the reader refuses it or returns a graph whose weights unpack; it is not run
    (onnxruntime's own robustness on malformed graphs is not under test here)."""
    _, graph = _sections(seed)
    buf = bytearray(graph)
    for pos, val in edits:
        buf[pos % len(buf)] ^= val
    p = tmp_path / "fuzz.bundle"
    p.write_bytes(reseal(seed, graph=bytes(buf)))
    try:
        with read_bundle(p) as b:
            for name in b.weights:
                b.unpack(name)
    except NpuDeployError as e:
        assert e.exit_code == 2 and "\n" not in str(e), repr(e)


@FUZZ
@given(edits=byte_edits(1 << 20, 3))
def test_raw_byte_mutations(tmp_path, seed, edits):
    _exercise(tmp_path, mutate(seed, edits))
