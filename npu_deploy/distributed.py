"""Batch inference over many NPUs on Ray: ``npu_deploy.runtime.distributed`` under its public name.

>>> from npu_deploy.distributed import run_batch        # doctest: +SKIP

``NpuPool`` keeps the actors alive between batch runs (only the first call pays their start).

``NpuPredictor`` is the same worker for Ray Data's ``Dataset.map_batches``.

Needs Ray: ``pip install '.[ray]'`` in the clone, not on PyPI (imported when a run starts, not here).
"""

from npu_deploy.runtime.distributed import (  # noqa: F401
    BatchResult,
    NpuPool,
    NpuPredictor,
    NpuStats,
    SampleFailure,
    device_id_for,
    input_files,
    run_batch,
)

__all__ = ["run_batch", "NpuPool", "NpuPredictor", "BatchResult", "NpuStats", "SampleFailure", "device_id_for", "input_files"]
