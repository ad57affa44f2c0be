"""npu_deploy.runtime.check: the workflows that judge a model, a plan or a file.

``compare`` (outputs against onnxruntime, tolerances, verdict), ``debug_compare`` (dumps against
onnxruntime per layer), ``precision`` (which ops to keep in float32), ``inspect`` (what an ONNX model,
bundle, ``.om`` or dump holds) and ``against`` (ATC's ``.om`` against the built-in plan). May import
``npu_deploy.runtime`` (execution) and ``npu_deploy.converters``.
"""
