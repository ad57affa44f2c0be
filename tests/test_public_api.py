"""The public surface is small and pinned; importing it needs no CANN and loads nothing heavy."""

import subprocess
import sys

import npu_deploy

EXPECTED = {
    "__version__", "convert", "InferenceSession", "compare", "analyze_profile", "inspect",
    "NpuDeployError", "InputError", "FormatError", "ModelError", "BundleError", "OmError", "ProfileError",
    "ExternalError", "AtcError", "AclError", "DependencyError", "CheckFailed", "InternalError",
}


def test_all_is_pinned():
    assert set(npu_deploy.__all__) == EXPECTED


def test_every_public_name_resolves():
    for name in npu_deploy.__all__:
        assert getattr(npu_deploy, name) is not None, name


def test_import_is_light_and_vendor_free():
    code = ("import sys, npu_deploy; heavy = {'onnxruntime', 'onnx', 'acl', 'acllite_resource'}; "
            "print(sorted(heavy & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_backend_interface_loads_no_onnx():
    """Every run imports the backend interface; onnx (about 0.8 s to import) is the converters' to load."""
    code = ("import sys, npu_deploy.runtime.backend; "
            "print(sorted({'onnx', 'onnxruntime', 'acl'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_exit_codes_follow_the_design():
    assert npu_deploy.InputError("x").exit_code == 2
    assert npu_deploy.ModelError("x").exit_code == 2
    assert npu_deploy.AtcError("x").exit_code == 3
    assert npu_deploy.AclError("x", call="acl.mdl.execute", code=507011).exit_code == 3
    assert npu_deploy.CheckFailed("x").exit_code == 1
    assert not issubclass(npu_deploy.InternalError, npu_deploy.NpuDeployError)
