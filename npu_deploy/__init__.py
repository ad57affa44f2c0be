"""npu-deploy: take ONNX models to Huawei Ascend NPUs, and tell how well they run there.

>>> import npu_deploy
>>> sorted(npu_deploy.__all__)[:3]
['AclError', 'AtcError', 'BundleError']

The public surface is small: ``convert`` (ONNX → offline bundle or ``.om``), ``InferenceSession`` (run a
bundle on the CPU emulator or an ``.om`` on a device), ``compare`` (against onnxruntime),
``analyze_profile`` (FormatTrans share of an msprof / torch_npu profile), ``inspect`` (ONNX, bundle,
``.om``), and the error classes. Heavy modules load on first use.
"""

from __future__ import annotations

import importlib

from npu_deploy._version import __version__
from npu_deploy.errors import (
    AclError,
    AtcError,
    BundleError,
    CheckFailed,
    DependencyError,
    ExternalError,
    FormatError,
    InputError,
    InternalError,
    ModelError,
    NpuDeployError,
    OmError,
    ProfileError,
)

# name -> "module:attribute"; resolved lazily so `import npu_deploy` stays cheap and CANN-free.
_LAZY = {
    "convert": "npu_deploy.converters.convert:convert",
    "InferenceSession": "npu_deploy.runtime.session:InferenceSession",
    "compare": "npu_deploy.runtime.compare:compare",
    "analyze_profile": "npu_deploy.profiling.analyze:analyze_profile",
    "inspect": "npu_deploy.converters.inspect:inspect",
}

__all__ = [
    "__version__",
    "convert",
    "InferenceSession",
    "compare",
    "analyze_profile",
    "inspect",
    "NpuDeployError",
    "InputError",
    "FormatError",
    "ModelError",
    "BundleError",
    "OmError",
    "ProfileError",
    "ExternalError",
    "AtcError",
    "AclError",
    "DependencyError",
    "CheckFailed",
    "InternalError",
]


def __getattr__(name: str):
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'npu_deploy' has no attribute {name!r}")
    module, attr = target.split(":")
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
