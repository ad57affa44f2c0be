"""npu_deploy.converters: ONNX in, offline model out.

Four layers, each importing only the ones before it (``tests/test_layers.py`` checks it):

``formats``   the format algebra: every CANN storage format as data; pack/unpack/offsets, the copy
              kernel, TransData as ONNX subgraphs. Imports nothing of npu_deploy but ``errors``.
``files``     model files: ONNX loading and validation, the offline bundle (reader and writer), ``.om``
              files, ACL operator dumps. May import ``formats``.
``lowering``  ONNX → device plan → bundle or ATC: options, the step pipeline, the planner and its passes,
              fusion, op support, memory plan, cost model, AIPP, the ATC driver, ``convert``. May import
              ``formats`` and ``files``.
``optimize``  the Ascend rewrites of ``npu-deploy optimize`` (rules, registry, verify-and-measure driver).
              May import ``formats``, ``files`` and ``lowering``.

Nothing here imports ``npu_deploy.runtime``, ``npu_deploy.profiling`` or ``npu_deploy.cli``.
"""
