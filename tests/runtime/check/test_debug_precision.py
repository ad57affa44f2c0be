"""``debug precision``: the search for ops to keep in float32 (runtime/check/precision.py).

Real material: the onnx wheel's light CNNs, whose all-ones weights drive activations to ~1e31, so
that ``force_fp16`` gives NaN. The oracle is the product's public path, run here on its own: convert
with the found ``keep_dtype`` and ``npu_deploy.compare`` against onnxruntime on *other* inputs than
the search used; and dropping an op from the list (converted and compared the same way) fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

import npu_deploy
from npu_deploy.errors import InputError
from npu_deploy.runtime.check.precision import PrecisionResult, PrecisionSearch, precision_search

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
SQUEEZENET = LIGHT / "light_squeezenet.onnx"


def compare_with_keep(tmp_path: Path, model: Path, keep, seed: int):
    out = tmp_path / f"k{len(keep)}-{seed}.bundle"
    npu_deploy.convert(model, out, backend="builtin", precision_mode="force_fp16", keep_dtype=list(keep))
    try:
        return npu_deploy.compare(model, out, seed=seed)
    finally:
        out.unlink()


@pytest.fixture(scope="module")
def squeezenet_result():
    return precision_search(SQUEEZENET, mode="force_fp16", cosine=0.999)


@pytest.mark.slow
def test_light_cnn_overflows_fp16_and_the_keep_list_fixes_it(squeezenet_result, tmp_path):
    res = squeezenet_result
    assert res.baseline_cosine is None            # NaN outputs under force_fp16: nothing to compare
    assert res and res.reached and res.complete
    assert 0 < len(res.keep) < res.candidates     # a subset, not everything
    assert res.cosine >= 0.999
    before = compare_with_keep(tmp_path, SQUEEZENET, [], seed=3)
    assert not before
    after = compare_with_keep(tmp_path, SQUEEZENET, res.keep, seed=3)   # inputs the search never saw
    assert after, after.verdict()
    assert res.est_us >= res.baseline_est_us > 0  # float32 ops cost time in the model
    assert res.verdict().startswith("PASS") and f"{len(res.keep)} of {res.candidates}" in res.verdict()


@pytest.mark.slow
def test_greedy_prune_leaves_no_removable_op(squeezenet_result, tmp_path):
    keep = squeezenet_result.keep
    for k in sorted({0, len(keep) // 2, len(keep) - 1}):
        fewer = keep[:k] + keep[k + 1:]
        assert not compare_with_keep(tmp_path, SQUEEZENET, fewer, seed=0), f"{keep[k]} was removable"


@pytest.mark.slow
def test_trace_and_cfg_file(squeezenet_result, tmp_path):
    res = squeezenet_result
    phases = [t["phase"] for t in res.trace]
    assert phases[:2] == ["baseline", "all float32"]
    assert any(p.startswith("bisect") for p in phases) and any(p.startswith("prune") for p in phases)
    cfg = tmp_path / "keep_dtype.cfg"
    res.write_cfg(cfg)
    lines = cfg.read_text().splitlines()
    assert lines == res.keep
    back = PrecisionResult.load(res.to_json())
    assert back.keep == res.keep and back.trace == json.loads(res.to_json())["trace"]
    assert res.backend == back.backend == "emulator"
    # the file's nodes are unnamed: the names are npu-deploy's, and the result says ATC needs them in the model
    assert "" in {n.name for n in onnx.load(SQUEEZENET).graph.node}
    assert any("no unique name" in n for n in res.notes)


@pytest.mark.slow
def test_by_type_keeps_op_types(tmp_path):
    res = precision_search(SQUEEZENET, by_type=True)
    assert res and res.keep and all(k.startswith("OpType::") for k in res.keep)
    assert compare_with_keep(tmp_path, SQUEEZENET, res.keep, seed=2)


@pytest.mark.slow
def test_interrupted_search_resumes_from_its_checkpoint(tmp_path):
    ck = tmp_path / "search.json"
    seen = []

    def stop_at_six(text):
        seen.append(text)
        if len(seen) == 6:
            raise KeyboardInterrupt

    s = PrecisionSearch(SQUEEZENET, checkpoint=ck, progress=stop_at_six)
    with pytest.raises(KeyboardInterrupt):
        s.run()
    partial = s.result(complete=False)
    s.close()
    assert not partial.complete and len(partial.trace) == 6
    saved = json.loads(ck.read_text())
    assert len(saved["evaluations"]) == 6

    s2 = PrecisionSearch(SQUEEZENET, checkpoint=ck)
    runs = []
    real_run = s2._run
    s2._run = lambda keep: runs.append(keep) or real_run(keep)
    res = s2.run()
    s2.close()
    assert any("resumed" in n for n in res.notes)
    assert len(runs) == res.evaluations - 6       # the six saved evaluations were not run again
    fresh = precision_search(SQUEEZENET)
    assert res.keep == fresh.keep


def test_checkpoint_of_another_search_is_not_reused(tmp_path):
    ck = tmp_path / "search.json"
    s = PrecisionSearch(SQUEEZENET, checkpoint=ck)
    s.evaluate([], "baseline")
    s.close()
    other = PrecisionSearch(SQUEEZENET, checkpoint=ck, seed=1)
    assert not other.cache and any("another model" in n for n in other.notes)
    other.close()


def test_bad_targets_are_input_errors():
    with pytest.raises(InputError, match="not both"):
        PrecisionSearch(SQUEEZENET, cosine=0.99, max_abs=1e-3)
    with pytest.raises(InputError, match="between -1 and 1"):
        PrecisionSearch(SQUEEZENET, cosine=2.0)
    with pytest.raises(InputError, match="cannot be searched"):
        PrecisionSearch(SQUEEZENET, mode="must_keep_origin_dtype")


@pytest.mark.slow
def test_several_samples_in_one_npz_all_judge_the_keep_list(tmp_path):
    import numpy as np

    from npu_deploy.runtime.check.precision import load_samples

    rng = np.random.default_rng(11)
    p = tmp_path / "samples.npz"
    from npu_deploy.runtime.check.compare import OnnxruntimeReference

    name = OnnxruntimeReference(SQUEEZENET).get_inputs()[0].name   # the first graph input is a weight
    np.savez(p, **{f"{name}@{k}": rng.random((1, 3, 224, 224), dtype=np.float32) for k in range(2)})
    samples = load_samples([p])
    assert len(samples) == 2 and set(samples[0]) == {name}
    res = precision_search(SQUEEZENET, samples=samples)
    assert res.samples == 2 and res


@pytest.mark.slow
def test_same_inputs_same_keep_list_whatever_the_host_threads(squeezenet_result, tmp_path, monkeypatch):
    """The search's result for the same model, inputs and target does not move run to run: a second run,
    with Python's hash seed and onnxruntime's default thread count changed under it (a host with other
    cores, or another load), keeps the same ops and reaches the same errors step by step."""
    import subprocess
    import sys

    # one CPU for the child (onnxruntime sizes its default pool by the CPUs it may use; here 2)
    code = ("import json, os, sys; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]}); "
            "from npu_deploy.runtime.check.precision import precision_search; "
            f"r = precision_search({str(SQUEEZENET)!r}, mode='force_fp16', cosine=0.999); "
            "json.dump({'keep': r.keep, 'trace': [(t['kept'], t['cosine'], t['max_abs']) for t in r.trace]}, "
            "sys.stdout)")
    env = {**__import__("os").environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600,
                         cwd=str(Path(__file__).resolve().parents[3]))
    assert out.returncode == 0, out.stderr[-2000:]
    other = json.loads(out.stdout)
    first = squeezenet_result
    assert other["keep"] == first.keep and first.keep
    assert other["trace"] == [[t["kept"], t["cosine"], t["max_abs"]] for t in first.trace]
