"""npu_deploy.converters: ONNX in, offline model out (formats, planning, memory, cost, bundle, ATC)."""
