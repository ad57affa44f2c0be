"""npu_deploy.profiling: profiler output in, FormatTrans findings out."""
