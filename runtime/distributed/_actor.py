"""The Ray actor body: one session on the actor's NPU (:class:`NpuWorker`), and the same worker as a
Ray Data ``map_batches`` class (:class:`NpuPredictor`)."""

from __future__ import annotations

import contextlib
import inspect
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from npu_deploy._io import write_part
from npu_deploy.errors import InputError, NpuDeployError
from npu_deploy.runtime.distributed._ring import attach_shared_memory
from npu_deploy.runtime.distributed._samples import _Chunk, write_outputs
from npu_deploy.runtime.session import sniff_model
from npu_deploy.runtime.emulator import EmulatorBackend
from npu_deploy.runtime.session import InferenceSession


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

    be = EmulatorBackend(path, session_options=opts)
    be.activate()
    return be


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
