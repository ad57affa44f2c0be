"""Batch inference over many NPUs (and hosts) on Ray: one actor per NPU, results in input order.

``run_batch(model, inputs, npus=N | address=...)`` starts one Ray actor per NPU, each asking for
``resources={"NPU": 1}`` and holding one session on its device, streams the inputs to them and writes
(or hands back) the outputs **in input order**:

* **Devices.** On an Ascend host Ray gives each actor its device (``get_accelerator_ids()["NPU"]``) and
  sets ``ASCEND_RT_VISIBLE_DEVICES`` to it, so the actor opens logical device 0 of what it sees; an ``.om``
  runs through ACL there. Without NPUs a local cluster declares them (``ray.init(resources={"NPU": k})``)
  and a bundle runs on the CPU emulator: that is how the tests run. The device path is verified only
  against the ACL stand-in (``tests/standins``), not on hardware.
* **Streaming with backpressure.** At most ``max_in_flight`` samples are read and not yet written,
  however long the input: memory stays flat over any number of samples. Samples travel in chunks of
  ``chunk`` (default: about 4 MiB of input, 1 to 64 samples: one Ray call per chunk), each to the actor
  with the fewest samples in flight, so a slow NPU gets fewer; the default window is 4 chunks per NPU.
* **Failures.** A sample that cannot be read or run is reported with its id (:class:`SampleFailure`) and
  the run goes on. An actor that dies is restarted by Ray and its samples in flight are retried once
  (``max_restarts``, ``max_task_retries=1``); the summary says which NPU was restarted.
* **Summary.** :class:`BatchResult`: per-NPU samples, throughput and latency percentiles, stragglers (an
  NPU whose mean latency is above 1.25 times the median NPU's), failures; ``bool(result)`` is "no
  sample failed".

Inputs: a folder of ``.npy`` / ``.npz`` files (one sample each, in name order; an ``.npy`` feeds a
one-input model, an ``.npz`` holds one member per model input, named after it), or an iterable of
samples: a dict ``{input name: array}``, an array (one-input model), or an ``(id, sample)`` pair.
Outputs (``output=DIR``): one file per sample, ``<id>.npy`` for a one-output model, else ``<id>.npz``
with one member per output, each written atomically.

Built on Ray core actors, not Ray Data: per-sample ids and failures, writes in input order and the
retry-once rule are explicit here, and an actor pool of ``map_batches`` would hide them.
Ray is an optional dependency: ``pip install 'npu-deploy[ray]'``.

>>> from npu_deploy.distributed import run_batch                           # doctest: +SKIP
>>> result = run_batch("cls.bundle", "inputs/", npus=2, output="outputs/")  # doctest: +SKIP
>>> print(result.verdict())                                                 # doctest: +SKIP
1000 samples on 2 NPUs in 4.1 s (243.9/s): all ok
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import random
import sys
import tempfile
import time
import uuid
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator

import numpy as np

from npu_deploy._io import atomic_write, load_npy, load_npz, make_output_folder, safe_file_stem, same_file
from npu_deploy._ray import connect, import_ray
from npu_deploy._result import Result
from npu_deploy._text import printable
from npu_deploy.errors import ExternalError, InputError, ModelError, NpuDeployError
from npu_deploy.runtime.bench import LatencyStats, latency_stats
from npu_deploy.runtime.session import sniff_model

#: bytes of input sent to an actor in one call when ``chunk`` is not given: a Ray call costs a fixed
#: part (round trip, object store) that this many bytes share; at least 1, at most MAX_CHUNK samples
CHUNK_BYTES = 4 << 20
MAX_CHUNK = 64
#: chunks in flight per NPU when ``max_in_flight`` is not given: one running and three queued
CHUNKS_IN_FLIGHT = 4
#: an NPU whose mean latency is above this many times the median NPU's is a straggler
STRAGGLER_RATIO = 1.25
#: seconds allowed for the actors to start (a Ray address gets npu_deploy._ray.CONNECT_TIMEOUT_S)
ACTOR_START_TIMEOUT_S = 120.0
#: run times kept per NPU for the percentiles (count, mean, min and max are exact whatever the run length)
LATENCY_SAMPLE = 100_000
#: restarts Ray grants one actor (each restart retries the samples it had in flight once)
MAX_RESTARTS = 2
INPUT_SUFFIXES = (".npy", ".npz")
WORKER_PREFIX = "npu-deploy-worker"


# ------------------------------------------------------------------------------------------ results
@dataclass
class SampleFailure:
    """One sample that produced no output: its id and why."""

    id: str
    error: str


@dataclass
class NpuStats:
    """What one NPU (one actor) did: samples, throughput over the run, latency of its runs."""

    worker: int
    device: str | None
    node: str = ""
    backend: str = ""
    samples: int = 0
    failed: int = 0
    throughput_per_s: float = 0.0
    latency: LatencyStats | None = None
    restarted: bool = False
    straggler: bool = False


@dataclass
class BatchResult(Result):
    """The summary of one :func:`run_batch`. ``bool(result)`` is True when every sample produced outputs.

    >>> r = BatchResult(model="m", npus=2, samples=10, ok=9, wall_s=2.0,
    ...                 failures=[SampleFailure("x7", "bad shape")])
    >>> r.verdict()
    '10 samples on 2 NPUs in 2.0 s (5.0/s): 1 failed (first: x7: bad shape)'
    """

    SCHEMA: ClassVar[str] = "npu-deploy/batch-result"
    SCHEMA_VERSION: ClassVar[int] = 1

    model: str = ""
    backend: str = ""
    address: str | None = None
    npus: int = 0
    samples: int = 0
    ok: int = 0
    wall_s: float = 0.0
    throughput_per_s: float = 0.0
    max_in_flight: int = 0
    output_dir: str | None = None
    workers: list[NpuStats] = field(default_factory=list)
    failures: list[SampleFailure] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return not self.failures

    def stragglers(self) -> list[NpuStats]:
        return [w for w in self.workers if w.straggler]

    def verdict(self) -> str:
        rate = self.samples / self.wall_s if self.wall_s > 0 else 0.0
        line = f"{self.samples} samples on {self.npus} NPUs in {self.wall_s:.1f} s ({rate:.1f}/s): "
        if self.failures:
            first = self.failures[0]
            line += f"{len(self.failures)} failed (first: {printable(first.id)}: {printable(first.error)})"
        else:
            line += "all ok"
        slow = self.stragglers()
        if slow:
            line += f"; stragglers: {', '.join(_worker_label(w) for w in slow)}"
        return line

    def table(self) -> str:
        """Per-NPU lines: samples, throughput, latency p50/p90/p99, restarts, stragglers."""
        rows = [f"{'NPU':<12} {'samples':>8} {'failed':>6} {'per s':>8} {'p50 ms':>8} {'p90 ms':>8} "
                f"{'p99 ms':>8}  note"]
        for w in self.workers:
            lat = w.latency
            p = (f"{lat.p50_ms:8.2f} {lat.p90_ms:8.2f} {lat.p99_ms:8.2f}" if lat else f"{'-':>8} {'-':>8} {'-':>8}")
            note = ", ".join(x for x in ("restarted" if w.restarted else "", "straggler" if w.straggler else "") if x)
            rows.append(f"{printable(_worker_label(w)):<12} {w.samples:>8} {w.failed:>6} "
                        f"{w.throughput_per_s:>8.1f} {p}  {note}")
        return "\n".join(rows)

    @classmethod
    def from_dict(cls, d: dict) -> "BatchResult":
        d = dict(d)
        workers = []
        for w in d.get("workers", []):
            w = dict(w)
            if w.get("latency"):
                w["latency"] = LatencyStats.from_dict(w["latency"])
            workers.append(NpuStats(**{k: v for k, v in w.items() if k in _fields(NpuStats)}))
        d["workers"] = workers
        d["failures"] = [SampleFailure(**f) for f in d.get("failures", [])]
        return cls(**{k: v for k, v in d.items() if k in _fields(cls)})


def _fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _worker_label(w: NpuStats) -> str:
    return f"npu {w.device}" if w.device is not None else f"worker {w.worker}"


class _Latencies:
    """Run times of one NPU in constant memory: exact count, total, min and max; percentiles from a
    uniform sample of at most :data:`LATENCY_SAMPLE` runs (reservoir sampling, fixed seed)."""

    def __init__(self, seed: int):
        self.count, self.total, self.min, self.max = 0, 0.0, math.inf, 0.0
        self.sample = array("d")
        self._rng = random.Random(seed)

    def add(self, seconds: float) -> None:
        self.count += 1
        self.total += seconds
        self.min = min(self.min, seconds)
        self.max = max(self.max, seconds)
        if len(self.sample) < LATENCY_SAMPLE:
            self.sample.append(seconds)
        else:
            j = self._rng.randrange(self.count)
            if j < LATENCY_SAMPLE:
                self.sample[j] = seconds

    def stats(self) -> LatencyStats | None:
        if not self.count:
            return None
        st = latency_stats(self.sample)
        return dataclasses.replace(st, count=self.count, min_ms=self.min * 1e3, max_ms=self.max * 1e3,
                                   mean_ms=self.total / self.count * 1e3, total_ms=self.total * 1e3)


# ------------------------------------------------------------------------------------------ inputs
@dataclass
class _Sample:
    index: int
    id: str
    feeds: dict | None = None
    error: str | None = None


def input_files(folder: str | os.PathLike) -> tuple[list[Path], list[str]]:
    """The sample files of ``folder`` (``.npy`` / ``.npz``, in name order) and the names of the other
    entries it holds (left alone, reported as a warning)."""
    d = Path(folder)
    if not d.is_dir():
        raise InputError(f"--input-dir {d} is not a folder", hint="give the folder holding the .npy/.npz samples")
    files, other = [], []
    with os.scandir(d) as it:
        for e in it:
            if e.name.startswith("."):  # our own .part files, editor and OS clutter
                continue
            if e.is_file() and Path(e.name).suffix.lower() in INPUT_SUFFIXES:
                files.append(d / e.name)
            else:
                other.append(e.name)
    files.sort(key=lambda p: p.name)
    return files, sorted(other)


def _feeds_from_file(path: Path, input_names: list[str]) -> dict:
    if path.suffix.lower() == ".npy":
        if len(input_names) != 1:
            raise InputError(f"a .npy holds one array and the model has {len(input_names)} inputs "
                             f"({', '.join(input_names)})", hint="give an .npz with one member per input")
        return {input_names[0]: load_npy(path)}
    arrays = load_npz(path)
    if len(input_names) == 1 and len(arrays) == 1:
        return {input_names[0]: next(iter(arrays.values()))}
    missing = [n for n in input_names if n not in arrays]
    extra = [n for n in arrays if n not in input_names]
    if missing or extra:
        raise InputError(f"members {sorted(arrays)} do not match the model inputs {input_names}",
                         hint="name each .npz member after a model input")
    return arrays


def _feeds_from_item(item: Any, input_names: list[str]) -> dict:
    if isinstance(item, dict):
        return item
    if isinstance(item, np.ndarray):
        if len(input_names) != 1:
            raise InputError(f"an array feeds a one-input model; this one has inputs {', '.join(input_names)}",
                             hint="give a dict {input name: array}")
        return {input_names[0]: item}
    raise InputError(f"a sample is a dict of arrays or an array, not {type(item).__name__}")


def _samples(inputs: Any, input_names: list[str]) -> tuple[Iterator[_Sample], int | None, list[str]]:
    """(samples, how many if known, warnings). Reading happens as the iterator is consumed."""
    if isinstance(inputs, (str, os.PathLike)):
        files, other = input_files(inputs)
        if not files:
            raise InputError(f"--input-dir {inputs}: no .npy or .npz files in it",
                             hint="one sample per file: <id>.npy (one input) or <id>.npz (one member per input)")
        warnings = []
        if other:
            shown = ", ".join(printable(n) for n in other[:5])
            warnings.append(f"{inputs}: {len(other)} entries that are not .npy/.npz files were left alone "
                            f"({shown}{', ...' if len(other) > 5 else ''})")

        def gen() -> Iterator[_Sample]:
            for i, p in enumerate(files):
                try:
                    yield _Sample(i, p.name, feeds=_feeds_from_file(p, input_names))
                except NpuDeployError as e:
                    yield _Sample(i, p.name, error=str(e))
        return gen(), len(files), warnings

    try:
        total = len(inputs)
    except TypeError:
        total = None

    def gen_items() -> Iterator[_Sample]:
        for i, item in enumerate(inputs):
            sid = f"{i:06d}"
            if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
                sid, item = item
            try:
                yield _Sample(i, sid, feeds=_feeds_from_item(item, input_names))
            except NpuDeployError as e:
                yield _Sample(i, sid, error=str(e))
    return gen_items(), total, []


# ------------------------------------------------------------------------------------------ outputs
class _Writer:
    """One file per sample in ``folder``: ``<id>.npy`` (one output) or ``<id>.npz``; names kept distinct."""

    def __init__(self, folder: str | os.PathLike, output_names: list[str]):
        self.folder = make_output_folder(folder)
        self.names = output_names
        self._taken: set[str] = set()

    def path_for(self, sample_id: str) -> Path:
        stem = Path(sample_id).stem if Path(sample_id).suffix.lower() in INPUT_SUFFIXES else sample_id
        safe = safe_file_stem(stem)
        cand, k = safe, 1
        while cand.lower() in self._taken:  # "a.npy" and "a.npz" must not land in one file
            k += 1
            cand = f"{safe}_{k}"
        self._taken.add(cand.lower())
        return self.folder / f"{cand}.{'npy' if len(self.names) == 1 else 'npz'}"

    def write(self, sample_id: str, outs: list[np.ndarray]) -> Path:
        path = self.path_for(sample_id)
        with atomic_write(path, "wb") as f:
            if len(outs) == 1:
                np.save(f, outs[0], allow_pickle=False)
            else:
                np.savez(f, **{safe_file_stem(n): a for n, a in zip(self.names, outs)})
        return path


# ------------------------------------------------------------------------------------------ Ray
def cluster_npus() -> int:
    """How many NPUs the connected Ray cluster has (its ``"NPU"`` resource)."""
    return int(import_ray().cluster_resources().get("NPU", 0))


def device_id_for(accelerator_ids: list[str], environ: dict | None = None) -> int:
    """The ACL device id an actor opens: Ray sets ``ASCEND_RT_VISIBLE_DEVICES`` to its NPU, so the actor
    sees that one device as 0; with the opt-out set (``RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES``)
    it sees every device and opens its own id.

    >>> device_id_for(["3"], {"ASCEND_RT_VISIBLE_DEVICES": "3"})
    0
    >>> device_id_for(["3"], {"RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES": "1"})
    3
    """
    env = os.environ if environ is None else environ
    if not accelerator_ids:
        return 0
    noset = str(env.get("RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES", "")).lower() in ("1", "true")
    visible = env.get("ASCEND_RT_VISIBLE_DEVICES")
    if noset or not visible:
        return int(accelerator_ids[0])
    order = [v.strip() for v in visible.split(",")]
    return order.index(accelerator_ids[0]) if accelerator_ids[0] in order else 0


class NpuWorker:
    """The actor body: one session on this actor's NPU (emulator for a bundle, ACL for an ``.om``)."""

    def __init__(self, model: str, backend: str, threads: int | None, model_ref=None):
        import ray

        if threads:
            os.environ["NPU_DEPLOY_THREADS"] = str(threads)
        ctx = ray.get_runtime_context()
        ids = [str(i) for i in (ctx.get_accelerator_ids().get("NPU") or [])]
        self.device = ids[0] if ids else None
        self.node = ctx.get_node_id()
        self.restarted = bool(ctx.was_current_actor_reconstructed)
        path = Path(model)
        if model_ref is not None and not path.is_file():  # another host: the model came through Ray
            fd, name = tempfile.mkstemp(suffix=path.suffix or ".model")
            with os.fdopen(fd, "wb") as f:
                f.write(ray.get(model_ref))
            path = Path(name)
        self.session = open_session(path, backend, device_id_for(ids), threads)
        self.backend = getattr(self.session, "backend_name", None) or getattr(self.session, "name", "")

    def info(self) -> dict:
        return {"device": self.device, "node": self.node, "backend": self.backend, "pid": os.getpid(),
                "inputs": [m.name for m in self.session.get_inputs()],
                "outputs": [m.name for m in self.session.get_outputs()]}

    def run(self, batch: list) -> tuple:
        """``(restarted, [(ok, outputs or error text, seconds), ...])`` for a chunk of samples' feeds; a bad
        sample never kills the actor nor the rest of its chunk."""
        out = []
        for feeds in batch:
            t0 = time.perf_counter()
            try:
                out.append((True, self.session.run(None, feeds), time.perf_counter() - t0))
            except NpuDeployError as e:
                out.append((False, str(e), time.perf_counter() - t0))
            except Exception as e:  # onnxruntime / ACL raise their own types: report, keep serving
                text = str(e).splitlines()[0][:300] if str(e) else ""
                out.append((False, f"{type(e).__name__}: {text}", time.perf_counter() - t0))
        return self.restarted, out


def open_session(path: str | os.PathLike, backend: str = "auto", device_id: int = 0, threads: int | None = None):
    """One :class:`~npu_deploy.runtime.session.InferenceSession` for ``path``; ``threads`` limits
    onnxruntime's threads when a bundle runs on the emulator."""
    from npu_deploy.runtime.session import InferenceSession

    if not (threads and backend in ("auto", "emulator") and sniff_model(path) == "bundle"):
        return InferenceSession(path, device_id=device_id, backend=backend)
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    opts.intra_op_num_threads = int(threads)
    opts.inter_op_num_threads = 1
    if "sess_options" in inspect.signature(InferenceSession).parameters:
        return InferenceSession(path, backend="emulator", sess_options=opts)
    # an InferenceSession without sess_options: the emulator backend it would hold (same run/get_inputs)
    from npu_deploy.runtime.emulator import EmulatorBackend

    be = EmulatorBackend(path, session_options=opts)
    be.activate()
    return be


# ------------------------------------------------------------------------------------------ progress
class _Progress:
    """One self-rewriting stderr line: done/total, throughput, failures. Only on a terminal."""

    def __init__(self, total: int | None, npus: int, stream=None):
        self.stream = stream or sys.stderr
        self.total, self.npus = total, npus
        self.start = time.perf_counter()
        self.last = 0.0

    def update(self, done: int, failed: int, final: bool = False) -> None:
        now = time.perf_counter()
        if not final and now - self.last < 0.2:
            return
        self.last = now
        rate = done / (now - self.start) if now > self.start else 0.0
        if self.total:
            width = 30
            fill = int(width * done / self.total)
            head = f"[{'#' * fill}{'.' * (width - fill)}] {done}/{self.total}"
        else:
            head = f"{done} samples"
        tail = f"  {rate:.1f}/s on {self.npus} NPUs" + (f"  {failed} failed" if failed else "")
        self.stream.write("\r" + head + tail + ("\n" if final else ""))
        self.stream.flush()


# ------------------------------------------------------------------------------------------ the run
def run_batch(model: str | os.PathLike, inputs: Any, *, npus: int | None = None, address: str | None = None,
              output: str | os.PathLike | None = None, backend: str = "auto", threads: int | None = None,
              max_in_flight: int | None = None, chunk: int | None = None,
              on_result: Callable[[str, list[np.ndarray]], None] | None = None,
              progress: bool | Callable[[int, int | None, int], None] | None = None) -> BatchResult:
    """Run ``model`` on every sample of ``inputs`` over ``npus`` NPUs of a Ray cluster.

    ``address``: ``None`` starts a local Ray cluster declaring ``npus`` NPUs (or uses the Ray session
    already initialised in this process); ``"auto"`` or ``"host:port"`` / ``"ray://host:port"`` joins a
    running cluster, whose NPUs must number at least ``npus`` (default: all of them). ``output``: a folder
    receiving one file per sample; ``on_result(id, outputs)`` is called for each successful sample, in
    input order. ``threads``: onnxruntime threads per emulator actor (default: CPUs / NPUs on a local
    cluster). ``progress``: ``None`` shows a bar when stderr is a terminal; a callable gets
    ``(done, total, failed)``.

    >>> r = run_batch("cls.bundle", [x0, x1], npus=2, on_result=print)    # doctest: +SKIP
    """
    if npus is not None and npus < 1:
        raise InputError(f"--npus {npus}: must be at least 1")
    if max_in_flight is not None and max_in_flight < 1:
        raise InputError(f"max_in_flight {max_in_flight}: must be at least 1")
    if chunk is not None and chunk < 1:
        raise InputError(f"chunk {chunk}: must be at least 1")
    model = Path(model)
    if sniff_model(model) == "onnx":  # a missing file or an ONNX model: one line here, not a dead actor later
        raise ModelError(f"{model}: is an ONNX model; the NPU workers run converted models",
                         hint=f"convert it first: npu-deploy convert {model} --backend builtin")
    if output is not None and isinstance(inputs, (str, os.PathLike)) and same_file(output, inputs):
        raise InputError(f"--output {output} is the input folder: the outputs would replace the inputs",
                         hint="choose another --output folder")
    started = connect(address, npus=npus)
    ray = import_ray()
    actors: list = []
    try:
        have = cluster_npus()
        if have < 1:
            raise ExternalError(f"the Ray cluster{' at ' + address if address else ''} has no NPU resource",
                                hint='start it with --resources=\'{"NPU": N}\' or on Ascend hosts')
        if npus is not None and npus > have:
            raise InputError(f"--npus {npus}: the Ray cluster has {have} NPU{'s' if have != 1 else ''}",
                             hint=f"ask for at most --npus {have}")
        n = npus or have
        if threads is None and address is None and backend != "acl":
            threads = max(1, (os.cpu_count() or 1) // n)
        actors, infos = _start_workers(ray, model, n, backend, threads, remote=address is not None)
        return _drive(ray, actors, infos, model, inputs, output, max_in_flight, chunk, on_result, progress,
                      address, backend)
    finally:
        for a in actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # already gone
                pass
        if started:
            ray.shutdown()


def _start_workers(ray, model: Path, n: int, backend: str, threads: int | None, *, remote: bool):
    run_id = uuid.uuid4().hex[:8]
    cls = ray.remote(NpuWorker)
    model_ref = ray.put(model.read_bytes()) if remote else None
    actors = [cls.options(name=f"{WORKER_PREFIX}-{run_id}-{k}", resources={"NPU": 1}, num_cpus=0,
                          max_restarts=MAX_RESTARTS, max_task_retries=1)
              .remote(str(model.resolve()), backend, threads, model_ref) for k in range(n)]
    refs = [a.info.remote() for a in actors]
    try:
        infos = ray.get(refs, timeout=ACTOR_START_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        for a in actors:
            ray.kill(a, no_restart=True)
        raise ExternalError(f"{n} NPU workers did not start within {ACTOR_START_TIMEOUT_S:g} s "
                            f"(NPUs busy with other work?)", hint="check `ray status`") from None
    except ray.exceptions.RayActorError as e:
        for a in actors:
            ray.kill(a, no_restart=True)
        cause = _actor_cause(e)
        raise (cause if isinstance(cause, NpuDeployError) else
               ExternalError(f"an NPU worker could not open {model} ({_first_line(e)})")) from None
    return actors, infos


def _actor_cause(e) -> BaseException | None:
    cause = getattr(e, "cause", None)  # ActorDiedError wraps the RayTaskError of __init__
    inner = getattr(cause, "cause", None)
    return inner if isinstance(inner, BaseException) else cause


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[-1][:300] if text else type(e).__name__


def chunking(sample_bytes: int, npus: int, max_in_flight: int | None, chunk: int | None) -> tuple[int, int]:
    """(samples per Ray call, samples in flight): about :data:`CHUNK_BYTES` per call, and
    :data:`CHUNKS_IN_FLIGHT` calls per NPU; a given window is kept and shared so every NPU stays busy.

    >>> chunking(110_592, 2, None, None)     # PP-OCR cls [1,3,48,192] float32
    (37, 296)
    >>> chunking(32, 2, 5, None)
    (2, 5)
    """
    size = chunk or max(1, min(MAX_CHUNK, CHUNK_BYTES // max(1, sample_bytes)))
    window = max_in_flight or CHUNKS_IN_FLIGHT * size * npus
    return max(1, min(size, window // npus)), window


def _drive(ray, actors, infos, model, inputs, output, max_in_flight, chunk_size, on_result, progress, address,
           backend) -> BatchResult:
    n = len(actors)
    # until the first sample tells its size: one sample per call, a window of CHUNKS_IN_FLIGHT per NPU
    size, window = 1, max_in_flight or CHUNKS_IN_FLIGHT * n
    sized = False
    input_names = infos[0]["inputs"]
    output_names = infos[0]["outputs"]
    samples, total, warnings = _samples(inputs, input_names)
    writer = _Writer(output, output_names) if output is not None else None
    bar = None
    callback = progress if callable(progress) else None
    if progress is True or (progress is None and sys.stderr.isatty()):
        bar = _Progress(total, n)

    in_flight = [0] * n         # samples sent to each actor and not back
    dead = [False] * n
    lat = [_Latencies(seed=k) for k in range(n)]
    done_per = [0] * n
    failed_per = [0] * n
    restarted = [False] * n
    pending: dict = {}          # ObjectRef -> (worker, [(index, id), ...])
    finished: dict = {}         # index -> (id, outputs | None, error | None)
    failures: list[SampleFailure] = []
    chunk: list[_Sample] = []
    sent = 0                    # samples in pending chunks
    next_index = 0
    count = ok = 0
    exhausted = False
    t0 = time.perf_counter()

    def flush() -> None:
        nonlocal next_index, ok
        while next_index in finished:
            sid, outs, err = finished.pop(next_index)
            next_index += 1
            if err is not None:
                failures.append(SampleFailure(sid, err))
                continue
            if writer is not None:
                writer.write(sid, outs)
            if on_result is not None:
                on_result(sid, outs)
            ok += 1

    def submit() -> None:
        nonlocal chunk, sent
        alive = [k for k in range(n) if not dead[k]]
        if not alive:
            raise ExternalError(f"every NPU worker died ({n} of {n}) after {count - len(chunk)} samples",
                                hint="see the Ray logs (`ray logs`) for why")
        k = min(alive, key=lambda j: in_flight[j])  # the least busy NPU: a slow one gets fewer
        pending[actors[k].run.remote([s.feeds for s in chunk])] = (k, [(s.index, s.id) for s in chunk])
        in_flight[k] += len(chunk)
        sent += len(chunk)
        chunk = []

    while True:
        # backpressure: read only while fewer than `window` samples are read and not yet written
        while not exhausted and sent + len(chunk) + len(finished) < window:
            s = next(samples, None)
            if s is None:
                exhausted = True
                break
            count += 1
            if s.error is not None:
                finished[s.index] = (s.id, None, s.error)
            else:
                if not sized:
                    nbytes = sum(getattr(a, "nbytes", 0) for a in s.feeds.values())
                    size, window = chunking(nbytes, n, max_in_flight, chunk_size)
                    sized = True
                chunk.append(s)
                if len(chunk) >= size:
                    submit()
        if chunk and (exhausted or sent + len(chunk) + len(finished) >= window):
            submit()
        flush()
        done = count - sent - len(finished)
        if callback is not None:
            callback(done, total, len(failures))
        if bar is not None:
            bar.update(done, len(failures))
        if not pending:
            if exhausted and not finished:
                break
            continue
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=None)
        for ref in ready:
            k, ids = pending.pop(ref)
            in_flight[k] -= len(ids)
            sent -= len(ids)
            try:
                was_restarted, results = ray.get(ref)
            except ray.exceptions.RayActorError as e:
                # Ray already restarted the actor and retried this chunk once; it died again
                if isinstance(e, ray.exceptions.ActorDiedError):
                    dead[k] = True
                restarted[k] = True
                failed_per[k] += len(ids)
                for index, sid in ids:
                    finished[index] = (sid, None, f"NPU worker {k} died while running it, also on the retry "
                                                  f"({_first_line(e)})")
                continue
            except ray.exceptions.RayError as e:
                failed_per[k] += len(ids)
                for index, sid in ids:
                    finished[index] = (sid, None, f"Ray could not run it ({_first_line(e)})")
                continue
            restarted[k] = restarted[k] or was_restarted
            for (index, sid), (good, value, seconds) in zip(ids, results):
                if good:
                    lat[k].add(seconds)
                    done_per[k] += 1
                    finished[index] = (sid, value, None)
                else:
                    failed_per[k] += 1
                    finished[index] = (sid, None, value)
    wall = time.perf_counter() - t0
    if bar is not None:
        bar.update(count, len(failures), final=True)
    workers = []
    for k, info in enumerate(infos):
        workers.append(NpuStats(worker=k, device=info["device"], node=info["node"], backend=info["backend"],
                                samples=done_per[k], failed=failed_per[k],
                                throughput_per_s=done_per[k] / wall if wall > 0 else 0.0,
                                latency=lat[k].stats(), restarted=restarted[k]))
    _mark_stragglers(workers)
    return BatchResult(model=str(model), backend=workers[0].backend if workers else backend, address=address,
                       npus=n, samples=count, ok=ok, wall_s=wall,
                       throughput_per_s=ok / wall if wall > 0 else 0.0, max_in_flight=window,
                       output_dir=str(output) if output is not None else None, workers=workers,
                       failures=failures, warnings=warnings)


def _mark_stragglers(workers: list[NpuStats]) -> None:
    means = [w.latency.mean_ms for w in workers if w.latency is not None]
    if len(means) < 2:
        return
    median = float(np.median(means))
    for w in workers:
        if w.latency is not None and median > 0 and w.latency.mean_ms > STRAGGLER_RATIO * median:
            w.straggler = True
