"""Per-recipe choices: every kernel variant a recipe may pick (streaming stores, tile depth, npd_tile3
r-chunk) and the plain numpy path write exactly the oracle's bytes; the tuner records a choice; small
calls bound to their buffers see new contents, refuse read-only outputs and never mix two callers'
buffers. The oracle is the independent one of ``test_formats_oracle.py``, vectorised (its offset
formulas are integer arithmetic, so they apply to index arrays)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from npu_deploy.converters import formats as F
from npu_deploy.converters.formats import _fastcopy
from tests.conftest import load_script
from tests.converters.formats.test_formats_oracle import ORACLES, random_array

pytestmark = pytest.mark.skipif(_fastcopy._kernel_fn() is None, reason="compiled copy kernel unavailable")

BENCHES = Path(__file__).resolve().parents[3] / "benchmarks"


def oracle_bytes(fmt, x, c0):
    storage, off = ORACLES[fmt][0](x.shape, c0)
    flat = np.zeros(int(np.prod(storage)), x.dtype)
    flat[off(*np.indices(x.shape))] = x
    return flat.reshape(storage)


# (format, logical shape, dtype): above the tuning threshold (1 MiB), aligned and ragged
CASES = [
    ("NC1HWC0", (2, 64, 64, 64), np.float16),
    ("NC1HWC0", (4, 19, 131, 129), np.float16),      # C padding, odd H*W
    ("NC1HWC0", (2, 64, 64, 128), np.int8),
    ("NC1HWC0", (2, 40, 64, 96), np.float32),
    ("FRACTAL_Z", (256, 256, 3, 3), np.float16),     # npd_tile3
    ("FRACTAL_Z", (300, 250, 3, 3), np.float16),     # N and C padding
    ("FRACTAL_Z", (256, 512, 3, 3), np.int8),
    ("FRACTAL_Z", (256, 128, 3, 3), np.float32),
    ("FRACTAL_Z", (512, 512, 2, 2), np.float16),     # H*W < 8: the staged walk's SSE2 blocks
    ("FRACTAL_Z", (320, 200, 5, 5), np.float32),     # H*W 25, C0 padding, ragged r-chunks
    ("FRACTAL_NZ", (1000, 600), np.float16),
    ("FRACTAL_NZ", (1024, 1024), np.int8),
]


def _recipe(kind, x_shape, dtype):
    for r in F._recipes.values():
        if r.unpack == (kind == "u") and r.in_shape == tuple(x_shape) and r.plan.dtype == np.dtype(dtype):
            return r
    raise AssertionError("no recipe")


@pytest.mark.parametrize("fmt,shape,dtype", CASES, ids=lambda v: str(v))
def test_every_variant_is_exact(fmt, shape, dtype):
    F._clear_recipes()
    x = random_array(np.random.default_rng(1), shape, dtype)
    c0 = F.default_c0(dtype)
    want = oracle_bytes(fmt, x, c0)
    got = F.pack(x, fmt)                             # the first call tunes (and leaves out complete)
    assert got.tobytes() == want.tobytes()
    back = F.unpack(got, fmt, shape)
    assert back.tobytes() == x.tobytes()
    for kind, src, res_shape, ref in (("p", x, want.shape, want), ("u", want, shape, x)):
        r = _recipe(kind, src.shape, dtype)
        assert r.choices, "a recipe above the threshold records its choice"
        win, times = r.choices[_fastcopy._threads()]
        assert win in times and all(t >= 0 for t in times.values())
        steps = F._program(r, 1)
        assert steps is not False
        seen = 0
        for nt, a_bytes, rc, staged in _fastcopy.VARIANTS:
            out = np.empty(res_shape, dtype)
            out.view(np.uint8).fill(0x5A)                # dirty: padding must be rewritten
            bufs = [src, out, *F._temps(r)] if r.views < len(r.plan.stages) - 1 else [src, out]
            F._replay(F._variant_steps(steps, nt, a_bytes, rc, staged), bufs, 1)
            assert out.tobytes() == ref.tobytes(), (kind, nt, a_bytes, rc, staged)
            seen += 1
        out = np.empty(res_shape, dtype)
        out.view(np.uint8).fill(0xA5)
        F._run_plain(r, src, out)
        assert out.tobytes() == ref.tobytes()
        assert seen == len(_fastcopy.VARIANTS)


def test_two_threads_tuned_exact():
    F._clear_recipes()
    x = random_array(np.random.default_rng(2), (4, 64, 64, 64), np.float16)
    want = oracle_bytes("NC1HWC0", x, 16)
    out = np.empty(want.shape, x.dtype)
    for _ in range(2):                                # tuning call, then the chosen program
        out.view(np.uint8).fill(0x11)
        F.pack(x, "NC1HWC0", out=out, threads=2)
        assert out.tobytes() == want.tobytes()
    assert 2 in _recipe("p", x.shape, x.dtype).choices


def test_tuning_off_keeps_recorded(monkeypatch):
    monkeypatch.setattr(F, "_TUNE", False)
    F._clear_recipes()
    x = random_array(np.random.default_rng(3), (2, 64, 64, 64), np.float16)
    assert F.pack(x, "NC1HWC0").tobytes() == oracle_bytes("NC1HWC0", x, 16).tobytes()
    assert not _recipe("p", x.shape, x.dtype).choices
    F._clear_recipes()


def test_small_bound_call_sees_new_contents_and_checks_out():
    F._clear_recipes()
    rng = np.random.default_rng(4)
    x = random_array(rng, (1, 64, 4, 8), np.float16)
    out = np.empty(F.storage_shape("NC1HWC0", x.shape, x.dtype), x.dtype)
    for _ in range(3):                               # bind, then repeat with new contents in place
        x[...] = random_array(rng, x.shape, x.dtype)
        out.view(np.uint8).fill(0x5A)
        assert F.pack(x, "NC1HWC0", out=out) is out
        assert out.tobytes() == oracle_bytes("NC1HWC0", x, 16).tobytes()
        back = np.empty_like(x)
        assert F.unpack(out, "NC1HWC0", x.shape, out=back) is back
        assert back.tobytes() == x.tobytes()
    assert _recipe("p", x.shape, x.dtype).last[1] in ("gather", "views")
    out.flags.writeable = False
    with pytest.raises(F.FormatError, match="read-only"):
        F.pack(x, "NC1HWC0", out=out)
    # a changed shape in place is a different call signature, never the bound runner
    y = random_array(rng, (2, 32, 4, 8), np.float16)
    o2 = np.empty(F.storage_shape("NC1HWC0", y.shape, y.dtype), y.dtype)
    F.pack(y, "NC1HWC0", out=o2)
    y.shape = (1, 64, 4, 8)
    o3 = np.empty(F.storage_shape("NC1HWC0", y.shape, y.dtype), y.dtype)
    F.pack(y, "NC1HWC0", out=o3)
    assert o3.tobytes() == oracle_bytes("NC1HWC0", y, 16).tobytes()
    F._clear_recipes()


def test_small_bound_calls_from_threads_do_not_mix_buffers():
    F._clear_recipes()
    errors = []

    def work(seed):
        rng = np.random.default_rng(seed)
        x = random_array(rng, (1, 32, 8, 8), np.float32)
        out = np.empty(F.storage_shape("NC1HWC0", x.shape, x.dtype), x.dtype)
        want = oracle_bytes("NC1HWC0", x, 16).tobytes()
        for _ in range(300):
            F.pack(x, "NC1HWC0", out=out)
            if out.tobytes() != want:
                errors.append(seed)
                return

    ts = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    F._clear_recipes()


@pytest.fixture(scope="module")
def bench():
    return load_script(BENCHES / "bench_formats.py")


def test_bench_check_flags_documented_figure_off(bench, tmp_path):
    row = {"part": "large", "fmt": "NC1HWC0", "dtype": "float16", "dir": "pack", "shape": (8, 64, 128, 128),
           "bytes": 16 << 20, "ratio": {"cpu1": 0.9, "noise": 0.03}, "met1": True, "load": 0.1}
    readme = tmp_path / "README-formats.md"
    readme.write_text("### Throughput (large tensors)\n\n| format | dtype | dir | size | copy GB/s | CPU |\n"
                      "|---|---|---|---|---|---|\n"
                      "| NC1HWC0 [8, 64, 128, 128] | float16 | pack | 16 MiB | 6.5 | 1.30 ± 0.04 |\n",
                      encoding="utf-8")
    doc = bench.documented(readme)
    assert doc == {("NC1HWC0 [8, 64, 128, 128]", "float16", "pack", "16 MiB"): (1.30, 0.04, 1.30, 1.30)}
    bad = bench.check([], [row], doc)
    assert len(bad) == 1 and "documents 1.30" in bad[0]
    row["ratio"]["cpu1"] = 1.25                       # within the noise and 15 %
    assert bench.check([], [row], doc) == []
    row["ratio"]["cpu1"], row["load"] = 1.0, 50.0     # 23 % off: only tolerated on a loaded host
    assert bench.check([], [row], doc) == []
    row["load"] = 0.1
    assert len(bench.check([], [row], doc)) == 1
    row["met1"], row["ratio"]["cpu1"] = False, 0.4
    assert any("target 0.60" in b for b in bench.check([], [row], {}))


def test_bench_check_holds_a_row_against_its_documented_runs(bench, tmp_path):
    """A row measured in several processes documents the runs' range; a new figure inside it (widened
    by the noise and 15 %) is not off, one below or above it is, and the table cell the script writes
    parses back to the same range."""
    row = {"part": "large", "fmt": "FRACTAL_Z", "dtype": "float16", "dir": "unpack", "shape": (1024, 896, 3, 3),
           "bytes": 16 << 20, "ratio": {"cpu1": 0.87, "noise": 0.05}, "met1": True, "load": 0.1,
           "runs": [0.87, 0.63, 1.10, 0.95]}
    cell = bench._cpu_cell(row)
    assert cell == "0.87 ± 0.05 (runs 0.63–1.10)"
    readme = tmp_path / "README-formats.md"
    readme.write_text("### Throughput (large tensors)\n\n| format | dtype | dir | size | copy GB/s | CPU |\n"
                      "|---|---|---|---|---|---|\n"
                      f"| FRACTAL_Z [1024, 896, 3, 3] | float16 | unpack | 16 MiB | 6.9 | {cell} |\n",
                      encoding="utf-8")
    doc = bench.documented(readme)
    assert doc[("FRACTAL_Z [1024, 896, 3, 3]", "float16", "unpack", "16 MiB")] == (0.87, 0.05, 0.63, 1.10)
    new = dict(row, runs=None)
    for x, off in ((0.62, False), (1.20, False), (0.50, True), (1.40, True)):
        new["ratio"] = {"cpu1": x, "noise": 0.03}
        assert bool(bench.check([], [new], doc)) is off, x
    assert "runs 0.63–1.10" in bench.check([], [dict(new, ratio={"cpu1": 0.4, "noise": 0.03})], doc)[-1]


def test_host_line():
    host = load_script(BENCHES / "_host.py")
    line = host.describe()
    assert "usable cores" in line and "load average" in line and "quiet?" in line
    assert host.is_quiet(0.5, 2) and not host.is_quiet(1.5, 2)


@pytest.mark.parametrize("fmt,shape,dtype", [("NC1HWC0", (1, 64, 16, 16), np.float32),
                                             ("NC1HWC0", (1, 19, 33, 31), np.float16),
                                             ("FRACTAL_Z", (64, 90, 3, 3), np.int8)])
def test_64k_bound_call_exact(fmt, shape, dtype):
    """Past the gather size a 64 KiB recipe binds its kernel program or the plain views instead."""
    F._clear_recipes()
    rng = np.random.default_rng(5)
    x = random_array(rng, shape, dtype)
    c0 = F.default_c0(dtype)
    out = np.empty(F.storage_shape(fmt, shape, dtype), dtype)
    back = np.empty_like(x)
    for _ in range(3):
        x[...] = random_array(rng, shape, dtype)
        out.view(np.uint8).fill(0x5A)
        back.view(np.uint8).fill(0xA5)
        F.pack(x, fmt, out=out)
        assert out.tobytes() == oracle_bytes(fmt, x, c0).tobytes()
        F.unpack(out, fmt, shape, out=back)
        assert back.tobytes() == x.tobytes()
    assert _recipe("p", x.shape, dtype).last[1] in ("gather", "views", "kernel")
    F._clear_recipes()


def test_layout_class_reuses_its_winner():
    """A second weight of the same class (format, direction, dtype, size within 2x, H*W) takes the
    first one's winner untimed, and is still exact."""
    F._clear_recipes()
    rng = np.random.default_rng(6)
    a = random_array(rng, (256, 256, 3, 3), np.float16)
    b = random_array(rng, (256, 272, 3, 3), np.float16)
    F.pack(a, "FRACTAL_Z")
    got = F.pack(b, "FRACTAL_Z")
    assert got.tobytes() == oracle_bytes("FRACTAL_Z", b, 16).tobytes()
    ra, rb = _recipe("p", a.shape, a.dtype), _recipe("p", b.shape, b.dtype)
    n = _fastcopy._threads()
    assert ra.choices[n][1] and rb.choices[n][1] == {}
    assert rb.choices[n][0] == ra.choices[n][0]
    F._clear_recipes()


def test_one_round_tuning_times_the_three_fastest_again(monkeypatch):
    """With a single timed round (tensors of 48 MiB and more), the three fastest candidates run once
    more before one is kept, so one disturbed timing cannot choose for every later call; the output
    is still exact."""
    F._clear_recipes()
    monkeypatch.setattr(F, "_TUNE_ROUNDS_BYTES", 1)          # one round whatever the size
    x = random_array(np.random.default_rng(3), (256, 256, 3, 3), np.float16)
    runs: dict[int, int] = {}
    orig_replay, orig_plain = F._replay, F._run_plain

    def replay(steps, bufs, n):
        runs[id(steps)] = runs.get(id(steps), 0) + 1
        return orig_replay(steps, bufs, n)

    def plain(r, x_, out):
        runs[-1] = runs.get(-1, 0) + 1
        return orig_plain(r, x_, out)

    monkeypatch.setattr(F, "_replay", replay)
    monkeypatch.setattr(F, "_run_plain", plain)
    got = F.pack(x, "FRACTAL_Z", threads=1)
    assert got.tobytes() == oracle_bytes("FRACTAL_Z", x, 16).tobytes()
    r = _recipe("p", x.shape, np.float16)
    win, times = r.choices[1]
    assert len(times) > 3
    # every candidate ran once in the round, the recorded program once more as the warm-up, the
    # winner once more at the end; three ran again: 3 + 1 + 1 extra runs in all
    assert sum(runs.values()) == len(times) + 3 + 1 + 1


def test_each_candidate_is_timed_straight_after_its_own_run(monkeypatch):
    """With several rounds (tensors under 48 MiB) every candidate runs twice in a row per round and
    only the second run is timed: it finds the output as a repeated call does (written by the same
    program), not with the lines the previous candidate left dirty in the caches, which made the
    tuner keep ordinary-store variants that ran at half the speed in use."""
    F._clear_recipes()
    monkeypatch.setattr(F, "_TUNE_BYTES", 1)                 # tune this small weight
    x = random_array(np.random.default_rng(4), (128, 128, 3, 3), np.float16)
    seq: list[int] = []
    orig_replay, orig_plain = F._replay, F._run_plain

    def replay(steps, bufs, n):
        seq.append(id(steps))
        return orig_replay(steps, bufs, n)

    def plain(r, x_, out):
        seq.append(-1)
        return orig_plain(r, x_, out)

    monkeypatch.setattr(F, "_replay", replay)
    monkeypatch.setattr(F, "_run_plain", plain)
    got = F.pack(x, "FRACTAL_Z", threads=1)
    assert got.tobytes() == oracle_bytes("FRACTAL_Z", x, 16).tobytes()
    win, times = _recipe("p", x.shape, np.float16).choices[1]
    rounds = 3                                                # 288 KiB: the most rounds
    body = seq[1:-1]                                          # without the warm-up and the final run
    assert len(body) == 2 * rounds * len(times)
    pairs = list(zip(body[::2], body[1::2]))
    assert all(a == b for a, b in pairs)                      # each timed run follows its own
    assert len({a for a, _ in pairs[:len(times)]}) == len(times)   # every candidate in a round
    F._clear_recipes()
