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
  ``chunk`` (default: about 8 MiB of input, 1 to 128 samples: one Ray call per chunk), each to the actor
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
with one member per output, each written atomically and put in place in input order. An actor that
sees the same files as this process (same node, same device and inode of the folders) reads its
samples and writes its outputs itself: only file names cross Ray, the actor writes each output to a
temporary file beside it and this process renames it into place. Other actors get the arrays through
Ray's object store and send the outputs back. The files are the same either way (tested). Samples
given as arrays reach the actors of this node through one shared memory segment of one slot per sample
in flight (:class:`_Ring`; a chunk then carries offsets), those of other nodes through Ray's object store.

Built on Ray core actors, not Ray Data: per-sample ids and failures, writes in input order and the
retry-once rule are explicit here, and an actor pool of ``map_batches`` would hide them. For a pipeline
that is already a Ray Dataset, :class:`NpuPredictor` is the same worker as a ``map_batches`` class.
Ray is an optional dependency: ``pip install '.[ray]'`` in the clone (not on PyPI).

>>> from npu_deploy.distributed import run_batch                           # doctest: +SKIP
>>> result = run_batch("cls.bundle", "inputs/", npus=2, output="outputs/")  # doctest: +SKIP
>>> print(result.verdict())                                                 # doctest: +SKIP
1000 samples on 2 NPUs in 4.1 s (243.9/s): all ok
"""

from __future__ import annotations

import contextlib
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

from npu_deploy._io import (atomic_write, clean_parts_once, clean_stale_parts, install_part, load_npy, load_npz, make_output_folder, safe_file_stem,
                            same_file, write_part)
from npu_deploy._ray import connect, import_ray
from npu_deploy._result import Result
from npu_deploy._text import printable
from npu_deploy.errors import ExternalError, InputError, ModelError, NpuDeployError
from npu_deploy.runtime.bench import LatencyStats, latency_stats
from npu_deploy.runtime.session import sniff_model

#: bytes of input sent to an actor in one call when ``chunk`` is not given: a Ray call costs a fixed
#: part (round trip, object store) that this many bytes share; at least 1, at most MAX_CHUNK samples
CHUNK_BYTES = 8 << 20
MAX_CHUNK = 128
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
    path: Path | None = None    # a sample file not read yet (the actor reads it when it shares the file system)
    dest: Path | None = None    # where its outputs go (output folder given)

    def nbytes(self) -> int:
        if self.feeds is not None:
            return sum(getattr(a, "nbytes", 0) for a in self.feeds.values())
        try:
            return self.path.stat().st_size if self.path is not None else 0
        except OSError:
            return 0


@dataclass
class _Chunk:
    """What one Ray call carries to an actor: the samples, as arrays, as places in the driver's shared
    memory (:class:`_Ring`) or as files the actor reads itself, and, when the actor writes the outputs
    itself, their destinations (it writes each to a temporary file beside its destination and the
    driver renames it there, in input order)."""

    feeds: list[dict] | None = None      # one dict per sample
    slots: list[dict] | None = None      # or {input: (offset, shape, dtype)} in the shared memory `ring`
    ring: str | None = None
    paths: list[str] | None = None       # or the sample files
    dests: list[str] | None = None

    def __len__(self) -> int:
        return len(next(x for x in (self.feeds, self.slots, self.paths) if x is not None))

    def sample(self, i: int, input_names: list[str], ring_buffer=None) -> dict:
        if self.slots is not None:
            feeds = {}
            for name, (offset, shape, dtype) in self.slots[i].items():
                a = np.ndarray(shape, np.dtype(dtype), buffer=ring_buffer, offset=offset)
                a.flags.writeable = False  # the driver's memory: read, never written
                feeds[name] = a
            return feeds
        if self.feeds is not None:
            return self.feeds[i]
        return _feeds_from_file(Path(self.paths[i]), input_names)


#: shared memory for samples in flight is used only when /dev/shm keeps at least this many times its size free
RING_SHM_MARGIN = 4
#: and when it is at most this large (beyond, the samples go through Ray's object store)
RING_MAX_BYTES = 1 << 30
_ALIGN = 64


class _Ring:
    """Shared memory where the driver puts the samples it sends to actors on its own node: a chunk then
    carries only offsets, and no Ray object is created per chunk (on 2 cores, Ray's object store cost
    the driver and the raylet about 10 % of PP-OCR cls's throughput). One slot per sample in flight
    (the window), sized by the first sample; a slot is reused once the chunk holding it came back, so
    that Ray's retry of a chunk on a restarted actor reads the same bytes. A sample that does not fit
    (larger, non-numeric) goes through Ray as before."""

    def __init__(self, slots: int, slot_bytes: int):
        from multiprocessing import shared_memory

        self.slot_bytes = slot_bytes
        self.shm = shared_memory.SharedMemory(create=True, size=max(1, slots * slot_bytes))
        self.name = self.shm.name
        self.free = list(range(slots - 1, -1, -1))

    @classmethod
    def for_samples(cls, slots: int, sample_bytes: int) -> "_Ring | None":
        slot = -(-max(1, sample_bytes) // _ALIGN) * _ALIGN + _ALIGN * 4  # room for a few inputs' alignment
        size = slots * slot
        if size > RING_MAX_BYTES or not os.path.isdir("/dev/shm"):
            return None
        try:
            st = os.statvfs("/dev/shm")
            if st.f_bavail * st.f_frsize < RING_SHM_MARGIN * size:  # a container's small /dev/shm
                return None
            return cls(slots, slot)
        except (OSError, ValueError):
            return None

    def put(self, feeds: dict) -> tuple[int, dict] | None:
        """(slot, {input: (offset, shape, dtype)}) with the arrays copied in, or None (no room, not numeric)."""
        if not self.free:
            return None
        places, at = {}, 0
        for name, a in feeds.items():
            if not (isinstance(a, np.ndarray) and a.dtype.kind in "biufc?" and not a.dtype.hasobject):
                return None
            places[name] = (at, a.shape, a.dtype.str)
            at += -(-a.nbytes // _ALIGN) * _ALIGN
        if at > self.slot_bytes:
            return None
        slot = self.free.pop()
        base = slot * self.slot_bytes
        for name, a in feeds.items():
            off, shape, dtype = places[name]
            view = np.ndarray(shape, a.dtype, buffer=self.shm.buf, offset=base + off)
            view[...] = a
            places[name] = (base + off, shape, dtype)
        return slot, places

    def get(self, places: dict) -> dict:
        """Copies of the arrays :meth:`put` placed."""
        return {name: np.ndarray(shape, np.dtype(dtype), buffer=self.shm.buf, offset=off).copy()
                for name, (off, shape, dtype) in places.items()}

    def release_all(self, slots: list[int]) -> None:
        self.free.extend(slots)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.shm.close()
        with contextlib.suppress(Exception):
            self.shm.unlink()


def attach_shared_memory(name: str):
    """A shared memory segment another process created, attached without Python's resource tracker
    adopting it (before 3.13 an attaching process's tracker unlinks the segment when it exits)."""
    from multiprocessing import shared_memory

    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, track=False)
    shm = shared_memory.SharedMemory(name=name)
    from multiprocessing import resource_tracker

    with contextlib.suppress(Exception):
        resource_tracker.unregister(shm._name, "shared_memory")  # noqa: SLF001 (the documented work-around)
    return shm


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
    """(samples, how many if known, warnings). The samples of a folder come as paths, read where they
    are run (:func:`_read`); those of an iterable as it is consumed."""
    if isinstance(inputs, (str, os.PathLike)):
        files, other = input_files(inputs)
        if not files:
            raise InputError(f"--input-dir {inputs}: no .npy or .npz files in it",
                             hint="one sample per file: <id>.npy (one input) or <id>.npz (one member per input)")
        warnings = []
        if other:
            shown = ", ".join(printable(n) for n in other[:5])
            what = "entry that is not a .npy/.npz file was" if len(other) == 1 else "entries that are not .npy/.npz files were"
            warnings.append(f"{inputs}: {len(other)} {what} left alone "
                            f"({shown}{', ...' if len(other) > 5 else ''})")
        return (_Sample(i, p.name, path=p) for i, p in enumerate(files)), len(files), warnings

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


def _read(s: _Sample, input_names: list[str]) -> None:
    """Read a sample file in this process (for an actor that does not share its file system)."""
    if s.path is not None and s.feeds is None and s.error is None:
        try:
            s.feeds = _feeds_from_file(s.path, input_names)
        except NpuDeployError as e:
            s.error = str(e)


# ------------------------------------------------------------------------------------------ outputs
def write_outputs(f, outs: list[np.ndarray], names: list[str]) -> None:
    """One sample's outputs into an open file: ``.npy`` for one output, else ``.npz`` (member per output)."""
    if len(outs) == 1:
        np.save(f, outs[0], allow_pickle=False)
    else:
        np.savez(f, **{safe_file_stem(n): a for n, a in zip(names, outs)})


class _Writer:
    """One file per sample in ``folder``: ``<id>.npy`` (one output) or ``<id>.npz``; names kept distinct.
    Every sample gets its name in input order whether it fails or not, so that the names do not depend on
    which samples fail."""

    def __init__(self, folder: str | os.PathLike, output_names: list[str]):
        self.folder = make_output_folder(folder)
        # stale parts of earlier runs go now, not at this process's first write: by then a finished part
        # of an actor that died since may be waiting to be put in place
        clean_parts_once(self.folder)
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

    def write(self, path: Path, outs: list[np.ndarray]) -> Path:
        with atomic_write(path, "wb") as f:
            write_outputs(f, outs, self.names)
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
        self.input_names = [m.name for m in self.session.get_inputs()]
        self.output_names = [m.name for m in self.session.get_outputs()]
        self._warm_up()

    def _warm_up(self) -> None:
        """One run on zeros before the first sample (a session's first run sets up what the next ones
        reuse: 80 ms for PP-OCR cls on the emulator, against 1.2 ms for the next); skipped when an input
        has no concrete shape, and whatever the model says of zeros."""
        feeds = {}
        for m in self.session.get_inputs():
            shape = tuple(m.gears[0]) if getattr(m, "gears", None) else tuple(m.shape)
            if not all(isinstance(d, int) and d >= 0 for d in shape):
                return
            feeds[m.name] = np.zeros(shape, np.dtype(m.dtype))
        try:
            self.session.run(None, feeds)
        except Exception:  # a model may refuse zeros; the samples will say what it accepts
            pass

    def _ring_buffer(self, name: str | None):
        if name is None:
            return None
        if getattr(self, "_ring_name", None) != name:
            old = getattr(self, "_ring", None)
            if old is not None:
                with contextlib.suppress(Exception):
                    old.close()
            self._ring, self._ring_name = attach_shared_memory(name), name
        return self._ring.buf

    def info(self, probes: list[str] = (), shm_probe: tuple[str, bytes] | None = None) -> dict:
        """Who this actor is, the model's input and output names, and ``(st_dev, st_ino)`` of each
        ``probes`` path as this actor sees it (None where it cannot): the driver compares them with its
        own to know whether the actor shares its files."""
        shares_memory = False
        if shm_probe is not None:  # does this actor see the driver's shared memory (same node, same /dev/shm)?
            try:
                probe = attach_shared_memory(shm_probe[0])
                shares_memory = bytes(probe.buf[:len(shm_probe[1])]) == shm_probe[1]
                probe.close()
            except Exception:
                shares_memory = False
        return {"device": self.device, "node": self.node, "backend": self.backend, "pid": os.getpid(),
                "inputs": self.input_names, "outputs": self.output_names, "probes": _file_ids(probes),
                "shares_memory": shares_memory}

    def run(self, chunk: _Chunk) -> tuple:
        """``(restarted, [(ok, outputs | temporary output file | error text, seconds), ...])`` for a chunk
        of samples (``None`` for the list: this actor cannot see the chunk's shared memory; ``ok`` None:
        an output could not be written, the error object follows and the chunk ends there); the seconds
        are the session's run. A bad sample never kills the actor nor the rest of its chunk."""
        out = []
        try:
            ring = self._ring_buffer(chunk.ring)
        except Exception:  # restarted where the driver's shared memory is not: the driver resends the arrays
            return self.restarted, None
        for i in range(len(chunk)):
            seconds = 0.0
            try:
                feeds = chunk.sample(i, self.input_names, ring)
                t0 = time.perf_counter()
                outs = self.session.run(None, feeds)
                seconds = time.perf_counter() - t0
                if chunk.dests is not None:
                    try:
                        outs = str(self._write(chunk.dests[i], outs))
                    except NpuDeployError as e:  # the output folder, not the sample: the driver stops the run
                        out.append((None, e, seconds))
                        return self.restarted, out
                out.append((True, outs, seconds))
            except NpuDeployError as e:
                out.append((False, str(e), seconds))
            except Exception as e:  # onnxruntime / ACL raise their own types: report, keep serving
                text = str(e).splitlines()[0][:300] if str(e) else ""
                out.append((False, f"{type(e).__name__}: {text}", seconds))
        return self.restarted, out

    def _write(self, dest: str, outs: list) -> Path:
        return write_part(dest, lambda f: write_outputs(f, outs, self.output_names))


class NpuPredictor(NpuWorker):
    """For Ray Data pipelines: one session per actor on its NPU, for ``Dataset.map_batches``.

    >>> ds = ds.map_batches(NpuPredictor, fn_constructor_kwargs={"model": "cls.bundle"},   # doctest: +SKIP
    ...                     concurrency=8, num_cpus=0, resources={"NPU": 1}, batch_format="numpy")

    Each batch (``{column: array of rows}``) runs row by row through the session: the columns named after
    the model inputs feed it (``columns={"x": "image"}`` maps an input to another column; a one-input
    model takes the batch's only column when names differ), every column passes through, and each model
    output becomes a column of the same name. A row the model refuses raises, as Ray Data expects (its
    own ``max_errored_blocks`` decides what then happens; Ray Data 2.60 then keeps the actor, and its NPU,
    until the driver ends); :func:`run_batch` is the path that reports failures per sample and writes
    files. Devices, warm-up and the ``.om``/bundle choice are those of :func:`run_batch`'s workers.
    """

    def __init__(self, model: str | os.PathLike, backend: str = "auto", threads: int | None = None,
                 columns: dict[str, str] | None = None):
        super().__init__(str(model), backend, threads)
        self.columns = dict(columns or {})

    def _column_of(self, name: str, batch: dict) -> str:
        col = self.columns.get(name, name)
        if col in batch:
            return col
        if len(self.input_names) == 1 and len(batch) == 1 and not self.columns:
            return next(iter(batch))
        raise InputError(f"model input {name!r}: no column {col!r} in the batch (columns: {', '.join(batch)})",
                         hint="name the column after the input, or pass columns={input: column}")

    def __call__(self, batch: dict) -> dict:
        cols = {name: self._column_of(name, batch) for name in self.input_names}
        rows = len(batch[next(iter(cols.values()))]) if cols else 0
        results = [self.session.run(None, {name: np.asarray(batch[col][i]) for name, col in cols.items()})
                   for i in range(rows)]
        out = dict(batch)
        for j, name in enumerate(self.output_names):
            out[name] = np.stack([r[j] for r in results]) if results else np.zeros((0,), np.float32)
        return out


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
        # the actors that share this process's files read the samples and write the outputs themselves
        folder = str(inputs) if isinstance(inputs, (str, os.PathLike)) else None
        if output is not None:
            make_output_folder(output)
        probes = [p for p in (folder, None if output is None else str(output)) if p is not None]
        actors, infos = _start_workers(ray, model, n, backend, threads, remote=address is not None, probes=probes)
        shares = _shares_files(ray, infos, probes, address)
        local_read = [ok and folder is not None for ok in shares]
        local_write = [ok and output is not None and on_result is None for ok in shares]
        here = _node_id(ray)
        ring_ok = [bool(info.get("shares_memory")) and here is not None and info.get("node") == here
                   and not (address or "").startswith("ray://") for info in infos]
        return _drive(ray, actors, infos, model, inputs, output, max_in_flight, chunk, on_result, progress,
                      address, backend, local_read, local_write, ring_ok)
    finally:
        for a in actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:  # already gone
                pass
        if output is not None:  # parts of actors that died while writing (their pid names them)
            clean_stale_parts(output)
        if started:
            ray.shutdown()


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
                   probes: list[str] = ()):
    run_id = uuid.uuid4().hex[:8]
    cls = ray.remote(NpuWorker)
    model_ref = ray.put(model.read_bytes()) if remote else None
    actors = [cls.options(name=f"{WORKER_PREFIX}-{run_id}-{k}", resources={"NPU": 1}, num_cpus=0,
                          max_restarts=MAX_RESTARTS, max_task_retries=1)
              .remote(str(model.resolve()), backend, threads, model_ref) for k in range(n)]
    probe = _shm_probe()
    try:
        refs = [a.info.remote(list(probes), None if probe is None else (probe.name, bytes(probe.buf[:16])))
                for a in actors]
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
    finally:
        if probe is not None:
            probe.close()
            probe.unlink()
    return actors, infos


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


def _file_ids(paths: list[str]) -> list:
    """``(st_dev, st_ino)`` of each path as this process sees it (None where it cannot)."""
    ids = []
    for p in paths:
        try:
            st = os.stat(p)
            ids.append((st.st_dev, st.st_ino))
        except OSError:
            ids.append(None)
    return ids


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
    (75, 600)
    >>> chunking(32, 2, 5, None)
    (2, 5)
    """
    size = chunk or max(1, min(MAX_CHUNK, CHUNK_BYTES // max(1, sample_bytes)))
    window = max_in_flight or CHUNKS_IN_FLIGHT * size * npus
    return max(1, min(size, window // npus)), window


def _drive(ray, actors, infos, model, inputs, output, max_in_flight, chunk_size, on_result, progress, address,
           backend, local_read, local_write, ring_ok) -> BatchResult:
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
    pending: dict = {}          # ObjectRef -> (worker, [sample, ...], [shared memory slot, ...], their places)
    ring: _Ring | None = None   # for the samples sent to actors on this node
    finished: dict = {}         # index -> (sample, outputs | temporary output file | None, error | None)
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
            s, outs, err = finished.pop(next_index)
            next_index += 1
            if err is not None:
                failures.append(SampleFailure(s.id, err))
                continue
            if isinstance(outs, str):  # written by the actor: put in place here, in input order
                install_part(outs, s.dest)
            elif writer is not None:
                writer.write(s.dest, outs)
            if on_result is not None:
                on_result(s.id, outs)
            ok += 1

    def submit() -> None:
        nonlocal chunk, sent
        alive = [k for k in range(n) if not dead[k]]
        if not alive:
            raise ExternalError(f"every NPU worker died ({n} of {n}) after {count - len(chunk)} samples",
                                hint="see the Ray logs (`ray logs`) for why")
        k = min(alive, key=lambda j: in_flight[j])  # the least busy NPU: a slow one gets fewer
        todo, chunk = chunk, []
        if local_read[k]:
            call, slots = _Chunk(paths=[str(s.path) for s in todo]), []
        else:
            for s in todo:
                _read(s, input_names)
            for s in todo:
                if s.error is not None:
                    finished[s.index] = (s, None, s.error)
            todo = [s for s in todo if s.error is None]
            if not todo:
                return
            call, slots = _Chunk(feeds=[s.feeds for s in todo]), []
            if ring is not None and ring_ok[k]:
                places = []
                for s in todo:
                    got = ring.put(s.feeds)
                    if got is None:
                        break
                    slots.append(got[0])
                    places.append(got[1])
                if len(places) == len(todo):
                    call = _Chunk(slots=places, ring=ring.name)
                else:  # one did not fit: this chunk goes through Ray
                    ring.release_all(slots)
                    slots = []
            for s in todo:
                s.feeds = None  # the chunk (or the shared memory) holds them now; a retry is Ray's
        if local_write[k]:
            call.dests = [str(s.dest) for s in todo]
        pending[actors[k].run.remote(call)] = (k, todo, slots, call.slots)
        in_flight[k] += len(todo)
        sent += len(todo)

    try:
        while True:
            # backpressure: read only while fewer than `window` samples are read and not yet written
            while not exhausted and sent + len(chunk) + len(finished) < window:
                s = next(samples, None)
                if s is None:
                    exhausted = True
                    break
                count += 1
                if writer is not None:
                    s.dest = writer.path_for(s.id)
                if s.error is not None:
                    finished[s.index] = (s, None, s.error)
                else:
                    if not sized:
                        size, window = chunking(s.nbytes(), n, max_in_flight, chunk_size)
                        sized = True
                        if s.feeds is not None and any(ring_ok) and not all(local_read):
                            ring = _Ring.for_samples(window, s.nbytes())
                    chunk.append(s)
                    if len(chunk) >= size:
                        submit()
            if chunk and (exhausted or sent + len(chunk) + len(finished) >= window):
                submit()
            flush()
            done = count - sent - len(chunk) - len(finished)
            if callback is not None:
                callback(done, total, len(failures))
            if bar is not None:
                bar.update(done, len(failures))
            if not pending:
                if exhausted and not finished and not chunk:
                    break
                continue
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=None)
            for ref in ready:
                k, todo, slots, places = pending.pop(ref)
                in_flight[k] -= len(todo)
                sent -= len(todo)
                try:
                    was_restarted, results = ray.get(ref)
                    if results is None:  # restarted where our shared memory is not: the arrays, copied out
                        for s, place in zip(todo, places or ()):
                            s.feeds = ring.get(place)
                except ray.exceptions.RayActorError as e:
                    # Ray already restarted the actor and retried this chunk once; it died again
                    if isinstance(e, ray.exceptions.ActorDiedError):
                        dead[k] = True
                    restarted[k] = True
                    failed_per[k] += len(todo)
                    for s in todo:
                        finished[s.index] = (s, None, f"NPU worker {k} died while running it, also on the retry "
                                                      f"({_first_line(e)})")
                    continue
                except ray.exceptions.RayError as e:
                    failed_per[k] += len(todo)
                    for s in todo:
                        finished[s.index] = (s, None, f"Ray could not run it ({_first_line(e)})")
                    continue
                finally:
                    if ring is not None:
                        ring.release_all(slots)
                restarted[k] = restarted[k] or was_restarted
                if results is None:  # ... and sent to it (or another NPU) through Ray from now on
                    ring_ok[k] = False
                    chunk = todo + chunk
                    submit()
                    continue
                for s, (good, value, seconds) in zip(todo, results):
                    if good is None:  # the actor could not write an output: as if this process could not
                        raise value
                    if good:
                        lat[k].add(seconds)
                        done_per[k] += 1
                        finished[s.index] = (s, value, None)
                    else:
                        failed_per[k] += 1
                        finished[s.index] = (s, None, value)
    finally:  # outputs the actors wrote and that were not put in place: removed (a stopped run)
        if ring is not None:
            ring.close()
        for _, value, _ in finished.values():
            if isinstance(value, str):
                with contextlib.suppress(OSError):
                    os.unlink(value)
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
