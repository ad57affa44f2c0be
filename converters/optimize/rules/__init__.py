"""The optimize rules, one module per rule: each defines its pattern (``find``), its check (the reason it
does not apply, or None) and its rewrite (the :class:`~npu_deploy.converters.optimize.graph.Change`), and
exports them as ``RULE``. :mod:`npu_deploy.converters.optimize.registry` lists them in the order they run.
A rule module imports :mod:`npu_deploy.converters.optimize.graph` (and numpy / onnx) only.
"""
