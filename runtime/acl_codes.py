"""pyACL return codes: what a code means and what to try.

The codes come from CANN's ``acl_base.h``, ``rt_error_codes.h`` and ``ge_error_codes.h`` (see
``reference/atc-acl-om.md`` §3.7). :func:`describe` turns a code into ``(name, meaning, hint)`` and
:func:`check` turns a non-zero return code of a named call into an :class:`~npu_deploy.errors.AclError`.

>>> describe(507011)[:2]
('ACL_ERROR_RT_MODEL_EXECUTE', 'model execution failed')
>>> check("acl.mdl.execute", 0)   # success: nothing happens
>>> try:
...     check("acl.mdl.execute", 507011)
... except Exception as e:
...     print(e.message)
acl.mdl.execute returned 507011 (ACL_ERROR_RT_MODEL_EXECUTE): model execution failed
"""

from __future__ import annotations

from typing import NamedTuple

from npu_deploy.errors import AclError

ACL_SUCCESS = 0
ACL_ERROR_REPEAT_INITIALIZE = 100002


class AclCode(NamedTuple):
    name: str
    meaning: str
    hint: str | None


_PLOG = "see the plog under $HOME/ascend/log/run/plog (or ASCEND_PROCESS_LOG_PATH) and acl.get_recent_err_msg()"
_OM = "rebuild the .om with ATC from the CANN version installed on this host, for this SoC"
_OOM = "free other models/sessions on this device, use a smaller batch, or another device"

CODES: dict[int, AclCode] = {
    0: AclCode("ACL_SUCCESS", "success", None),
    100000: AclCode("ACL_ERROR_INVALID_PARAM", "invalid parameter",
                    "a size, handle or index passed to ACL is wrong; re-run with --debug and report it"),
    100001: AclCode("ACL_ERROR_UNINITIALIZE", "ACL is not initialised (acl.init not called or already finalised)",
                    "create the session before use and do not use it after interpreter shutdown"),
    100002: AclCode("ACL_ERROR_REPEAT_INITIALIZE", "ACL already initialised in this process", None),
    100003: AclCode("ACL_ERROR_INVALID_FILE", "invalid file", _OM),
    100006: AclCode("ACL_ERROR_PARSE_FILE", "the file could not be parsed", _OM),
    100011: AclCode("ACL_ERROR_INVALID_MODEL_ID", "invalid model id (model not loaded or already unloaded)", None),
    100012: AclCode("ACL_ERROR_DESERIALIZE_MODEL", "the model could not be deserialised", _OM),
    100013: AclCode("ACL_ERROR_PARSE_MODEL", "the model could not be parsed", _OM),
    100014: AclCode("ACL_ERROR_READ_MODEL_FAILURE", "the model file could not be read", "check the path and permissions"),
    100015: AclCode("ACL_ERROR_MODEL_SIZE_INVALID", "invalid model size", _OM),
    100016: AclCode("ACL_ERROR_MODEL_MISSING_ATTR", "the model is missing an attribute", _OM),
    100017: AclCode("ACL_ERROR_MODEL_INPUT_NOT_MATCH", "model inputs do not match", "pass one array per model input"),
    100018: AclCode("ACL_ERROR_MODEL_OUTPUT_NOT_MATCH", "model outputs do not match", None),
    100019: AclCode("ACL_ERROR_MODEL_NOT_DYNAMIC", "dynamic-shape call on a static model",
                    "rebuild with ATC --dynamic_batch_size / --dynamic_dims, or pass a static shape"),
    100037: AclCode("ACL_ERROR_REPEAT_FINALIZE", "ACL already finalised", None),
    107000: AclCode("ACL_ERROR_RT_PARAM_INVALID", "invalid runtime parameter", None),
    107001: AclCode("ACL_ERROR_RT_INVALID_DEVICEID", "invalid device id",
                    "check `npu-smi info` for the devices present and ASCEND_RT_VISIBLE_DEVICES"),
    107002: AclCode("ACL_ERROR_RT_CONTEXT_NULL", "no current context in this thread",
                    "call acl.rt.set_context(ctx) in every thread before ACL calls"),
    107003: AclCode("ACL_ERROR_RT_STREAM_CONTEXT", "stream not in the current context", None),
    145000: AclCode("ACL_ERROR_GE_PARAM_INVALID", "invalid parameter (GE)", None),
    145002: AclCode("ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID", "invalid model path", "check that the .om file exists"),
    145006: AclCode("ACL_ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID", "invalid model data size (bad header or length)", _OM),
    145013: AclCode("ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID", "dynamic batch size not one of the model's gears",
                    "use one of the batch sizes the .om was built with (ATC --dynamic_batch_size)"),
    200000: AclCode("ACL_ERROR_BAD_ALLOC", "memory allocation failed", _OOM),
    207001: AclCode("ACL_ERROR_RT_MEMORY_ALLOCATION", "device memory allocation failed", _OOM),
    207004: AclCode("ACL_ERROR_RT_NO_DEVICE", "no device", "check the driver with `npu-smi info`"),
    207018: AclCode("ACL_ERROR_RT_DEVICE_OOM", "device out of memory", _OOM),
    500000: AclCode("ACL_ERROR_INTERNAL_ERROR", "internal ACL error", _PLOG),
    500001: AclCode("ACL_ERROR_FAILURE", "ACL failure", _PLOG),
    500002: AclCode("ACL_ERROR_GE_FAILURE", "graph engine failure", _PLOG),
    500003: AclCode("ACL_ERROR_RT_FAILURE", "runtime failure", _PLOG),
    500004: AclCode("ACL_ERROR_DRV_FAILURE", "driver failure", "check the driver with `npu-smi info`; " + _PLOG),
    507008: AclCode("ACL_ERROR_RT_SOC_VERSION", "the model was built for another SoC", _OM),
    507011: AclCode("ACL_ERROR_RT_MODEL_EXECUTE", "model execution failed", _PLOG),
    507014: AclCode("ACL_ERROR_RT_AICORE_TIMEOUT", "AI Core execution timed out", _PLOG),
    507015: AclCode("ACL_ERROR_RT_AICORE_EXCEPTION", "AI Core exception", _PLOG),
    545001: AclCode("ACL_ERROR_GE_LOAD_MODEL", "model load failed", _OM),
    545002: AclCode("ACL_ERROR_GE_EXEC_LOAD_MODEL_PARTITION_FAILED", "loading the model partition failed", _OM),
    545003: AclCode("ACL_ERROR_GE_EXEC_LOAD_WEIGHT_PARTITION_FAILED", "loading the weight partition failed", _OM),
    545004: AclCode("ACL_ERROR_GE_EXEC_LOAD_TASK_PARTITION_FAILED", "loading the task partition failed", _OM),
    545005: AclCode("ACL_ERROR_GE_EXEC_LOAD_KERNEL_PARTITION_FAILED", "loading the kernel partition failed", _OM),
}


def describe(code: int) -> AclCode:
    """``(name, meaning, hint)`` of a return code; unknown codes get a generic entry.

    >>> describe(100000).meaning
    'invalid parameter'
    """
    if code in CODES:
        return CODES[code]
    return AclCode(f"ACL error {code}", "unlisted ACL return code", _PLOG)


def error_for(call: str, code: int, *, context: str | None = None) -> AclError:
    """The :class:`AclError` for ``call`` returning ``code`` (``context`` names the model/tensor)."""
    entry = describe(code)
    where = f" ({context})" if context else ""
    name = entry.name if code in CODES else "unlisted"
    return AclError(f"{call} returned {code} ({name}): {entry.meaning}{where}",
                    call=call, code=code, hint=entry.hint)


def check(call: str, ret: object, *, context: str | None = None) -> None:
    """Raise :class:`AclError` when ``ret`` is not ``ACL_SUCCESS`` (0)."""
    if ret != ACL_SUCCESS:
        if not isinstance(ret, int):
            from npu_deploy.errors import InternalError

            raise InternalError(f"{call} returned {ret!r}, not an int return code")
        raise error_for(call, ret, context=context)
