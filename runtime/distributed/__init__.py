"""Batch inference over many NPUs (and hosts) on Ray: one actor per NPU, results in input order.

This ``__init__`` is the public face; the parts live beside it, as Ray lays out its own libraries:
``_driver`` (:func:`run_batch`, the streaming loop), ``_actor`` (:class:`NpuWorker`, :class:`NpuPredictor`),
``_samples`` (reading samples, writing outputs), ``_ring`` (shared memory for samples in flight) and
``_results`` (:class:`BatchResult`). Imports go that way only: ``_driver`` < ``_actor`` < ``_samples``.

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
  sample failed". ``call_s`` is what the caller waited (call to return, Ray and actor
  start included, ``start_s`` of it), ``wall_s`` the run once every actor had answered.
* **Live actors.** :func:`run_batch` starts its actors and ends them before it returns. ``NpuPool(model,
  npus=N)`` keeps them for repeated ``pool.run_batch(inputs)`` calls: only the first pays the start;
  ``pool.shutdown()`` (or leaving its ``with`` block) ends them, and the local cluster it started.

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


from npu_deploy.runtime.distributed._actor import NpuPredictor, NpuWorker, device_id_for, open_session
from npu_deploy.runtime.distributed._driver import (ACTOR_START_TIMEOUT_S, CHUNK_BYTES, CHUNKS_IN_FLIGHT,
                                                    LOCAL_MAX_NPUS, MAX_CHUNK, WORKER_PREFIX, NpuPool, chunking,
                                                    cluster_npus, local_max_npus, run_batch)
from npu_deploy.runtime.distributed._results import BatchResult, NpuStats, SampleFailure
from npu_deploy.runtime.distributed._ring import _Ring, attach_shared_memory
from npu_deploy.runtime.distributed._samples import INPUT_SUFFIXES, _Writer, input_files, write_outputs
from npu_deploy.runtime.distributed._results import _Latencies

__all__ = ["run_batch", "NpuPool", "NpuPredictor", "NpuWorker", "BatchResult", "NpuStats", "SampleFailure", "device_id_for",
           "input_files", "open_session", "write_outputs", "attach_shared_memory", "chunking", "cluster_npus",
           "local_max_npus", "ACTOR_START_TIMEOUT_S", "CHUNK_BYTES", "CHUNKS_IN_FLIGHT", "LOCAL_MAX_NPUS",
           "MAX_CHUNK", "WORKER_PREFIX", "INPUT_SUFFIXES"]
