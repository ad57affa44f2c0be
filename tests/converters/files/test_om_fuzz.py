"""Fuzz the `.om` reader with mutated valid files: only OmError may come out, and nothing is allocated
in proportion to a size field."""

from __future__ import annotations

import struct
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npu_deploy.converters.files.om import OmError, format_text, model_out_names, read_om
from tests.standins.omfile import build_om_bytes, op, tensor, transdata
from tests.fuzzing import examples

_COMMON = dict(inputs=[tensor("x", "float16", [-1, 3, 8, 8], "NCHW"), tensor("m", "int64", [-1, 4])],
               outputs=[tensor("y", "float16", [-1, 10], 29 | 4 << 24)],
               ops=[transdata("t0", "NCHW", "NC1HWC0", [8, 3, 8, 8]),
                    op("cast", "Cast", attrs={"dst_type": 1, "f": 0.5, "names": ["a", "b"],
                                              "ll": [[1, 2], [3]], "flag": True}),
                    op("sub_relu", "Relu", graph=1)],
               dynamic_batch=[1, 2, 8], atc_cmdline="atc --model=m.onnx --framework=5")
SEEDS = [build_om_bytes(header_version=1, table="tiny", **_COMMON),
         build_om_bytes(header_version=2, table="tiny", **_COMMON),
         build_om_bytes(header_version=2, table="64", **_COMMON),
         build_om_bytes(header_version=2, table="64", model_num=2, inputs=[tensor("x")], outputs=[tensor("y")])]
# warm up lazy imports (the format registry) so the memory check below sees only the parse
format_text(29 | 4 << 24)
model_out_names(["a:0"])
FUZZ = settings(max_examples=examples(150), deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def _check(tmp_path, data: bytes) -> None:
    p = tmp_path / "fuzz.om"
    p.write_bytes(data)
    tracemalloc.start()
    try:
        read_om(p)
    except OmError as e:
        assert "\n" not in str(e)
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < (2 << 20) + 64 * len(data), f"peak {peak} bytes for a {len(data)}-byte file"


def _mutate(data: bytes, edits) -> bytes:
    buf = bytearray(data)
    for kind, pos, val in edits:
        if not buf:
            break
        i = pos % (len(buf) + 1)
        if kind == "flip" and i < len(buf):
            buf[i] ^= 1 << (val % 8)
        elif kind == "set" and i < len(buf):
            buf[i] = val % 256
        elif kind == "insert":
            buf[i:i] = bytes([val % 256]) * (1 + val % 7)
        elif kind == "delete":
            del buf[i:i + 1 + val % 7]
        elif kind == "truncate":
            del buf[i:]
    return bytes(buf)


edit = st.tuples(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]),
                 st.integers(0, 1 << 16), st.integers(0, 255))


@FUZZ
@given(seed=st.sampled_from(range(len(SEEDS))), edits=st.lists(edit, min_size=1, max_size=6))
def test_random_byte_mutations(tmp_path, seed, edits):
    _check(tmp_path, _mutate(SEEDS[seed], edits))


@FUZZ
@given(seed=st.sampled_from(range(len(SEEDS))),
       pos=st.integers(256, 1 << 14), edits=st.lists(edit, min_size=1, max_size=4))
def test_mutations_inside_modeldef_and_tables(tmp_path, seed, pos, edits):
    # aim the edits past the header, where the tables and the ModelDef live
    data = SEEDS[seed]
    shifted = [(k, 256 + (p + pos) % (len(data) - 256), v) for k, p, v in edits]
    _check(tmp_path, _mutate(data, shifted))


# header / table fields that hold sizes, counts and offsets, with hostile values
_FIELDS = [(76, "<I"), (156, "<I"), (184, "<Q"), (256, "<I"), (264, "<I"), (268, "<I"),
           (272, "<Q"), (280, "<Q"), (260, "<I"), (288, "<I")]


@FUZZ
@given(seed=st.sampled_from(range(len(SEEDS))), field=st.sampled_from(_FIELDS),
       value=st.one_of(st.sampled_from([0, 1, 2, 255, 256, 2 ** 31 - 1, 2 ** 32 - 1]),
                       st.integers(0, 2 ** 32 - 1)))
def test_hostile_size_fields(tmp_path, seed, field, value):
    off, fmt = field
    buf = bytearray(SEEDS[seed])
    if fmt == "<Q":
        value = value * 0x10001 & (2 ** 64 - 1)
    struct.pack_into(fmt, buf, off, value)
    _check(tmp_path, bytes(buf))


@pytest.mark.parametrize("seed", range(len(SEEDS)))
def test_every_truncation_point_of_the_header_and_tables(tmp_path, seed):
    data = SEEDS[seed]
    for cut in list(range(0, 420, 7)) + [len(data) - 1]:
        with pytest.raises(OmError):
            p = tmp_path / "cut.om"
            p.write_bytes(data[:cut])
            read_om(p)
