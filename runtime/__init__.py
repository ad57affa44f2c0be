"""npu_deploy.runtime: InferenceSession over the CPU emulator and the ACL backend; bench and compare."""
