"""Batch inference on Ray (npu_deploy.distributed): one local Ray cluster declaring 2 NPUs for the module.

The oracle for every output is an in-process InferenceSession on the same bundle (results must be
identical, in input order), and for the tiny model also the arithmetic itself (relu(x + w) in fp16).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

ray = pytest.importorskip("ray", reason="needs Ray: pip install -e '.[ray]'")

import npu_deploy  # noqa: E402
from npu_deploy.distributed import BatchResult, run_batch  # noqa: E402
from npu_deploy.errors import ExternalError, InputError, ModelError  # noqa: E402
from npu_deploy import _ray as R  # noqa: E402
from npu_deploy.runtime import distributed as D  # noqa: E402
from npu_deploy.runtime.distributed import _driver, _results, _ring, _samples as S  # noqa: E402
from tests.fullfs import full_fs  # noqa: E402,F401  (fixture)

NPUS = 2
STANDINS = Path(__file__).resolve().parents[1] / "standins"
W = np.arange(8, dtype=np.float32).reshape(1, 8) - 3.0


@pytest.fixture(scope="module")
def cluster():
    """One local Ray cluster for the whole module (start-up costs seconds: never per test)."""
    R.quiet_ray_logs()
    # the actors see the ACL stand-in as `acl` (only an .om model imports it): the device path's test
    path = os.pathsep.join(p for p in (str(STANDINS), os.environ.get("PYTHONPATH", "")) if p)
    ray.init(resources={"NPU": NPUS}, num_cpus=2, include_dashboard=False, logging_level="ERROR",
             log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": path}})
    try:
        yield
    finally:
        ray.shutdown()


def _tiny_onnx(path, n_inputs=1):
    ins = [helper.make_tensor_value_info(f"x{i}" if n_inputs > 1 else "x", TensorProto.FLOAT, [1, 8])
           for i in range(n_inputs)]
    nodes, last = [], ins[0].name
    for i, vi in enumerate(ins[1:]):
        nodes.append(helper.make_node("Add", [last, vi.name], [f"s{i}"]))
        last = f"s{i}"
    nodes += [helper.make_node("Add", [last, "w"], ["t"]), helper.make_node("Relu", ["t"], ["y"])]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])]
    g = helper.make_graph(nodes, "tiny", ins, outs, [numpy_helper.from_array(W, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    onnx_path = _tiny_onnx(d / "tiny.onnx")
    bundle = d / "tiny.bundle"
    npu_deploy.convert(str(onnx_path), output=str(bundle), backend="builtin", precision_mode="must_keep_origin_dtype")
    return bundle


def _single_session(bundle, xs):
    with npu_deploy.InferenceSession(bundle) as s:
        name = s.get_inputs()[0].name
        return [s.run(None, {name: x})[0] for x in xs]


def _samples(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, 8)).astype(np.float32) for _ in range(n)]


def test_iterable_results_in_order_and_identical_to_one_session(cluster, tiny):
    xs = _samples(300)
    got = []
    r = run_batch(tiny, xs, npus=NPUS, on_result=lambda sid, outs: got.append((sid, outs[0])), progress=False)
    assert r and r.ok == 300 and r.samples == 300 and not r.failures
    assert [sid for sid, _ in got] == [f"{i:06d}" for i in range(300)]
    ref = _single_session(tiny, xs)
    for (_, y), want, x in zip(got, ref, xs):
        np.testing.assert_array_equal(y, want)
        np.testing.assert_allclose(y, np.maximum(x + W, 0), atol=1e-6)
    # both NPUs took work, and the summary accounts for every sample
    assert len(r.workers) == NPUS and all(w.samples > 0 for w in r.workers)
    assert sum(w.samples for w in r.workers) == 300
    assert sorted(w.device for w in r.workers) == ["0", "1"]
    assert all(w.latency is not None and w.latency.p50_ms <= w.latency.p99_ms for w in r.workers)
    back = BatchResult.load(json.loads(r.to_json()))
    assert back.workers[0].latency.count == r.workers[0].latency.count and back.verdict() == r.verdict()


def test_folder_bad_samples_are_reported_by_id_and_the_rest_written(cluster, tiny, tmp_path):
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    xs = _samples(12, seed=1)
    for i, x in enumerate(xs):
        np.save(src / f"s{i:03d}.npy", x)
    (src / "s004.npy").write_bytes(b"\x93NUMPY garbage")             # not a readable .npy
    np.save(src / "s007.npy", np.zeros((2, 8), np.float32))         # wrong shape: fails in the actor
    np.savez(src / "s100.npz", x=xs[0])                               # one-member .npz for a one-input model
    (src / "notes.txt").write_text("not a sample")
    r = run_batch(tiny, src, npus=NPUS, output=out, progress=False)
    assert not r
    assert [f.id for f in r.failures] == ["s004.npy", "s007.npy"]
    assert "s004.npy" not in r.failures[1].error and ".npy" in r.failures[0].error
    assert "notes.txt" in r.warnings[0]
    written = sorted(p.name for p in out.iterdir())
    assert written == sorted([f"s{i:03d}.npy" for i in range(12) if i not in (4, 7)] + ["s100.npy"])
    ref = _single_session(tiny, xs)
    for i in (0, 3, 11):
        np.testing.assert_array_equal(np.load(out / f"s{i:03d}.npy"), ref[i])
    np.testing.assert_array_equal(np.load(out / "s100.npy"), ref[0])
    assert not list(out.glob(".*.part"))


def _refuse(what):
    def refuse(*args, **kwargs):
        raise AssertionError(what)
    return refuse


def test_a_folder_gives_the_same_files_whether_the_actors_share_the_file_system_or_not(cluster, tiny, tmp_path,
                                                                                      monkeypatch):
    src = tmp_path / "in"
    src.mkdir()
    xs = _samples(40, seed=4)
    for i, x in enumerate(xs):
        np.save(src / f"s{i:03d}.npy", x)
    (src / "a.npy").write_bytes(b"\x93NUMPY garbage")             # fails; its output name stays taken
    np.savez(src / "a.npz", x=xs[7])                                # so this one's output is a_2.npy
    np.save(src / "s005.npy", np.zeros((2, 8), np.float32))        # fails in the run
    # actors on this host read the samples and write the outputs: the driver does neither
    with monkeypatch.context() as m:
        m.setattr(S, "_feeds_from_file", _refuse("the driver read a sample"))
        m.setattr(D._Writer, "write", _refuse("the driver wrote an output"))
        shared = run_batch(tiny, src, npus=NPUS, output=tmp_path / "shared", progress=False)
    # actors that do not see these files (another host): the driver reads and writes, through Ray
    monkeypatch.setattr(_driver, "_shares_files", lambda ray, infos, probes, address: [False] * len(infos))
    apart = run_batch(tiny, src, npus=NPUS, output=tmp_path / "apart", progress=False)
    assert [f.id for f in shared.failures] == ["a.npy", "s005.npy"]
    assert [(f.id, f.error) for f in shared.failures] == [(f.id, f.error) for f in apart.failures]
    names = sorted(p.name for p in (tmp_path / "shared").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "apart").iterdir())
    assert names == sorted(["a_2.npy"] + [f"s{i:03d}.npy" for i in range(40) if i != 5])
    for name in names:
        assert (tmp_path / "shared" / name).read_bytes() == (tmp_path / "apart" / name).read_bytes(), name
    ref = _single_session(tiny, xs)
    np.testing.assert_array_equal(np.load(tmp_path / "shared" / "a_2.npy"), ref[7])
    for i in (0, 6, 39):
        np.testing.assert_array_equal(np.load(tmp_path / "shared" / f"s{i:03d}.npy"), ref[i])
    assert shared.ok == apart.ok == 40 and sum(w.samples for w in shared.workers) == 40


_OUR_RINGS: set[str] = set()  # names of the segments the driver's _Ring created in this process
_real_ring_init = _ring._Ring.__init__


def _recording_ring_init(self, *args, **kwargs):
    _real_ring_init(self, *args, **kwargs)
    _OUR_RINGS.add(self.name.lstrip("/"))


_ring._Ring.__init__ = _recording_ring_init


def _shm_segments():
    """The driver's shared memory segments still in /dev/shm (on a shared machine other processes'
    segments come and go on their own)."""
    return {n for n in os.listdir("/dev/shm") if n in _OUR_RINGS} if os.path.isdir("/dev/shm") else set()


def test_samples_in_shared_memory_and_through_ray_give_the_same_results(cluster, tiny, monkeypatch):
    xs = _samples(200, seed=5)
    xs[50] = np.zeros((100, 8), np.float32)     # larger than a slot: its chunk goes through Ray (and fails)
    xs[120] = xs[120].astype(np.float64)         # fits, and is refused by the session as in-process
    put = []
    real_put = D._Ring.put
    monkeypatch.setattr(D._Ring, "put", lambda self, feeds: put.append(1) or real_put(self, feeds))
    before = _shm_segments()
    got_shm = {}
    shm = run_batch(tiny, xs, npus=NPUS, chunk=10, on_result=lambda sid, outs: got_shm.__setitem__(sid, outs[0]),
                    progress=False)
    assert len(put) == 191  # every sample went through the shared memory, bar the rest of the large one's chunk
    assert _shm_segments() == before  # and it is gone after the run
    monkeypatch.setattr(D._Ring, "for_samples", classmethod(lambda cls, slots, nbytes: None))
    got_ray = {}
    via_ray = run_batch(tiny, xs, npus=NPUS, chunk=10,
                        on_result=lambda sid, outs: got_ray.__setitem__(sid, outs[0]), progress=False)
    assert [(f.id, f.error) for f in shm.failures] == [(f.id, f.error) for f in via_ray.failures]
    assert [f.id for f in shm.failures] == ["000050", "000120"]
    assert "float64" in shm.failures[1].error
    assert got_shm.keys() == got_ray.keys() and len(got_shm) == shm.ok
    ref = _single_session(tiny, [x for i, x in enumerate(xs) if f"{i:06d}" in got_shm])
    for (sid, y), want in zip(sorted(got_shm.items()), ref):
        np.testing.assert_array_equal(y, want)
        np.testing.assert_array_equal(got_ray[sid], want)


def test_an_actor_that_cannot_see_the_shared_memory_gets_the_arrays_through_ray(cluster, tiny, monkeypatch):
    # as an actor restarted on another node: the segment the chunks name is not there for it
    real_init = D._Ring.__init__

    def init(self, slots, slot_bytes):
        real_init(self, slots, slot_bytes)
        self.name = f"npu-deploy-test-absent-{os.getpid()}"
    monkeypatch.setattr(D._Ring, "__init__", init)
    xs = _samples(100, seed=6)
    got = {}
    before = _shm_segments()
    r = run_batch(tiny, xs, npus=NPUS, chunk=10, on_result=lambda sid, outs: got.__setitem__(sid, outs[0]),
                  progress=False)
    assert r and r.ok == 100 and _shm_segments() == before
    for i, want in enumerate(_single_session(tiny, xs)):
        np.testing.assert_array_equal(got[f"{i:06d}"], want)


def test_no_shared_memory_where_dev_shm_is_too_small(monkeypatch):
    class Small:
        f_bavail, f_frsize = 100, 4096  # 400 KB free, as in a container with a tiny /dev/shm
    monkeypatch.setattr(_ring.os, "statvfs", lambda path: Small())
    assert D._Ring.for_samples(600, 110_592) is None
    monkeypatch.undo()
    if os.path.isdir("/dev/shm") and os.statvfs("/dev/shm").f_bavail * os.statvfs("/dev/shm").f_frsize > 64 << 20:
        ring = D._Ring.for_samples(8, 1000)
        try:
            slot, places = ring.put({"x": np.arange(250, dtype=np.float32)})
            assert ring.put({"x": np.zeros(2000, np.float32)}) is None  # larger than a slot
            assert ring.put({"x": np.array(["a"], dtype=object)}) is None
            offset, shape, dtype = places["x"]
            back = np.ndarray(shape, np.dtype(dtype), buffer=ring.shm.buf, offset=offset)
            np.testing.assert_array_equal(back, np.arange(250, dtype=np.float32))
            del back
        finally:
            ring.close()


def test_in_flight_is_bounded(cluster, tiny):
    pulled = [0]
    worst = [0]
    delivered = [0]

    def source():
        for x in _samples(200, seed=2):
            pulled[0] += 1
            yield x

    def seen(sid, outs):
        delivered[0] += 1
        worst[0] = max(worst[0], pulled[0] - delivered[0])

    r = run_batch(tiny, source(), npus=NPUS, max_in_flight=5, on_result=seen, progress=False)
    assert r.ok == 200 and r.max_in_flight == 5
    assert 1 <= worst[0] <= 5  # never more than the window read and not yet delivered


@pytest.mark.parametrize("where", ["memory", "folder"])
def test_a_killed_actor_is_restarted_and_its_samples_retried(cluster, tiny, tmp_path, where):
    # small chunks and a slow enough stream: the killed actor still has samples to run after its death,
    # which the restarted actor serves (and reports as restarted). Every live worker actor is killed:
    # actors of earlier runs in this module may still be listed, and killing them changes nothing here.
    # "folder": the actors read the samples and write the outputs themselves (they share this host).
    n = 1200
    xs = _samples(n, seed=3)
    killed = []

    def progress(done, total, failed):
        if done >= 40 and not killed:
            names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                     if a["name"].startswith(D.WORKER_PREFIX)]
            for name in names:
                try:
                    ray.kill(ray.get_actor(name), no_restart=False)
                except ValueError:  # already gone
                    continue
                killed.append(name)
            time.sleep(0.2)  # let the deaths land while samples are in flight on them

    got = {}
    segments = _shm_segments()
    if where == "memory":
        r = run_batch(tiny, xs, npus=NPUS, chunk=4, max_in_flight=16,
                      on_result=lambda sid, outs: got.__setitem__(sid, outs[0]), progress=progress)
    else:
        src, out = tmp_path / "in", tmp_path / "out"
        src.mkdir()
        for i, x in enumerate(xs):
            np.save(src / f"{i:06d}.npy", x)
        r = run_batch(tiny, src, npus=NPUS, chunk=4, max_in_flight=16, output=out, progress=progress)
        got = {p.stem: np.load(p) for p in out.iterdir()}
        assert not list(out.glob(".*.part"))
    assert killed
    assert r and r.ok == n, r.failures[:3]
    assert _shm_segments() == segments
    assert any(w.restarted for w in r.workers)
    ref = _single_session(tiny, xs)
    assert len(got) == n
    for i in range(n):
        np.testing.assert_array_equal(got[f"{i:06d}"], ref[i])


def test_asking_for_more_npus_than_the_cluster_has_says_how_many(cluster, tiny):
    with pytest.raises(InputError, match=r"has 2 NPUs"):
        run_batch(tiny, _samples(2), npus=5, progress=False)


def test_an_address_that_does_not_answer_is_an_environment_error(tiny):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(ExternalError, match="does not answer") as e:
        run_batch(tiny, _samples(1), npus=1, address=f"127.0.0.1:{port}")
    assert e.value.exit_code == 3
    assert time.monotonic() - t0 < R.connect_timeout() + 5  # bounded, not Ray's minute-long retries


def test_bad_model_and_bad_options_are_input_errors(cluster, tiny, tmp_path):
    onnx_path = _tiny_onnx(tmp_path / "m.onnx")
    with pytest.raises(ModelError, match="convert it first"):
        run_batch(onnx_path, _samples(1), npus=1)
    with pytest.raises(InputError, match="must be at least 1"):
        run_batch(tiny, _samples(1), npus=0)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="no .npy or .npz"):
        run_batch(tiny, empty, npus=1)
    with pytest.raises(InputError, match="is the input folder"):
        run_batch(tiny, empty, npus=1, output=empty)


def test_npz_members_feed_a_multi_input_model(cluster, tmp_path):
    bundle = tmp_path / "two.bundle"
    npu_deploy.convert(str(_tiny_onnx(tmp_path / "two.onnx", n_inputs=2)), output=str(bundle),
                       backend="builtin", precision_mode="must_keep_origin_dtype")
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    a, b = _samples(2, seed=4)
    np.savez(src / "good.npz", x0=a, x1=b)
    np.savez(src / "wrong.npz", x0=a, z=b)
    np.save(src / "single.npy", a)
    r = run_batch(bundle, src, npus=NPUS, output=out, progress=False)
    assert sorted(f.id for f in r.failures) == ["single.npy", "wrong.npz"]
    assert "x1" in next(f.error for f in r.failures if f.id == "wrong.npz")
    np.testing.assert_allclose(np.load(out / "good.npy"), np.maximum(a + b + W, 0), atol=1e-6)


def test_cli_run_npus_writes_one_file_per_sample(cluster, tiny, tmp_path, run_cli):
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    xs = _samples(6, seed=5)
    for i, x in enumerate(xs):
        np.save(src / f"{i}.npy", x)
    code, stdout, stderr = run_cli("run", tiny, "--input-dir", src, "--output", out, "--npus", "2",
                                   "--json", tmp_path / "batch.json")
    assert code == 0, stderr
    assert "6 samples on 2 NPUs (3/3)" in stdout.strip().splitlines()[-1]
    ref = _single_session(tiny, xs)
    for i in range(6):
        np.testing.assert_array_equal(np.load(out / f"{i}.npy"), ref[i])
    assert json.loads((tmp_path / "batch.json").read_text())["ok"] is True
    code, _, stderr = run_cli("run", tiny, "--input-dir", src, "--output", tmp_path / "o2", "--npus", "9")
    assert code == 2 and "has 2 NPUs" in stderr and len(stderr.strip().splitlines()) == 1
    code, _, stderr = run_cli("run", tiny, "--npus", "2")
    assert code == 2 and "--input-dir" in stderr
    code, _, stderr = run_cli("run", tiny, "--npus", "2", "--input-dir", src, "--input", src / "0.npy")
    assert code == 2 and "--input is for one run" in stderr


def test_device_id_follows_the_visibility_variable():
    assert D.device_id_for([], {}) == 0
    assert D.device_id_for(["5"], {"ASCEND_RT_VISIBLE_DEVICES": "5"}) == 0
    assert D.device_id_for(["5"], {"ASCEND_RT_VISIBLE_DEVICES": "4,5"}) == 1
    assert D.device_id_for(["5"], {"ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
                                   "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES": "1"}) == 5


@pytest.mark.realmodel
@pytest.mark.slow
def test_ppocr_cls_over_two_npus_matches_one_session(cluster, real_model, tmp_path):
    bundle = tmp_path / "cls.bundle"
    npu_deploy.convert(str(real_model("ppocr_cls")), output=str(bundle), backend="builtin",
                       input_shapes={"x": (1, 3, 48, 192)})
    rng = np.random.default_rng(6)
    xs = [rng.standard_normal((1, 3, 48, 192)).astype(np.float32) * 0.5 for _ in range(16)]
    got = {}
    r = run_batch(bundle, xs, npus=NPUS, threads=1, on_result=lambda sid, o: got.__setitem__(sid, o),
                  progress=False)
    assert r and r.ok == 16
    with npu_deploy.InferenceSession(bundle) as s:
        for i, x in enumerate(xs):
            for a, b in zip(got[f"{i:06d}"], s.run(None, {"x": x})):
                np.testing.assert_array_equal(a, b)


def test_cluster_profiles_parsed_as_ray_tasks_match_the_process_pool(cluster, tmp_path):
    from npu_deploy.profiling.cluster import analyze_cluster
    from tests.profiling.helpers import op, td, write_csv

    for r in range(3):
        rows = [op(f"Conv_{i}", "Conv2D", "AI_CORE", "100.0") for i in range(10)]
        rows += [td(f"td_{i}", "NCHW", "NC1HWC0", "1,64,56,56", "1,4,56,56,16", f"{5.0 * (r + 1):.1f}")
                 for i in range(3)]
        write_csv(tmp_path / f"rank_{r}_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv", rows,
                  style="kernel_details")
    (tmp_path / "rank_3_ascend_pt").mkdir()
    on_ray = analyze_cluster(tmp_path, address="auto")
    local = analyze_cluster(tmp_path, workers=1)
    assert on_ray.executor == "Ray at auto"
    key = lambda rep: [(r.rank, r.ok, r.compute_us, r.formattrans_pct) for r in rep.ranks]  # noqa: E731
    assert key(on_ray) == key(local)
    assert on_ray.ranks[1].formattrans_pct == pytest.approx(100 * 30.0 / 1030.0)
    assert on_ray.slowest_rank == "rank_2_ascend_pt" and not on_ray.ranks[3].ok


def test_latency_summary_is_exact_where_it_can_be_and_bounded_in_memory(monkeypatch):
    from npu_deploy.runtime.bench import latency_stats

    xs = list(np.random.default_rng(7).exponential(0.002, 5000))
    full = D._Latencies(seed=0)
    for x in xs:
        full.add(x)
    want = latency_stats(xs)
    got = full.stats()
    for f in ("count", "min_ms", "max_ms", "p50_ms", "p99_ms"):
        assert getattr(got, f) == pytest.approx(getattr(want, f)), f
    monkeypatch.setattr(_results, "LATENCY_SAMPLE", 500)
    small = D._Latencies(seed=0)
    for x in xs:
        small.add(x)
    s = small.stats()
    assert len(small.sample) == 500
    assert s.count == 5000 and s.mean_ms == pytest.approx(want.mean_ms) and s.max_ms == pytest.approx(want.max_ms)
    assert s.p50_ms == pytest.approx(want.p50_ms, rel=0.2)  # a uniform sample of the runs


def test_a_model_the_workers_cannot_open_is_one_clear_error(cluster, tiny, tmp_path):
    broken = tmp_path / "broken.bundle"
    broken.write_bytes(tiny.read_bytes()[:200])  # the bundle's magic, then nothing
    with pytest.raises((npu_deploy.BundleError, ExternalError)) as e:
        run_batch(broken, _samples(2), npus=NPUS, progress=False)
    assert "\n" not in str(e.value) and "broken.bundle" in str(e.value)
    assert not [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(D.WORKER_PREFIX)]


def test_an_om_runs_through_acl_on_each_actors_device_stand_in_only(cluster, tmp_path):
    """The device path, verified against the ACL stand-in only (tests/standins/acl), not on hardware: each
    actor opens the .om on the device Ray gave it (logical 0 behind ASCEND_RT_VISIBLE_DEVICES)."""
    from tests.standins.omfile import build_om, tensor

    om = build_om(tmp_path / "m.om", inputs=[tensor("x", "float32", [2, 4], "ND")],
                  outputs=[tensor("y", "uint8", [16], "ND")])
    rng = np.random.default_rng(8)
    xs = [rng.standard_normal((2, 4)).astype(np.float32) for _ in range(10)]
    got = {}
    r = run_batch(om, xs, npus=NPUS, on_result=lambda sid, o: got.__setitem__(sid, o[0]), progress=False)
    assert r and r.backend == "acl" and sorted(w.device for w in r.workers) == ["0", "1"]
    for i, x in enumerate(xs):  # the stand-in's documented output: byte k = (7k + sum(input bytes) % 251) % 127
        s = sum(np.ascontiguousarray(x).tobytes()) % 251
        np.testing.assert_array_equal(got[f"{i:06d}"], [(7 * k + s) % 127 for k in range(16)])


def test_progress_bar_only_when_asked_or_on_a_terminal(cluster, tiny, capsys):
    run_batch(tiny, _samples(20), npus=NPUS, progress=None)  # stderr is captured here: not a terminal
    assert capsys.readouterr().err == ""
    run_batch(tiny, _samples(20), npus=NPUS, progress=True)
    err = capsys.readouterr().err
    assert err.endswith("\n") and "20/20" in err and "/s on 2 NPUs" in err


@pytest.mark.slow
def test_an_address_where_something_else_listens_fails_in_bounded_time_in_one_line(tiny, tmp_path):
    import socket
    import subprocess
    import sys

    src = tmp_path / "in"
    src.mkdir()
    np.save(src / "a.npy", _samples(1)[0])
    with socket.socket() as s:  # accepts connections (the kernel's backlog) but speaks no Ray
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        port = s.getsockname()[1]
        env = dict(os.environ, NPU_DEPLOY_RAY_TIMEOUT="5")
        proc = subprocess.run([sys.executable, "-m", "npu_deploy.cli.main", "run", str(tiny), "--input-dir", str(src),
                               "--output", str(tmp_path / "out"), "--ray-address", f"127.0.0.1:{port}"],
                              capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 3, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "not as Ray within 5 s" in lines[0], lines[:3]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("shared", [True, False], ids=["written-by-the-actors", "written-here"])
def test_a_full_output_disk_stops_the_run_with_one_exit_3_error_and_no_partial_file(cluster, tiny, tmp_path,
                                                                                   full_fs, monkeypatch, shared):
    from npu_deploy.errors import OutputError

    src = tmp_path / "in"
    src.mkdir()
    for i, x in enumerate(_samples(64, seed=8)):
        np.save(src / f"s{i:03d}.npy", x)
    if shared:
        monkeypatch.setattr(D._Writer, "write", _refuse("the driver wrote an output"))
    else:
        monkeypatch.setattr(_driver, "_shares_files", lambda ray, infos, probes, address: [False] * len(infos))
    before = sorted(p.name for p in full_fs.iterdir())
    with pytest.raises(OutputError, match="No space left on device") as ei:
        run_batch(tiny, src, npus=NPUS, output=full_fs, progress=False)
    assert ei.value.exit_code == 3
    assert sorted(p.name for p in full_fs.iterdir()) == before  # not one .npy, not one .part


def test_two_npus_share_even_a_small_batch_and_the_split_is_reported(cluster, tiny):
    xs = _samples(16, seed=9)
    r = run_batch(tiny, xs, npus=NPUS, progress=False)
    assert r and [w.samples for w in r.workers] == [8, 8], r.table()
    assert "16 samples on 2 NPUs (8/8)" in r.verdict()
    r = run_batch(tiny, _samples(200, seed=10), npus=NPUS, progress=False)
    assert sorted(w.samples for w in r.workers) == [100, 100], r.table()


def test_a_pool_reuses_its_live_actors_and_reports_what_the_caller_waited(cluster, tiny, tmp_path):
    xs, more = _samples(120, seed=11), _samples(90, seed=12)
    with D.NpuPool(tiny, npus=NPUS) as pool:
        assert pool.size == 0  # nothing starts before the first run
        first = pool.run_batch(xs, progress=False)
        got = []
        again = pool.run_batch(more, on_result=lambda sid, outs: got.append(outs[0]), progress=False)
        src, out = tmp_path / "in", tmp_path / "out"
        src.mkdir()
        for i, x in enumerate(xs[:10]):
            np.save(src / f"{i:06d}.npy", x)
        folder = pool.run_batch(src, output=out, progress=False)
        assert pool.size == NPUS
    assert first and again and folder and first.ok == 120 and again.ok == 90 and folder.ok == 10
    # the same actor processes served every run: only the first call started them
    pids = sorted(w.pid for w in first.workers)
    assert None not in pids and len(set(pids)) == NPUS
    assert sorted(w.pid for w in again.workers) == pids and sorted(w.pid for w in folder.workers) == pids
    assert first.start_s > 0 and again.start_s == 0 and folder.start_s == 0
    # what the caller waited holds the run and, on the first call, the start
    assert first.call_s >= first.wall_s + first.start_s and again.call_s >= again.wall_s
    assert "starting the actors" in first.verdict() and "starting the actors" not in again.verdict()
    for y, want in zip(got, _single_session(tiny, more)):
        np.testing.assert_array_equal(y, want)
    for i in range(10):
        np.testing.assert_array_equal(np.load(out / f"{i:06d}.npy"), _single_session(tiny, xs[:10])[i])
    # ended: its actors are gone and it says so instead of starting new ones
    alive = {a["name"] for a in ray.util.list_named_actors(all_namespaces=True)}
    assert not any(n.startswith(f"{D.WORKER_PREFIX}-{pool._run_id}") for n in alive)
    with pytest.raises(InputError, match="shut down"):
        pool.run_batch(xs, progress=False)
    back = BatchResult.load(json.loads(again.to_json()))
    assert back.call_s == again.call_s and back.workers[0].pid == again.workers[0].pid


def test_a_one_shot_run_reports_its_start_in_the_time_the_caller_waited(cluster, tiny):
    t0 = time.perf_counter()
    r = run_batch(tiny, _samples(20, seed=13), npus=NPUS, progress=False)
    waited = time.perf_counter() - t0
    assert r and r.start_s > 0 and r.wall_s + r.start_s <= r.call_s <= waited


# last of the tests on the module's cluster: after a row raised, Ray Data 2.60 keeps one actor of the
# pool, and its NPU, until the driver ends (the tests below start no actor there, or their own Ray)
def test_ray_data_map_batches_runs_the_model_row_by_row(cluster, tiny):
    rd = pytest.importorskip("ray.data", reason="needs Ray Data: pip install -e '.[ray]'")
    from npu_deploy.distributed import NpuPredictor

    rd.DataContext.get_current().enable_progress_bars = False
    kw = dict(concurrency=NPUS, num_cpus=0, resources={"NPU": 1}, batch_size=16, batch_format="numpy")
    xs = _samples(120, seed=7)
    ds = rd.from_items([{"id": i, "x": x} for i, x in enumerate(xs)])
    rows = sorted(ds.map_batches(NpuPredictor, fn_constructor_kwargs={"model": str(tiny)}, **kw).take_all(),
                  key=lambda r: r["id"])
    assert [r["id"] for r in rows] == list(range(120))
    for r, want, x in zip(rows, _single_session(tiny, xs), xs):
        np.testing.assert_array_equal(r["y"], want)    # the model's output, as a column named after it
        np.testing.assert_array_equal(r["x"], x)       # the input columns pass through
    # an input fed from a column of another name; a missing column is one clear error
    other = rd.from_items([{"image": x} for x in xs[:8]])
    mapped = other.map_batches(NpuPredictor, fn_constructor_kwargs={"model": str(tiny), "columns": {"x": "image"}},
                               **kw).take_all()
    assert len(mapped) == 8 and all(np.array_equal(r["y"], np.maximum(r["image"] + W, 0)) for r in mapped)
    two = rd.from_items([{"image": x, "id": i} for i, x in enumerate(xs[:4])])
    with pytest.raises(Exception, match=r"model input 'x': no column 'x' in the batch"):
        two.map_batches(NpuPredictor, fn_constructor_kwargs={"model": str(tiny)}, **kw).take_all()


# ------------------------------------------------------------------------------------------ issue 23
def test_an_impossible_request_is_refused_before_ray_starts(tiny, tmp_path, run_cli):
    """--npus 100000 over an empty folder, then over a real one: one exit-2 line within seconds, and
    no Ray started for it (the report: 61 workers and 4.9 GB of raylet after 200 s, no error)."""
    was_running = ray.is_initialized()
    empty = tmp_path / "in"
    empty.mkdir()
    t0 = time.monotonic()
    code, _, err = run_cli("run", tiny, "--npus", "100000", "--input-dir", empty, "--output", tmp_path / "out")
    assert code == 2 and "no .npy or .npz" in err and len(err.strip().splitlines()) == 1, err
    np.save(empty / "a.npy", _samples(1, seed=1)[0])
    code, _, err = run_cli("run", tiny, "--npus", "100000", "--input-dir", empty, "--output", tmp_path / "out")
    # no Ray yet: the local bound; the module's cluster already running here: the NPUs it declares
    want = "has 2 NPUs" if was_running else "runs at most"
    assert code == 2 and want in err and len(err.strip().splitlines()) == 1, err
    assert time.monotonic() - t0 < 10
    assert ray.is_initialized() == was_running and not (tmp_path / "out").exists()


def _cli(*args, env=None):
    import subprocess
    import sys

    code = "import sys; from npu_deploy.cli.main import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _ray_env(tmp):
    """Ray's files (and so its processes' command lines) under a folder of this test's own."""
    import tempfile

    d = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    env = dict(os.environ, RAY_TMPDIR=d, NPU_DEPLOY_RAY_START_TIMEOUT="300")
    env.pop("RAY_ADDRESS", None)
    return d, env


def _left_behind(procs, ray_dir, wait_s=20.0):
    import psutil

    deadline = time.monotonic() + wait_s
    while True:
        alive = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        tagged = []
        for p in psutil.process_iter(["cmdline"]):
            with __import__("contextlib").suppress(Exception):
                if any(ray_dir in a for a in p.info["cmdline"] or ()):
                    tagged.append(p)
        if not alive and not tagged or time.monotonic() > deadline:
            return alive + tagged
        time.sleep(0.5)


@pytest.mark.slow
def test_sigterm_during_a_ray_run_is_143_one_line_nothing_left(tiny, tmp_path):
    import psutil
    import signal

    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    for i, x in enumerate(_samples(3000, seed=11)):
        np.save(src / f"{i:05d}.npy", x)
    ray_dir, env = _ray_env(tmp_path)
    proc = _cli("run", tiny, "--input-dir", src, "--npus", "2", "--output", out, env=env)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        if out.is_dir() and sum(1 for _ in out.iterdir()) > 5:  # the actors are writing
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()
    family = psutil.Process(proc.pid).children(recursive=True)
    assert family  # Ray's GCS, raylet and workers
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert err.strip().splitlines() == ["npu-deploy: interrupted (SIGTERM); no partial output left"], err
    assert not out.exists()
    assert not _left_behind(family, ray_dir)


@pytest.mark.slow
def test_a_slow_ray_start_is_one_exit_3_line_naming_the_option(tiny, tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    np.save(src / "a.npy", _samples(1, seed=12)[0])
    ray_dir, env = _ray_env(tmp_path)
    t0 = time.monotonic()
    proc = _cli("run", tiny, "--input-dir", src, "--npus", "2", "--output", tmp_path / "out",
                "--ray-start-timeout", "0.2", env=env)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "did not start within 0.2 s" in lines[0] and "--ray-start-timeout" in lines[0], err
    assert time.monotonic() - t0 < 60
    assert not (tmp_path / "out").exists()
    assert not _left_behind([], ray_dir)
