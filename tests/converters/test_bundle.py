"""Offline bundle: round trip, content recognition, and refusal of every kind of damaged file."""

from __future__ import annotations

import hashlib
import json
import struct

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from npu_deploy.converters import bundle as B
from npu_deploy.errors import BundleError, InputError


def _graph() -> onnx.ModelProto:
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _weights(rng):
    return [
        B.WeightEntry("a", "ND", (3, 5), rng.standard_normal((3, 5)).astype(np.float32)),
        B.WeightEntry("b", "FRACTAL_Z", (16, 3, 3, 3),
                      lambda: rng.standard_normal((9, 1, 16, 16)).astype(np.float16), c0=16, origin="NCHW"),
        B.WeightEntry("c", "ND", (7,), np.arange(7, dtype=np.int8)),
        B.WeightEntry("d", "ND", (4,), np.arange(4, dtype=np.float32).astype(ml_dtypes.bfloat16)),
        B.WeightEntry("e", "ND", (0,), np.zeros((0,), np.float32)),
    ]


@pytest.fixture
def written(tmp_path):
    rng = np.random.default_rng(0)
    entries = _weights(np.random.default_rng(0))
    expected = {}
    for e in _weights(rng):
        expected[e.name] = np.array(e.data() if callable(e.data) else e.data)
    path = tmp_path / "model.onnx"  # deliberately a misleading name
    manifest = {"soc": "Ascend310P3", "precision_mode": "force_fp16", "inputs": [{"name": "x"}]}
    B.write_bundle(path, manifest, _graph(), entries)
    return path, expected


def test_round_trip(written):
    path, expected = written
    assert B.is_bundle(path)
    with B.read_bundle(path) as b:
        assert b.manifest["soc"] == "Ascend310P3"
        assert b.manifest["schema"] == "npu-deploy/bundle-manifest"
        assert b.manifest["schema_version"] == 1
        assert b.graph == _graph()
        assert list(b.weights) == list(expected)
        for name, arr in expected.items():
            got = b.packed(name)
            assert got.dtype == arr.dtype and got.shape == arr.shape
            assert got.tobytes() == arr.tobytes()
            assert b.weights[name].offset % 256 == 0
        assert b.weights["b"].c0 == 16 and b.weights["b"].origin == "NCHW"
        assert b.weights["b"].logical_shape == (16, 3, 3, 3)
        np.testing.assert_array_equal(b.unpack("a"), expected["a"])
        with pytest.raises(BundleError, match="no weight named"):
            b.packed("zzz")


def test_layout_matches_documented_header(written):
    """An independent reader of the documented layout: magic, version, sections, checksums."""
    path, expected = written
    data = path.read_bytes()
    assert data[:12] == b"\x89NPUBUNDL\r\n\x1a"
    version, = struct.unpack_from("<I", data, 12)
    blob_off, blob_len, g_off, g_len, m_off, m_len = struct.unpack_from("<6Q", data, 16)
    assert version == 1 and blob_off == 256
    assert hashlib.sha256(data[blob_off:blob_off + blob_len]).digest() == data[64:96]
    assert hashlib.sha256(data[g_off:g_off + g_len]).digest() == data[96:128]
    assert hashlib.sha256(data[m_off:m_off + m_len]).digest() == data[128:160]
    assert struct.unpack_from("<Q", data, 160)[0] == len(data)
    assert hashlib.sha256(data[:168]).digest() == data[168:200]
    manifest = json.loads(data[m_off:m_off + m_len])
    for w in manifest["weights"]:
        start = blob_off + w["offset"]
        assert start % 256 == 0
        assert data[start:start + w["nbytes"]] == expected[w["name"]].tobytes()
    # weights are laid out in order, each slot rounded up to 256 bytes, padding zero
    ends = [blob_off + w["offset"] + w["nbytes"] for w in manifest["weights"]]
    for w, end in zip(manifest["weights"][1:], ends):
        assert data[end:blob_off + w["offset"]] == b"\0" * (blob_off + w["offset"] - end)


def _rewrite(path, *, manifest=None, version=None, fix_checksums=True):
    """Rewrite a bundle with a changed manifest/version and (optionally) correct checksums."""
    data = bytearray(path.read_bytes())
    blob_off, blob_len, g_off, g_len, m_off, m_len = struct.unpack_from("<6Q", data, 16)
    blob = bytes(data[blob_off:blob_off + blob_len])
    graph = bytes(data[g_off:g_off + g_len])
    man = bytes(data[m_off:m_off + m_len])
    if manifest is not None:
        man = json.dumps(manifest).encode()
    ver = struct.unpack_from("<I", data, 12)[0] if version is None else version
    head = struct.pack("<12sI6Q32s32s32sQ", data[:12], ver, blob_off, blob_len, g_off, g_len, g_off + g_len,
                       len(man), hashlib.sha256(blob).digest(), hashlib.sha256(graph).digest(),
                       hashlib.sha256(man).digest() if fix_checksums else data[128:160],
                       256 + blob_len + g_len + len(man))
    head += hashlib.sha256(head).digest()
    path.write_bytes(head.ljust(256, b"\0") + blob + graph + man)


def _manifest(path):
    data = path.read_bytes()
    _, _, _, _, m_off, m_len = struct.unpack_from("<6Q", data, 16)
    return json.loads(data[m_off:m_off + m_len])


@pytest.mark.parametrize("where,what", [
    ("blob", "weight blob checksum"), ("graph", "graph checksum"), ("manifest", "manifest checksum"),
    ("header", "header checksum"),
])
def test_corruption_detected(written, where, what):
    path, _ = written
    data = bytearray(path.read_bytes())
    blob_off, blob_len, g_off, g_len, m_off, m_len = struct.unpack_from("<6Q", data, 16)
    pos = {"blob": blob_off + 3, "graph": g_off + g_len // 2, "manifest": m_off + m_len // 2,
           "header": 20}[where]
    data[pos] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(BundleError, match=what):
        B.read_bundle(path)


def test_blob_checksum_skipped_without_verify(written):
    path, _ = written
    data = bytearray(path.read_bytes())
    data[256] ^= 0xFF
    path.write_bytes(bytes(data))
    with B.read_bundle(path, verify=False) as b:
        assert "a" in b.weights


def test_truncated_and_appended(written):
    path, _ = written
    data = path.read_bytes()
    path.write_bytes(data[:-10])
    with pytest.raises(BundleError, match="truncated|says"):
        B.read_bundle(path)
    path.write_bytes(data + b"xx")
    with pytest.raises(BundleError):
        B.read_bundle(path)
    path.write_bytes(data[:100])
    with pytest.raises(BundleError, match="truncated bundle header"):
        B.read_bundle(path)


def test_newer_version_refused(written):
    path, _ = written
    _rewrite(path, version=2)
    with pytest.raises(BundleError, match="version 2 is not supported"):
        B.read_bundle(path)


def test_newer_manifest_schema_refused(written):
    path, _ = written
    m = _manifest(path)
    m["schema_version"] = 9
    _rewrite(path, manifest=m)
    with pytest.raises(BundleError, match="schema version 9"):
        B.read_bundle(path)


@pytest.mark.parametrize("field,value,msg", [
    ("offset", 1 << 40, "outside"),
    ("offset", 8, "aligned"),
    ("nbytes", 61, "bytes, entry says"),
    ("dtype", "object", "unsupported dtype"),
    ("storage_shape", [3, "5"], "malformed"),
    ("offset", -256, "non-negative"),
])
def test_bad_weight_entries_refused(written, field, value, msg):
    path, _ = written
    m = _manifest(path)
    m["weights"][0][field] = value
    _rewrite(path, manifest=m)
    with pytest.raises(BundleError, match=msg):
        B.read_bundle(path)


def test_overlapping_weights_refused(written):
    path, _ = written
    m = _manifest(path)
    m["weights"][1]["offset"] = m["weights"][0]["offset"]
    m["weights"][1]["storage_shape"] = [3, 5]
    m["weights"][1]["dtype"] = "float32"
    m["weights"][1]["nbytes"] = 60
    _rewrite(path, manifest=m)
    with pytest.raises(BundleError, match="overlap"):
        B.read_bundle(path)


def test_not_a_bundle(tmp_path):
    onnx_file = tmp_path / "x.bundle"
    onnx.save(_graph(), onnx_file)
    assert not B.is_bundle(onnx_file)
    assert not B.is_bundle(tmp_path / "missing")
    assert not B.is_bundle(tmp_path)
    with pytest.raises(BundleError, match="wrong magic"):
        B.read_bundle(onnx_file)
    with pytest.raises(BundleError, match="no such file"):
        B.read_bundle(tmp_path / "missing")


def test_failed_write_leaves_nothing(tmp_path):
    def boom():
        raise RuntimeError("packing failed")

    dest = tmp_path / "out"
    with pytest.raises(RuntimeError):
        B.write_bundle(dest, {}, _graph(), [B.WeightEntry("a", "ND", (1,), np.zeros(1, np.float32)),
                                             B.WeightEntry("b", "ND", (1,), boom)])
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(BundleError, match="cannot be stored"):
        B.write_bundle(dest, {}, _graph(), [B.WeightEntry("o", "ND", (1,), np.array([None], dtype=object))])
    with pytest.raises(BundleError, match="twice"):
        B.write_bundle(dest, {}, _graph(), [B.WeightEntry("a", "ND", (1,), np.zeros(1, np.float32))] * 2)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(InputError, match="does not exist"):
        B.write_bundle(tmp_path / "no" / "dir" / "out", {}, _graph(), [])


def test_empty_blob_and_unchanged_name(tmp_path):
    dest = tmp_path / "weird name.with.dots"
    B.write_bundle(dest, {"k": np.float32(1.5)}, _graph(), [])
    assert [p.name for p in tmp_path.iterdir()] == ["weird name.with.dots"]
    with B.read_bundle(dest) as b:
        assert b.weights == {} and b.manifest["k"] == 1.5
