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

from npu_deploy.converters.files import bundle as B
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
    manifest = {"soc": "Ascend310P3", "precision_mode": "force_fp16",
                "inputs": [{"name": "x", "shape": [2, 3], "dtype": "float32"}]}
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


# ---------------------------------------------------------------------------------------------------
# manifest validation: every field a consumer reads, on the real converter's manifest

@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A bundle of the README example model, from the real converter."""
    import npu_deploy
    from tests.conftest import write_example

    d = tmp_path_factory.mktemp("converted")
    out = d / "example.bundle"
    npu_deploy.convert(str(write_example(d / "example.onnx")), output=str(out), backend="builtin")
    return out


# (path in the manifest, hostile value, what the one-line error names). The first seven crashed the
# old reader or emulator with exit 4 (AttributeError / TypeError: emulator.py:201/218/223/384/389,
# bundle.py:459).
BAD_FIELDS = [
    (("dynamic",), [1], "manifest field dynamic: must be an object"),
    (("inputs", 0, "name"), ["x"], "manifest field inputs[0].name: must be a string"),
    (("outputs", 0, "name"), {"a": 1}, "manifest field outputs[0].name: must be a string"),
    (("tensor_dtypes",), ["float16"], "manifest field tensor_dtypes: must be an object"),
    (("node_formats",), ["stem/Conv"], "manifest field node_formats: must be an object"),
    (("node_formats", "stem/Conv"), "fast", "manifest field node_formats['stem/Conv']: must be an object"),
    (("weights", 0, "dtype"), ["float16"], "unsupported dtype"),
    (("inputs", 0, "shape"), "1,3,64,64", "manifest field inputs[0].shape: must be a list"),
    (("inputs", 0, "shape", 1), -2, "inputs[0].shape[1]: must be an integer in -1.."),
    (("inputs", 0, "dtype"), "complex256", "inputs[0].dtype: unknown dtype 'complex256'"),
    (("inputs", 0, "format"), "NCHW_BOGUS", "inputs[0].format: unknown format 'NCHW_BOGUS'"),
    (("inputs", 0, "c0"), 0, "inputs[0].c0: must be an integer in 1..1024"),
    (("inputs", 0, "nbytes"), True, "inputs[0].nbytes: must be an integer >= 0"),
    (("outputs", 0), 7, "manifest field outputs[0]: must be an object"),
    (("outputs",), [{"name": "probs", "shape": [1, 10]}], "outputs[0]: has no 'dtype'"),
    (("dynamic", "gears"), [{"x": "big"}], "dynamic.gears[0]['x']: must be a list"),
    (("transdata", 0, "consumers"), [{"n": 1}], "transdata[0].consumers[0]: must be a string"),
    (("transdata", 0, "dst_format"), "NZ?", "transdata[0].dst_format: unknown format"),
    (("tensor_formats", "x"), 3, "tensor_formats['x']: must be a string"),
    (("cost", "est_us", "stem/Conv"), "fast", "cost.est_us['stem/Conv']: must be a finite number"),
    (("cost", "formattrans_share"), float("inf"), "cost.formattrans_share: must be a finite number"),
    (("memory", "arena_bytes"), -256, "memory.arena_bytes: must be an integer >= 0"),
]


def _with(manifest: dict, path: tuple, value) -> dict:
    node = manifest
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return manifest


@pytest.mark.parametrize("path,value,named", BAD_FIELDS, ids=[".".join(map(str, f[0])) for f in BAD_FIELDS])
def test_malformed_manifest_is_one_bundle_error_at_read_and_exit_2_in_run(converted, tmp_path, run_cli,
                                                                         path, value, named):
    bad = tmp_path / "bad.bundle"
    bad.write_bytes(converted.read_bytes())
    _rewrite(bad, manifest=_with(_manifest(bad), path, value))
    with pytest.raises(BundleError) as e:
        B.read_bundle(bad)
    assert named in str(e.value) and "\n" not in str(e.value)
    code, out, err = run_cli("run", bad, "--loop", "1", "--warmup", "0")
    assert code == 2, (out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_validator_accepts_what_the_converter_writes_and_unknown_keys(converted, tmp_path):
    m = _manifest(converted)
    B.validate_manifest(m)
    m["a_key_from_a_newer_writer"] = {"anything": [1, "x"]}
    m["inputs"][0]["transfer"] = "new per-tensor field"
    B.validate_manifest(m)
    B.validate_manifest({})  # every field is optional to the validator (consumers have defaults)


def test_every_manifest_key_the_converter_writes_has_a_validator_line(converted):
    """A new key in the converter's manifest gets its one line in ``bundle.MANIFEST_FIELDS``."""
    written = set(_manifest(converted)) - {"schema", "schema_version", "weights"}
    assert written <= set(B.MANIFEST_FIELDS), sorted(written - set(B.MANIFEST_FIELDS))
