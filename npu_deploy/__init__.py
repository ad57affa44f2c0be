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
import os

# Installed, this package holds its sub-packages (cli, converters, runtime, profiling) as folders of its
# own. In a source checkout they are the repository's top-level folders (pyproject's package-dir), and
# this folder is the one Python finds first when the checkout's root is on sys.path (a script run from
# the root, ``python -c``): without the line below, that partial package would shadow the installed one
# (``npu_deploy.runtime`` not found). So a checkout's root is searched for sub-packages too.
_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not os.path.isdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "runtime")) and all(
        os.path.isfile(os.path.join(_root, sub, "__init__.py")) for sub in ("cli", "converters", "runtime", "profiling")):
    __path__.append(_root)  # noqa: F821 (a package's __path__)
del _root

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
    "convert": "npu_deploy.converters.lowering.convert:convert",
    "InferenceSession": "npu_deploy.runtime.session:InferenceSession",
    "compare": "npu_deploy.runtime.check.compare:compare",
    "analyze_profile": "npu_deploy.profiling.analyze:analyze_profile",
    "inspect": "npu_deploy.runtime.check.inspect:inspect",
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
