"""Test control of the stand-in ``acl``: models, injected failures, reports. Not part of real pyACL.

>>> import acl
>>> acl._standin.reset(soc_name="Ascend310P3")
>>> acl._standin.register_model("m.om", acl._standin.ModelSpec(
...     inputs=[acl._standin.TensorSpec("x", (1, 4), 0, 2)], outputs=[acl._standin.TensorSpec("y", (1, 4), 0, 2)]))
>>> acl._standin.fail("acl.mdl.execute", 507011)        # the next execute returns 507011
"""

from __future__ import annotations

import os

from acl._core import (MBATCH_NAME, AclStandinError, Execution, ModelSpec, S, TensorSpec,  # noqa: F401
                       default_compute)

#: optional hook ``(path) -> ModelSpec | None`` used for files not registered (e.g. built .om files)
spec_loader = None


def reset(*, soc_name: str = "Ascend310P3", device_count: int = 1, run_mode: int = 1,
          keep_registry: bool = False) -> None:
    """Forget all state (as a fresh process would), the injected failures and, unless kept, the models.
    ``run_mode=0`` (ACL_DEVICE) simulates an app running on the device's own CPU (Atlas 200 DK): its
    memory is device memory, so copies between it and device buffers must use DEVICE_TO_DEVICE."""
    S.reset(soc_name=soc_name, device_count=device_count, run_mode=run_mode)
    if not keep_registry:
        S.registry.clear()
        S.computes.clear()


def set_soc_name(name: str) -> None:
    S.soc_name = name


def register_model(path, spec: ModelSpec) -> None:
    """``acl.mdl.load_from_file(path)`` will load ``spec`` (the file must exist and start with IMOD)."""
    S.registry[os.path.realpath(os.fspath(path))] = spec


def set_compute(path, fn) -> None:
    """Use ``fn(spec, inputs, batch) -> [bytes per output]`` for the model at ``path`` (registered or
    read from the ``.om``)."""
    S.computes[os.path.realpath(os.fspath(path))] = fn


def spec_from_file(path: str) -> ModelSpec | None:
    """The spec of an unregistered file: ``spec_loader`` if set, else decoded from the ``.om`` itself."""
    if spec_loader is not None:
        return spec_loader(path)
    from acl._omspec import spec_from_om

    return spec_from_om(path)


def fail(call: str, code: int, *, times: int = 1, after: int = 0) -> None:
    """Make the next ``times`` calls of ``call`` (e.g. ``"acl.mdl.execute"``) return ``code``, after
    letting ``after`` calls succeed."""
    S.injected.setdefault(call, []).extend([0] * after + [code] * times)


def calls() -> list[str]:
    """Names of the calls made so far, in order."""
    return [c[0] for c in S.calls]


def call_log() -> list[tuple[str, int | None, str]]:
    """``(name, return code or None, thread name)`` for every call."""
    return list(S.calls)


def executions() -> list[Execution]:
    return list(S.executions)


def leaks() -> list[str]:
    return S.leaks()


def violations() -> list[str]:
    return list(S.violations)


def assert_clean(*, finalized: bool = True) -> None:
    S.assert_clean(finalized=finalized)


def report() -> dict:
    return S.report()
