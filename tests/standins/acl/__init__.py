"""Stand-in for pyACL's ``acl`` extension module (CANN), written for the tests from the documented contract.

Import it as ``acl`` with ``tests/standins`` on ``sys.path`` — exactly as the real one is imported with
CANN's ``python/site-packages`` on ``PYTHONPATH``. Tests drive it through :mod:`acl._standin` (register
models, inject return codes, read the call log, check for leaks). See ``_core.py`` for the rules.
"""

from __future__ import annotations

if __name__ != "acl":  # pragma: no cover - guard against a second, separate copy of the state
    raise ImportError("import the stand-in as `acl` (put tests/standins on sys.path), not as "
                      f"{__name__!r}: a second copy would have its own device state")

import atexit

from acl._core import DTYPE_SIZE, S, TensorDesc, api

from acl import mdl, rt, util  # noqa: E402  (submodules, as in the real module)
from acl import _standin  # noqa: E402,F401


@api("acl.init", "|s")
def init(config_path: str | None = None) -> int:
    S.init_calls += 1
    if S.finalized:
        # acl.h: aclInit "can be called only once in a process"; after aclFinalize "the services
        # cannot continue to be used normally": nothing works again, whatever init returns
        S.violate("acl.init after acl.finalize: pyACL allows one init/finalize per process")
        return 100002
    if S.initialized:
        return 100002
    if config_path:
        ret = _check_config(config_path)
        if ret:
            return ret
    S.init_config = config_path or None
    S.initialized = True
    S.finalized = False
    return 0


_DUMP_KEYS = {"dump_list", "dump_path", "dump_mode", "dump_op_switch"}


def _check_config(config_path: str) -> int:
    """acl.json as documented (reference/accuracy-debug.md §3): a readable JSON object; a ``dump``
    section with ``dump_list`` (objects with a ``model_name``), an absolute ``dump_path``,
    ``dump_mode`` all|input|output and ``dump_op_switch`` on|off. ACL refuses anything else at init
    (ACL_ERROR_INVALID_PARAM, 100000)."""
    import json
    import os

    try:
        with open(config_path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        S.violate(f"acl.init({config_path!r}): not a readable JSON file ({e})")
        return 100000
    dump = cfg.get("dump") if isinstance(cfg, dict) else None
    if not isinstance(cfg, dict) or (dump is not None and not isinstance(dump, dict)):
        S.violate(f"acl.init({config_path!r}): the config is not a JSON object with a 'dump' object")
        return 100000
    if dump is None:
        return 0
    problems = [f"unknown key {k!r}" for k in dump if k not in _DUMP_KEYS]
    lst = dump.get("dump_list")
    if not isinstance(lst, list) or not all(isinstance(e, dict) and isinstance(e.get("model_name"), str)
                                            and e["model_name"] for e in lst):
        problems.append("dump_list must be a list of {'model_name': NAME}")
    path = dump.get("dump_path")
    if not isinstance(path, str) or not os.path.isabs(path):
        problems.append(f"dump_path {path!r} must be an absolute path")
    if dump.get("dump_mode", "output") not in ("all", "input", "output"):
        problems.append(f"dump_mode {dump.get('dump_mode')!r} is not all|input|output")
    if dump.get("dump_op_switch", "off") not in ("on", "off"):
        problems.append(f"dump_op_switch {dump.get('dump_op_switch')!r} is not on|off")
    if problems:
        S.violate(f"acl.init({config_path!r}): " + "; ".join(problems))
        return 100000
    return 0


@api("acl.finalize", "")
def finalize() -> int:
    if not S.initialized:
        return 100037 if S.finalized else 100001
    S.finalize_calls += 1
    if S.devices:
        S.violate(f"acl.finalize with device(s) {sorted(S.devices)} still set (reset_device first)")
    mine = [f"{hex(h)} {list(td.dims)}" for h, td in S.tensor_descs.items() if td.owner is None]
    if mine:
        S.violate(f"acl.finalize with tensor desc(s) {', '.join(mine)} never destroyed (acl.destroy_tensor_desc)")
    S.initialized = False
    S.finalized = True
    S.write_log("finalize")
    return 0


@api("acl.get_soc_name", "", ret="none")
def get_soc_name() -> str | None:
    return S.soc_name if S.initialized else None


@api("acl.get_version", "", ret="triple")
def get_version() -> tuple[int, int, int, int]:
    return 8, 0, 0, 0


@api("acl.get_recent_err_msg", "", ret="none")
def get_recent_err_msg() -> str:
    return S.recent_err


@api("acl.create_data_buffer", "ii", ret="none")
def create_data_buffer(ptr: int, size: int) -> int:
    h = S.new("buf", 16)
    S.buffers[h] = [ptr, size]
    return h


@api("acl.destroy_data_buffer", "i")
def destroy_data_buffer(buf: int) -> int:
    if buf not in S.buffers:
        S.violate(f"acl.destroy_data_buffer of unknown/destroyed buffer {hex(buf)}")
        return 100000
    del S.buffers[buf]
    return 0


@api("acl.get_data_buffer_addr", "i", ret="none")
def get_data_buffer_addr(buf: int) -> int:
    return S.buffers.get(buf, [0, 0])[0]


@api("acl.get_data_buffer_size", "i", ret="none")
def get_data_buffer_size(buf: int) -> int:
    return S.buffers.get(buf, [0, 0])[1]


@api("acl.get_data_buffer_size_v2", "i", ret="none")
def get_data_buffer_size_v2(buf: int) -> int:
    return S.buffers.get(buf, [0, 0])[1]


@api("acl.update_data_buffer", "iii")
def update_data_buffer(buf: int, ptr: int, size: int) -> int:
    if buf not in S.buffers:
        return 100000
    S.buffers[buf] = [ptr, size]
    return 0


@api("acl.data_type_size", "i", ret="none")
def data_type_size(dtype: int) -> int:
    from acl._core import DTYPE_SIZE

    return DTYPE_SIZE.get(dtype, 0)


def _dims_list(dims) -> list[int] | None:
    if not isinstance(dims, (list, tuple)) or not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        return None
    return [int(d) for d in dims]


@api("acl.create_tensor_desc", "iOi", ret="none")
def create_tensor_desc(dtype: int, dims, fmt: int) -> int:
    """aclCreateTensorDesc(dtype, numDims, dims, format): a handle, 0 (NULL) when the arguments are bad."""
    d = _dims_list(dims)
    if d is None:
        raise TypeError("acl.create_tensor_desc args parse failed!")
    if dtype not in DTYPE_SIZE or len(d) > 128 or any(v < -2 for v in d):
        return 0
    h = S.new("tdesc", 16)
    S.tensor_descs[h] = TensorDesc(dtype, tuple(d), fmt)
    return h


@api("acl.destroy_tensor_desc", "i", ret="none")
def destroy_tensor_desc(desc: int) -> None:
    """aclDestroyTensorDesc returns void; pyACL returns None."""
    td = S.tensor_descs.get(desc)
    if td is None:
        S.violate(f"acl.destroy_tensor_desc of unknown/destroyed tensor desc {hex(desc)}")
        return None
    if td.owner is not None:
        S.violate(f"acl.destroy_tensor_desc({hex(desc)}): that desc belongs to dataset {hex(td.owner)} "
                  f"(from acl.mdl.get_dataset_tensor_desc), not to the caller")
        return None
    del S.tensor_descs[desc]
    return None


def _tdesc(name: str, desc: int) -> TensorDesc | None:
    td = S.tensor_descs.get(desc)
    if td is None:
        S.violate(f"{name} on unknown/destroyed tensor desc {hex(desc)}")
    return td


@api("acl.get_tensor_desc_num_dims", "i", ret="none")
def get_tensor_desc_num_dims(desc: int) -> int:
    td = _tdesc("acl.get_tensor_desc_num_dims", desc)
    return len(td.dims) if td else 0


@api("acl.get_tensor_desc_dim_v2", "ii", ret="pair")
def get_tensor_desc_dim_v2(desc: int, index: int) -> tuple[int, int]:
    td = _tdesc("acl.get_tensor_desc_dim_v2", desc)
    if td is None or not 0 <= index < len(td.dims):
        return 0, 100000
    return td.dims[index], 0


@api("acl.get_tensor_desc_type", "i", ret="none")
def get_tensor_desc_type(desc: int) -> int:
    td = _tdesc("acl.get_tensor_desc_type", desc)
    return td.dtype if td else -1


@api("acl.get_tensor_desc_format", "i", ret="none")
def get_tensor_desc_format(desc: int) -> int:
    td = _tdesc("acl.get_tensor_desc_format", desc)
    return td.format if td else -1


@api("acl.get_tensor_desc_size", "i", ret="none")
def get_tensor_desc_size(desc: int) -> int:
    td = _tdesc("acl.get_tensor_desc_size", desc)
    if td is None or any(d < 0 for d in td.dims):
        return 0
    n = DTYPE_SIZE.get(td.dtype, 0)
    for d in td.dims:
        n *= d
    return n


def _at_exit() -> None:
    S.write_log("exit")


atexit.register(_at_exit)

__all__ = ["init", "finalize", "get_soc_name", "get_version", "get_recent_err_msg", "create_data_buffer",
           "destroy_data_buffer", "get_data_buffer_addr", "get_data_buffer_size", "get_data_buffer_size_v2",
           "update_data_buffer", "data_type_size", "create_tensor_desc", "destroy_tensor_desc",
           "get_tensor_desc_num_dims", "get_tensor_desc_dim_v2", "get_tensor_desc_type", "get_tensor_desc_format",
           "get_tensor_desc_size", "rt", "mdl", "util"]
