"""npu_deploy.converters.lowering: an ONNX model lowered to what the device runs.

``options`` (every convert option decided once), ``pipeline`` (the named steps and their executed
contracts), ``planner`` (formats, TransData insertion and elimination, weight pre-packing, precision),
``fusion``, ``support`` (op support per SoC), ``memory`` (the 256-byte aligned arena), ``cost`` (the
per-SoC cost model), ``aipp``, ``atc`` (the ATC driver), ``output_edit`` and ``convert`` (the entry
point). May import ``npu_deploy.converters.formats`` and ``npu_deploy.converters.files``.
"""
