"""The driver of a batch run: starts the actors, streams the samples to them, puts the outputs in place
in input order and sums up (:func:`run_batch`; :class:`NpuPool` keeps the actors for the next run)."""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import numpy as np

from npu_deploy._io import clean_stale_parts, install_part, make_output_folder, same_file
from npu_deploy._ray import connect, import_ray
from npu_deploy.errors import ExternalError, InputError, ModelError, NpuDeployError
from npu_deploy.runtime.distributed._actor import NpuWorker, _file_ids
from npu_deploy.runtime.distributed._results import BatchResult, NpuStats, SampleFailure, _Latencies, _mark_stragglers
from npu_deploy.runtime.distributed._ring import _Ring
from npu_deploy.runtime.distributed._samples import _Chunk, _read, _Sample, _samples, _Writer, input_files
from npu_deploy.runtime.session import sniff_model

#: bytes of input sent to an actor in one call when ``chunk`` is not given: a Ray call costs a fixed
#: part (round trip, object store) that this many bytes share; at least 1, at most MAX_CHUNK samples
CHUNK_BYTES = 8 << 20
MAX_CHUNK = 128
#: chunks in flight per NPU when ``max_in_flight`` is not given: one running and three queued
CHUNKS_IN_FLIGHT = 4
#: how long a stopped run waits for the chunks still in flight before it ends their actors (:meth:`_Drive._drain`)
DRAIN_TIMEOUT_S = 30.0
#: seconds allowed for the actors to start (a Ray address gets npu_deploy._ray.CONNECT_TIMEOUT_S)
ACTOR_START_TIMEOUT_S = 120.0
#: restarts Ray grants one actor (each restart retries the samples it had in flight once)
MAX_RESTARTS = 2
WORKER_PREFIX = "npu-deploy-worker"
#: NPU workers a local cluster (no --ray-address) may declare: an Ascend host holds at most 16 NPUs, and
#: emulated NPUs beyond the CPU count only compete for the same cores
LOCAL_MAX_NPUS = 16


def local_max_npus() -> int:
    """How many NPUs a local Ray cluster started here may declare: 16, or the CPU count when larger."""
    return max(LOCAL_MAX_NPUS, os.cpu_count() or 1)


def cluster_npus() -> int:
    """How many NPUs the connected Ray cluster has (its ``"NPU"`` resource)."""
    return int(import_ray().cluster_resources().get("NPU", 0))


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
              progress: bool | Callable[[int, int | None, int], None] | None = None,
              start_timeout: float | None = None) -> BatchResult:
    """Run ``model`` on every sample of ``inputs`` over ``npus`` NPUs of a Ray cluster.

    ``address``: ``None`` starts a local Ray cluster declaring ``npus`` NPUs (or uses the Ray session
    already initialised in this process); ``"auto"`` or ``"host:port"`` / ``"ray://host:port"`` joins a
    running cluster, whose NPUs must number at least ``npus`` (default: all of them). ``output``: a folder
    receiving one file per sample; ``on_result(id, outputs)`` is called for each successful sample, in
    input order. ``threads``: onnxruntime threads per emulator actor (default: CPUs / NPUs on a local
    cluster). ``progress``: ``None`` shows a bar when stderr is a terminal; a callable gets
    ``(done, total, failed)``. ``start_timeout``: seconds a local Ray cluster may take to start
    (default :data:`npu_deploy._ray.START_TIMEOUT_S`).

    Checked before Ray starts: the samples of a folder (an empty folder is refused) and, for a local
    cluster, ``npus`` against :func:`local_max_npus`; then ``npus`` against the NPUs the cluster
    declares. No more workers start than there are samples (when their number is known).

    One call starts the actors (and a local cluster) and ends them before it returns; to run several
    batches on the same live actors, use :class:`NpuPool`. ``BatchResult.call_s`` is the time from the
    call to its return, start included; ``wall_s`` the run once the actors answered.

    >>> r = run_batch("cls.bundle", [x0, x1], npus=2, on_result=print)    # doctest: +SKIP
    """
    t0 = time.perf_counter()
    pool = NpuPool(model, npus=npus, address=address, backend=backend, threads=threads,
                   start_timeout=start_timeout)
    try:
        return pool._run(inputs, output, max_in_flight, chunk, on_result, progress, t0, one_shot=True)
    finally:
        pool.shutdown()
        if output is not None and pool._ray is not None:  # parts of actors that died while writing (their pid names them)
            clean_stale_parts(output)


class NpuPool:
    """Live NPU actors for repeated batch runs: only the first :meth:`run_batch` (or :meth:`start`) pays
    for starting Ray and the actors; later calls reuse them. End it with :meth:`shutdown`, or use it as
    a context manager::

        with NpuPool("cls.bundle", npus=2) as pool:                          # doctest: +SKIP
            first = pool.run_batch(xs)           # starts Ray and 2 actors, then runs
            again = pool.run_batch(more_xs)      # the same actors: no start

    ``npus``, ``address``, ``backend``, ``threads`` and ``start_timeout`` are :func:`run_batch`'s; the
    per-run options (``output``, ``max_in_flight``, ``chunk``, ``on_result``, ``progress``) go to
    :meth:`run_batch`. A run with fewer samples than actors uses the first ones. An actor Ray gave up
    on (dead after its restarts) is replaced before the next run. A run that ends with an exception
    (an output that cannot be written, Ctrl-C, SIGTERM) ends the pool first (its actors killed, the
    local cluster it started shut down), so nothing keeps writing after it; the next call says so.
    """

    def __init__(self, model: str | os.PathLike, *, npus: int | None = None, address: str | None = None,
                 backend: str = "auto", threads: int | None = None, start_timeout: float | None = None):
        if npus is not None and npus < 1:
            raise InputError(f"--npus {npus}: must be at least 1")
        model = Path(model)
        if sniff_model(model) == "onnx":  # a missing file or an ONNX model: one line here, not a dead actor later
            raise ModelError(f"{model}: is an ONNX model; the NPU workers run converted models",
                             hint=f"convert it first: npu-deploy convert {model} --backend builtin")
        self.model, self.npus, self.address, self.backend = model, npus, address, backend
        self.threads, self.start_timeout = threads, start_timeout
        self._ray = None
        self._started = False      # this pool started Ray (and shuts it down)
        self._actors: list = []
        self._dead: set[int] = set()
        self._run_id = uuid.uuid4().hex[:8]
        self._box: list = []       # the current run's _Drive: its chunks in flight are waited for at a stop
        self._closed = False

    def __enter__(self) -> "NpuPool":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    @property
    def size(self) -> int:
        """Live actors (0 before the first start)."""
        return len(self._actors)

    def start(self, cap: int | None = None) -> float:
        """Start Ray (unless joined or already running) and the actors, if not done yet; returns the
        seconds it took (0.0 when the actors were already up). ``cap``: start at most this many."""
        if self._closed:
            raise InputError("this NpuPool was shut down", hint="make a new NpuPool")
        if self._actors:
            return 0.0
        t0 = time.perf_counter()
        self._started = connect(self.address, npus=self.npus, start_timeout=self.start_timeout)
        self._ray = import_ray()
        try:
            self._start_actors(cap)
        except BaseException:
            self.shutdown()  # the local cluster this call started, and any actor it began
            raise
        return time.perf_counter() - t0

    def _start_actors(self, cap: int | None) -> None:
        ray = self._ray
        have = cluster_npus()
        if have < 1:
            raise ExternalError(f"the Ray cluster{' at ' + self.address if self.address else ''} has no NPU resource",
                                hint='start it with --resources=\'{"NPU": N}\' or on Ascend hosts')
        if self.npus is not None and self.npus > have:
            raise InputError(f"--npus {self.npus}: the Ray cluster has {have} NPU{'s' if have != 1 else ''}",
                             hint=f"ask for at most --npus {have}")
        n = self.npus or have
        if cap is not None and 0 < cap < n:  # an idle worker holds an NPU and a process for nothing
            n = cap
        if self.threads is None and self.address is None and self.backend != "acl":
            self.threads = max(1, (os.cpu_count() or 1) // n)
        self._actors = _start_workers(ray, self.model, n, self.backend, self.threads,
                                      remote=self.address is not None, run_id=self._run_id)

    def run_batch(self, inputs: Any, *, output: str | os.PathLike | None = None, max_in_flight: int | None = None,
                  chunk: int | None = None, on_result: Callable[[str, list[np.ndarray]], None] | None = None,
                  progress: bool | Callable[[int, int | None, int], None] | None = None) -> BatchResult:
        """:func:`run_batch` on this pool's actors (started on the first call)."""
        t0 = time.perf_counter()
        try:
            return self._run(inputs, output, max_in_flight, chunk, on_result, progress, t0)
        finally:
            if output is not None and self._closed and self._ray is not None:  # ended: parts of killed actors
                clean_stale_parts(output)

    def _run(self, inputs, output, max_in_flight, chunk, on_result, progress, t0: float, *,
             one_shot: bool = False) -> BatchResult:
        if max_in_flight is not None and max_in_flight < 1:
            raise InputError(f"max_in_flight {max_in_flight}: must be at least 1")
        if chunk is not None and chunk < 1:
            raise InputError(f"chunk {chunk}: must be at least 1")
        if self._closed:
            raise InputError("this NpuPool was shut down", hint="make a new NpuPool")
        if output is not None and isinstance(inputs, (str, os.PathLike)) and same_file(output, inputs):
            raise InputError(f"--output {output} is the input folder: the outputs would replace the inputs",
                             hint="choose another --output folder")
        total = _check_before_ray(inputs, None if self._actors else self.npus, self.address)
        try:
            start_s = self.start(cap=total if one_shot else None)
            ray = self._ray
            self._replace_dead()
            actors = self._actors
            if total is not None and 0 < total < len(actors):
                actors = actors[:total]
            # the actors that share this process's files read the samples and write the outputs themselves
            folder = str(inputs) if isinstance(inputs, (str, os.PathLike)) else None
            if output is not None:
                make_output_folder(output)
            probes = [p for p in (folder, None if output is None else str(output)) if p is not None]
            infos = _worker_infos(ray, actors, self.model, probes)
            shares = _shares_files(ray, infos, probes, self.address)
            local_read = [ok and folder is not None for ok in shares]
            local_write = [ok and output is not None and on_result is None for ok in shares]
            here = _node_id(ray)
            ring_ok = [bool(info.get("shares_memory")) and here is not None and info.get("node") == here
                       and not (self.address or "").startswith("ray://") for info in infos]
            self._box = []
            result = _drive(ray, actors, infos, self.model, inputs, output, max_in_flight, chunk, on_result,
                            progress, self.address, self.backend, local_read, local_write, ring_ok, self._box)
        except BaseException:
            self.shutdown()  # nothing may keep running (or writing) after a run that did not finish
            raise
        d = self._box[0]
        self._dead = {k for k, dead in enumerate(d.dead) if dead}
        self._box = []
        result.start_s = start_s
        result.call_s = time.perf_counter() - t0
        return result

    def _replace_dead(self) -> None:
        """Actors Ray gave up on in an earlier run: killed and started afresh."""
        if not self._dead:
            return
        ray = self._ray
        for k in sorted(self._dead):
            with contextlib.suppress(Exception):
                ray.kill(self._actors[k], no_restart=True)
            self._actors[k] = _start_workers(ray, self.model, 1, self.backend, self.threads,
                                             remote=self.address is not None, run_id=uuid.uuid4().hex[:8])[0]
        self._dead = set()

    def shutdown(self) -> None:
        """End the actors and the local Ray cluster this pool started. Safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        if self._ray is not None:
            _stop(self._ray, self._actors, self._box, self._started)
        self._actors = []


def _stop(ray, actors: list, box: list, started: bool) -> None:
    """End the actors (and the local cluster this run started) before the output folder is cleaned: an
    actor killed asynchronously could otherwise still write a temporary file after the clean-up (a
    SIGTERM'd run must leave nothing)."""
    for a in actors:
        with contextlib.suppress(Exception):  # already gone
            ray.kill(a, no_restart=True)
    pending = list(box[0].pending) if box else []
    if pending:  # a killed actor's calls end with an error once it is dead
        with contextlib.suppress(BaseException):
            ray.wait(pending, num_returns=len(pending), timeout=30.0)
    if started:
        ray.shutdown()


def _check_before_ray(inputs: Any, npus: int | None, address: str | None) -> int | None:
    """What can be refused before Ray starts (starting it costs seconds, and a local cluster asked for
    100,000 NPUs would start workers until memory runs out): an input folder with no sample, and a
    local cluster asked for more NPUs than :func:`local_max_npus`. Returns the number of samples when
    it is known."""
    total: int | None = None
    if isinstance(inputs, (str, os.PathLike)):
        files, _ = input_files(inputs)
        if not files:
            raise InputError(f"--input-dir {inputs}: no .npy or .npz files in it",
                             hint="one sample per file: <id>.npy (one input) or <id>.npz (one member per input)")
        total = len(files)
    else:
        try:
            total = len(inputs)
        except TypeError:
            total = None
    ray = sys.modules.get("ray")  # a Ray session this process already runs declares its own NPUs
    joined = ray is not None and getattr(ray, "is_initialized", lambda: False)()
    if address is None and not joined and npus is not None and npus > local_max_npus():
        raise InputError(f"--npus {npus}: a local Ray cluster here runs at most {local_max_npus()} NPU workers "
                         f"(an Ascend host has at most {LOCAL_MAX_NPUS} NPUs; on the emulator more workers than "
                         "CPUs only share the same cores)",
                         hint=f"ask for at most --npus {local_max_npus()}, or give --ray-address of a cluster "
                              "declaring more NPUs")
    return total


def _node_id(ray) -> str | None:
    try:
        return ray.get_runtime_context().get_node_id()
    except Exception:  # not a driver on a node
        return None


def _shares_files(ray, infos: list[dict], probes: list[str], address: str | None) -> list[bool]:
    """For each actor: whether it sees the ``probes`` paths as the very files this process sees (same
    node, same device and inode); never through a Ray Client (``ray://``) connection."""
    here = _node_id(ray)
    if not probes or here is None or (address or "").startswith("ray://"):
        return [False] * len(infos)
    mine = _file_ids(probes)
    return [info.get("node") == here and None not in mine and info.get("probes") == mine for info in infos]


def _start_workers(ray, model: Path, n: int, backend: str, threads: int | None, *, remote: bool,
                   run_id: str) -> list:
    """``n`` started actors, each having answered once (its session opened and warmed up)."""
    cls = ray.remote(NpuWorker)
    model_ref = ray.put(model.read_bytes()) if remote else None
    actors = [cls.options(name=f"{WORKER_PREFIX}-{run_id}-{k}", resources={"NPU": 1}, num_cpus=0,
                          max_restarts=MAX_RESTARTS, max_task_retries=1)
              .remote(str(model.resolve()), backend, threads, model_ref) for k in range(n)]
    try:
        _ask(ray, actors, model, [a.info.remote() for a in actors])
    except BaseException:
        # not yet the pool's (its shutdown does not know them): a failed start, Ctrl-C or SIGTERM during
        # the wait must not leave them holding NPUs on a joined cluster
        _kill_all(ray, actors)
        raise
    return actors


def _kill_all(ray, actors: list) -> None:
    for a in actors:
        try:
            ray.kill(a, no_restart=True)
        except Exception:  # already gone
            pass


def _worker_infos(ray, actors: list, model: Path, probes: list[str]) -> list[dict]:
    """Each actor's :meth:`NpuWorker.info` for this run's folders and a fresh shared memory probe."""
    probe = _shm_probe()
    try:
        refs = [a.info.remote(list(probes), None if probe is None else (probe.name, bytes(probe.buf[:16])))
                for a in actors]
        return _ask(ray, actors, model, refs)
    finally:
        if probe is not None:
            probe.close()
            probe.unlink()


def _ask(ray, actors: list, model: Path, refs: list) -> list:
    n = len(actors)
    try:
        return ray.get(refs, timeout=ACTOR_START_TIMEOUT_S)
    except ray.exceptions.GetTimeoutError:
        _kill_all(ray, actors)
        raise ExternalError(f"{n} NPU workers did not start within {ACTOR_START_TIMEOUT_S:g} s "
                            f"(NPUs busy with other work?)", hint="check `ray status`") from None
    except ray.exceptions.RayActorError as e:
        _kill_all(ray, actors)
        cause = _actor_cause(e)
        raise (cause if isinstance(cause, NpuDeployError) else
               ExternalError(f"an NPU worker could not open {model} ({_first_line(e)})")) from None


def _shm_probe():
    """A small shared memory segment holding random bytes: an actor that reads them back shares this
    process's shared memory."""
    from multiprocessing import shared_memory

    try:
        probe = shared_memory.SharedMemory(create=True, size=16)
    except Exception:  # no POSIX shared memory here
        return None
    probe.buf[:16] = os.urandom(16)
    return probe


def _actor_cause(e) -> BaseException | None:
    cause = getattr(e, "cause", None)  # ActorDiedError wraps the RayTaskError of __init__
    inner = getattr(cause, "cause", None)
    return inner if isinstance(inner, BaseException) else cause


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[-1][:300] if text else type(e).__name__


def chunking(sample_bytes: int, npus: int, max_in_flight: int | None, chunk: int | None,
             total: int | None = None) -> tuple[int, int]:
    """(samples per Ray call, samples in flight): about :data:`CHUNK_BYTES` per call, and
    :data:`CHUNKS_IN_FLIGHT` calls per NPU; a given window is kept and shared so every NPU stays busy.
    When the number of samples is known, a chunk is at most a :data:`CHUNKS_IN_FLIGHT`-th of one NPU's
    share, so every NPU has work from the first chunks (16 small samples on 2 NPUs: 8 chunks of 2).

    >>> chunking(110_592, 2, None, None)     # PP-OCR cls [1,3,48,192] float32
    (75, 600)
    >>> chunking(32, 2, 5, None)
    (2, 5)
    >>> chunking(32, 2, None, None, total=16)
    (2, 1024)
    """
    size = chunk or max(1, min(MAX_CHUNK, CHUNK_BYTES // max(1, sample_bytes)))
    window = max_in_flight or CHUNKS_IN_FLIGHT * size * npus
    if total is not None and chunk is None:
        size = min(size, math.ceil(total / (npus * CHUNKS_IN_FLIGHT)))
    return max(1, min(size, window // npus)), window


class _Drive:
    """One batch run's bookkeeping: samples read and sent in chunks with backpressure, results taken back
    as Ray returns them, outputs put in place in input order (:meth:`run`)."""

    def __init__(self, ray, actors, infos, inputs, output, max_in_flight, chunk_size, on_result, progress,
                 local_read, local_write, ring_ok):
        self.ray, self.actors, self.infos = ray, actors, infos
        self.n = n = len(actors)
        self.max_in_flight, self.chunk_size, self.on_result = max_in_flight, chunk_size, on_result
        self.local_read, self.local_write, self.ring_ok = local_read, local_write, ring_ok
        # until the first sample tells its size: one sample per call, a window of CHUNKS_IN_FLIGHT per NPU
        self.size, self.window = 1, max_in_flight or CHUNKS_IN_FLIGHT * n
        self.sized = False
        self.input_names = infos[0]["inputs"]
        self.samples, self.total, self.warnings = _samples(inputs, self.input_names)
        self.writer = _Writer(output, infos[0]["outputs"]) if output is not None else None
        self.callback = progress if callable(progress) else None
        self.bar = _Progress(self.total, n) if progress is True or (progress is None and sys.stderr.isatty()) else None
        self.in_flight = [0] * n         # samples sent to each actor and not back
        self.dead = [False] * n
        self.lat = [_Latencies(seed=k) for k in range(n)]
        self.done_per = [0] * n
        self.failed_per = [0] * n
        self.restarted = [False] * n
        self.pending: dict = {}          # ObjectRef -> (worker, [sample, ...], [shared memory slot, ...], places)
        self.ring: _Ring | None = None   # for the samples sent to actors on this node
        self.finished: dict = {}         # index -> (sample, outputs | temporary output file | None, error | None)
        self.failures: list[SampleFailure] = []
        self.chunk: list[_Sample] = []
        self.sent = 0                    # samples in pending chunks
        self.next_index = 0
        self.count = self.ok = 0
        self.exhausted = False

    # -- in input order
    def flush(self) -> None:
        while self.next_index in self.finished:
            s, outs, err = self.finished.pop(self.next_index)
            self.next_index += 1
            if err is not None:
                self.failures.append(SampleFailure(s.id, err))
                continue
            if isinstance(outs, str):  # written by the actor: put in place here, in input order
                install_part(outs, s.dest)
            elif self.writer is not None:
                self.writer.write(s.dest, outs)
            if self.on_result is not None:
                self.on_result(s.id, outs)
            self.ok += 1

    # -- out to the actors
    def _pick(self) -> int:
        alive = [k for k in range(self.n) if not self.dead[k]]
        if not alive:
            raise ExternalError(f"every NPU worker died ({self.n} of {self.n}) after "
                                f"{self.count - len(self.chunk)} samples", hint="see the Ray logs (`ray logs`) for why")
        return min(alive, key=lambda j: self.in_flight[j])  # the least busy NPU: a slow one gets fewer

    def _in_ring(self, todo: list[_Sample]) -> tuple[_Chunk | None, list[int]]:
        """The chunk as places in the shared memory, or (None, []) when one sample does not fit."""
        slots, places = [], []
        for s in todo:
            got = self.ring.put(s.feeds)
            if got is None:
                self.ring.release_all(slots)
                return None, []
            slots.append(got[0])
            places.append(got[1])
        return _Chunk(slots=places, ring=self.ring.name), slots

    def submit(self) -> None:
        k = self._pick()
        todo, self.chunk = self.chunk, []
        slots: list[int] = []
        if self.local_read[k]:
            call = _Chunk(paths=[str(s.path) for s in todo])
        else:
            for s in todo:
                _read(s, self.input_names)
                if s.error is not None:
                    self.finished[s.index] = (s, None, s.error)
            todo = [s for s in todo if s.error is None]
            if not todo:
                return
            call = None
            if self.ring is not None and self.ring_ok[k]:
                call, slots = self._in_ring(todo)
            if call is None:  # through Ray
                call = _Chunk(feeds=[s.feeds for s in todo])
            for s in todo:
                s.feeds = None  # the chunk (or the shared memory) holds them now; a retry is Ray's
        if self.local_write[k]:
            call.dests = [str(s.dest) for s in todo]
        self.pending[self.actors[k].run.remote(call)] = (k, todo, slots, call.slots)
        self.in_flight[k] += len(todo)
        self.sent += len(todo)

    def _room(self) -> bool:
        return self.sent + len(self.chunk) + len(self.finished) < self.window

    def read_more(self) -> None:
        """Backpressure: read only while fewer than the window's samples are read and not yet written."""
        while not self.exhausted and self._room():
            s = next(self.samples, None)
            if s is None:
                self.exhausted = True
                break
            self.count += 1
            if self.writer is not None:
                s.dest = self.writer.path_for(s.id)
            if s.error is not None:
                self.finished[s.index] = (s, None, s.error)
                continue
            if not self.sized:
                self.size, self.window = chunking(s.nbytes(), self.n, self.max_in_flight, self.chunk_size,
                                                  total=self.total)
                self.sized = True
                if s.feeds is not None and any(self.ring_ok) and not all(self.local_read):
                    self.ring = _Ring.for_samples(self.window, s.nbytes())
            self.chunk.append(s)
            if len(self.chunk) >= self.size:
                self.submit()
        if self.chunk and (self.exhausted or not self._room()):
            self.submit()

    # -- back from the actors
    def _fail(self, k: int, todo: list[_Sample], why: str) -> None:
        self.failed_per[k] += len(todo)
        for s in todo:
            self.finished[s.index] = (s, None, why)

    def take(self, ref) -> None:
        ray = self.ray
        k, todo, slots, places = self.pending.pop(ref)
        self.in_flight[k] -= len(todo)
        self.sent -= len(todo)
        try:
            was_restarted, results = ray.get(ref)
            if results is None:  # restarted where our shared memory is not: the arrays, copied out
                for s, place in zip(todo, places or ()):
                    s.feeds = self.ring.get(place)
        except ray.exceptions.RayActorError as e:
            # Ray already restarted the actor and retried this chunk once; it died again
            if isinstance(e, ray.exceptions.ActorDiedError):
                self.dead[k] = True
            self.restarted[k] = True
            self._fail(k, todo, f"NPU worker {k} died while running it, also on the retry ({_first_line(e)})")
            return
        except ray.exceptions.RayError as e:
            self._fail(k, todo, f"Ray could not run it ({_first_line(e)})")
            return
        finally:
            if self.ring is not None:
                self.ring.release_all(slots)
        self.restarted[k] = self.restarted[k] or was_restarted
        if results is None:  # ... and sent to it (or another NPU) through Ray from now on
            self.ring_ok[k] = False
            self.chunk = todo + self.chunk
            self.submit()
            return
        for s, (good, value, seconds) in zip(todo, results):
            if good is None:  # the actor could not write an output: as if this process could not
                raise value
            if good:
                self.lat[k].add(seconds)
                self.done_per[k] += 1
                self.finished[s.index] = (s, value, None)
            else:
                self.failed_per[k] += 1
                self.finished[s.index] = (s, None, value)

    def _report_progress(self) -> None:
        done = self.count - self.sent - len(self.chunk) - len(self.finished)
        if self.callback is not None:
            self.callback(done, self.total, len(self.failures))
        if self.bar is not None:
            self.bar.update(done, len(self.failures))

    def run(self) -> None:
        stopped = True
        try:
            while True:
                self.read_more()
                self.flush()
                self._report_progress()
                if not self.pending:
                    if self.exhausted and not self.finished and not self.chunk:
                        break
                    continue
                ready = _wait_one(self.ray, list(self.pending))
                for ref in ready:
                    self.take(ref)
            stopped = False
        finally:  # outputs the actors wrote and that were not put in place: removed (a stopped run)
            if stopped and self.pending and self.writer is not None:
                self._drain()
            if self.ring is not None:
                self.ring.close()
            for _, value, _ in self.finished.values():
                if isinstance(value, str):
                    with contextlib.suppress(OSError):
                        os.unlink(value)

    def _drain(self, timeout: float = DRAIN_TIMEOUT_S) -> None:
        """A stopped run writing into a folder: the chunks still in flight are let finish (an actor
        returns only once its part is written, or removed on an error) and the parts they return are
        removed, so the run leaves no file behind whatever the actors were doing when it stopped. Waits
        in steps of 1 s (a signal still ends it) and at most ``timeout``; a chunk that takes longer is
        left to the stale-part rule once its actor has ended."""
        deadline = time.monotonic() + timeout
        with contextlib.suppress(BaseException):
            while self.pending and time.monotonic() < deadline:
                ready, _ = self.ray.wait(list(self.pending), num_returns=len(self.pending), timeout=1.0)
                for ref in ready:
                    self.pending.pop(ref, None)
                    with contextlib.suppress(Exception):
                        _, results = self.ray.get(ref)
                        for good, value, _ in results or ():
                            if good and isinstance(value, str):
                                with contextlib.suppress(OSError):
                                    os.unlink(value)

    def result(self, model, address, backend, output, wall: float) -> BatchResult:
        if self.bar is not None:
            self.bar.update(self.count, len(self.failures), final=True)
        workers = []
        for k, info in enumerate(self.infos):
            workers.append(NpuStats(worker=k, device=info["device"], node=info["node"], backend=info["backend"],
                                    samples=self.done_per[k], failed=self.failed_per[k],
                                    throughput_per_s=self.done_per[k] / wall if wall > 0 else 0.0,
                                    latency=self.lat[k].stats(), restarted=self.restarted[k],
                                    pid=info.get("pid")))
        _mark_stragglers(workers)
        return BatchResult(model=str(model), backend=workers[0].backend if workers else backend, address=address,
                           npus=self.n, samples=self.count, ok=self.ok, wall_s=wall,
                           throughput_per_s=self.ok / wall if wall > 0 else 0.0, max_in_flight=self.window,
                           output_dir=str(output) if output is not None else None, workers=workers,
                           failures=self.failures, warnings=self.warnings)


def _wait_one(ray, refs: list) -> list:
    """The refs of ``refs`` that are done, waiting at most 1 s (so a signal is seen within 1 s). A signal
    handler that raises while Ray's compiled ``wait`` runs surfaces as a ``SystemError`` ("returned a
    result with an exception set") caused by what the handler raised: that exception is raised instead,
    so a SIGTERM/Ctrl-C unwinds the run as anywhere else (exit 143/130, not an internal error)."""
    try:
        ready, _ = ray.wait(refs, num_returns=1, timeout=1.0)
    except SystemError as e:
        cause = e.__cause__ or e.__context__
        if isinstance(cause, BaseException) and not isinstance(cause, Exception):
            raise cause from None
        raise
    return ready


def _drive(ray, actors, infos, model, inputs, output, max_in_flight, chunk_size, on_result, progress, address,
           backend, local_read, local_write, ring_ok, box: list | None = None) -> BatchResult:
    t0 = time.perf_counter()
    d = _Drive(ray, actors, infos, inputs, output, max_in_flight, chunk_size, on_result, progress,
               local_read, local_write, ring_ok)
    if box is not None:
        box.append(d)
    d.run()
    return d.result(model, address, backend, output, time.perf_counter() - t0)
