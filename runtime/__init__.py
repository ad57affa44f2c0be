"""npu_deploy.runtime: models executed, and the workflows that judge them.

Execution: ``session`` (InferenceSession), ``backend`` (the one backend interface), ``emulator`` and
``executable`` (the bundle's plan on the CPU through onnxruntime), ``acl`` / ``acl_codes`` / ``device``
(pyACL or acllite on an Ascend host), ``bench``, ``device_time``, ``onnx_backend`` (the ONNX backend-test
adapter). ``check`` holds the workflows that judge (compare, debug compare, precision search, inspect,
``--against``); ``distributed`` runs batches over many NPUs on Ray. May import ``npu_deploy.converters``;
never ``npu_deploy.profiling`` or ``npu_deploy.cli``.
"""
