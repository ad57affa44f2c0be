"""Ray, shared by batch inference (``runtime.distributed``) and cluster profiles (``profiling.cluster``).

Ray is optional (``pip install '.[ray]'`` in the clone; not on PyPI) and imported on first use. :func:`connect` joins a
cluster at an address (after checking, within :data:`CONNECT_TIMEOUT_S`, that it answers at all) or
starts a local one, optionally declaring NPUs as a custom resource where none are attached. Joining is
first tried in a child process killed after :func:`connect_timeout` seconds, so a wrong address fails
in bounded time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import tempfile
from typing import Any

from npu_deploy.errors import DependencyError, ExternalError, InputError

RAY_HINT = "pip install '.[ray]' in the npu-deploy clone (pip install -e '.[ray]' keeps an editable install)"
#: seconds allowed for a Ray address to answer (``NPU_DEPLOY_RAY_TIMEOUT`` overrides)
CONNECT_TIMEOUT_S = 20.0
_PROBE = ("import sys, ray; ray.init(address=sys.argv[1], include_dashboard=False, logging_level=40, "
          "log_to_driver=False); ray.shutdown()")


def connect_timeout() -> float:
    try:
        return max(1.0, float(os.environ.get("NPU_DEPLOY_RAY_TIMEOUT", CONNECT_TIMEOUT_S)))
    except ValueError:
        return CONNECT_TIMEOUT_S


def import_ray():
    """The ``ray`` module, or a :class:`DependencyError` saying what to install."""
    try:
        import ray
    except ImportError as e:
        raise DependencyError(f"this needs Ray, which is not installed ({e})", hint=RAY_HINT) from None
    return ray


def check_reachable(address: str, timeout: float | None = None) -> None:
    """Fail within ``timeout`` seconds when ``host:port`` (or ``ray://host:port``) does not answer;
    ``"auto"`` is left to Ray (it reads the local cluster's address file)."""
    if address == "auto":
        return
    timeout = connect_timeout() if timeout is None else timeout
    hostport = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise InputError(f"--ray-address {address!r} is not host:port, ray://host:port or 'auto'",
                         hint="e.g. --ray-address 10.0.0.1:6379")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as e:
        reason = "no answer" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        raise ExternalError(f"Ray cluster at {address} does not answer ({reason}; waited at most {timeout:g} s)",
                            hint="check `ray status` on the head node, and the address and port") from None


def quiet_ray_logs() -> None:
    # without pyACL, Ray's NPU detection logs a traceback at every start; the fallback it takes is fine
    logging.getLogger("ray._private.accelerators.npu").setLevel(logging.CRITICAL)


def connect(address: str | None, *, npus: int | None = None, num_cpus: int | None = None) -> bool:
    """Join the Ray cluster at ``address``, or start a local one (declaring ``npus`` NPUs when given).
    Returns True when this call started Ray (the caller shuts it down). A Ray session already
    initialised in this process is used as it is."""
    if address is not None:
        check_reachable(address)
    ray = import_ray()
    quiet_ray_logs()
    if ray.is_initialized():
        return False
    kw: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.ERROR, "log_to_driver": False}
    try:
        if address is not None:
            _probe(address)
            with _stderr_kept_back():
                ray.init(address=address, **kw)
        else:
            if npus:
                kw["resources"] = {"NPU": int(npus)}
            ray.init(num_cpus=num_cpus or os.cpu_count() or 1, **kw)
    except (ConnectionError, TimeoutError, RuntimeError, OSError, ValueError) as e:
        why = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        if address is not None:
            raise ExternalError(f"cannot join the Ray cluster at {address} ({why})",
                                hint="check the address and port (`ray status` on the head node prints them)") from None
        raise ExternalError(f"cannot start a local Ray cluster ({why})",
                            hint="see `ray start --head` for what is wrong, or pass --ray-address") from None
    return True


def _probe(address: str) -> None:
    """Join ``address`` once in a child process that is killed after :func:`connect_timeout` seconds:
    Ray's own retries against something that answers but is not Ray can last minutes, and cannot be
    interrupted in this process."""
    timeout = connect_timeout()
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE, address], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ExternalError(f"cannot join the Ray cluster at {address}: something answers there, but not as "
                            f"Ray within {timeout:g} s",
                            hint="check the address and port (`ray status` on the head node prints them)") from None
    if proc.returncode != 0:
        last = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()][-1:] or ["no reason given"]
        raise ExternalError(f"cannot join the Ray cluster at {address} ({last[0][:200]})",
                            hint="check the address and port (`ray status` on the head node prints them)")


@contextlib.contextmanager
def _stderr_kept_back():
    """While joining a cluster, Ray's C++ client logs every failed try on file descriptor 2: keep those
    lines back (the failure becomes one error line of ours); ``NPU_DEPLOY_DEBUG=1`` lets them through."""
    if os.environ.get("NPU_DEPLOY_DEBUG", "") not in ("", "0"):
        yield
        return
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
