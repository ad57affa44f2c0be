"""Ray, shared by batch inference (``runtime.distributed``) and cluster profiles (``profiling.cluster``).

Ray is optional (``pip install '.[ray]'`` in the clone; not on PyPI) and imported on first use. :func:`connect` joins a
cluster at an address (after checking, within :data:`CONNECT_TIMEOUT_S`, that it answers at all) or
starts a local one, optionally declaring NPUs as a custom resource where none are attached. Joining is
first tried in a child process killed after :func:`connect_timeout` seconds, so a wrong address fails
in bounded time. A local start may take :func:`start_wait` seconds (``--ray-start-timeout``, default
:data:`START_TIMEOUT_S`): Ray's own wait for its node is fixed at 30 s, and is tried again within that
time; past it the start is stopped, the processes it began are ended, and one exit-3 line says what to do.
Ray replaces this process's SIGTERM handler when it starts; the caller's handler is put back, so that
a SIGTERM unwinds the run as without Ray (exit 143, outputs removed, Ray's processes shut down).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from npu_deploy.errors import DependencyError, ExternalError, InputError, NpuDeployError

RAY_HINT = "pip install '.[ray]' in the npu-deploy clone (pip install -e '.[ray]' keeps an editable install)"
#: seconds allowed for a Ray address to answer (``NPU_DEPLOY_RAY_TIMEOUT`` overrides)
CONNECT_TIMEOUT_S = 20.0
#: seconds a local Ray cluster may take to start (``--ray-start-timeout``, ``NPU_DEPLOY_RAY_START_TIMEOUT``);
#: on 2 loaded cores Ray's start was seen to pass its own fixed 30 s
START_TIMEOUT_S = 180.0
START_HINT = ("allow it longer with --ray-start-timeout SECONDS (or NPU_DEPLOY_RAY_START_TIMEOUT), or start Ray "
              "yourself (ray start --head --resources='{\"NPU\": N}') and pass --ray-address auto")
_PROBE = ("import sys, ray; ray.init(address=sys.argv[1], include_dashboard=False, logging_level=40, "
          "log_to_driver=False); ray.shutdown()")


def connect_timeout() -> float:
    try:
        return max(1.0, float(os.environ.get("NPU_DEPLOY_RAY_TIMEOUT", CONNECT_TIMEOUT_S)))
    except ValueError:
        return CONNECT_TIMEOUT_S


def start_wait(given: float | None = None) -> float:
    """Seconds allowed for a local Ray start: ``given``, else ``NPU_DEPLOY_RAY_START_TIMEOUT``, else
    :data:`START_TIMEOUT_S`."""
    if given is not None:
        if not given > 0:
            raise InputError(f"--ray-start-timeout {given:g}: must be more than 0 seconds")
        return float(given)
    try:
        return max(1.0, float(os.environ.get("NPU_DEPLOY_RAY_START_TIMEOUT", START_TIMEOUT_S)))
    except ValueError:
        return START_TIMEOUT_S


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


def connect(address: str | None, *, npus: int | None = None, num_cpus: int | None = None,
            start_timeout: float | None = None) -> bool:
    """Join the Ray cluster at ``address``, or start a local one (declaring ``npus`` NPUs when given,
    within ``start_timeout`` seconds: see :func:`start_wait`). Returns True when this call started
    Ray (the caller shuts it down). A Ray session already initialised in this process is used as it is."""
    if address is not None:
        check_reachable(address)
    wait = start_wait(start_timeout)
    ray = import_ray()
    quiet_ray_logs()
    if ray.is_initialized():
        return False
    kw: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.ERROR, "log_to_driver": False}
    try:
        with _own_sigterm():
            if address is not None:
                _probe(address)
                with _stderr_kept_back():
                    ray.init(address=address, **kw)
            else:
                if npus:
                    kw["resources"] = {"NPU": int(npus)}
                _start_local(ray, dict(kw, num_cpus=num_cpus or os.cpu_count() or 1), wait)
    except NpuDeployError:
        raise
    except Exception as e:  # Ray's own errors (some are a bare Exception): the environment, one line
        why = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        if address is not None:
            raise ExternalError(f"cannot join the Ray cluster at {address} ({why})",
                                hint="check the address and port (`ray status` on the head node prints them)") from None
        raise ExternalError(f"cannot start a local Ray cluster ({why})",
                            hint="see `ray start --head` for what is wrong, or pass --ray-address") from None
    return True


class _StartTimeout(BaseException):  # not an Exception: Ray's own `except Exception` must not swallow it
    pass


_ALARM_ON = [False]  # the start is being timed: outside it a late SIGALRM does nothing


def _alarm(signum, frame):
    if not _ALARM_ON[0]:
        return
    # raised where the main thread happens to be; where Python ignores it (a logging lock released in a
    # fork hook: "Exception ignored in ..."), the timer fires again soon, until the start has stopped
    signal.setitimer(signal.ITIMER_REAL, 0.1)
    raise _StartTimeout()


def _start_local(ray, kw: dict, wait: float) -> None:
    """``ray.init(**kw)`` for a local cluster, within ``wait`` seconds (a timer in the main thread; Ray's
    own 30 s wait for its node is tried again while time is left), else the processes it started are
    ended and one :class:`ExternalError` says what to do."""
    deadline = time.monotonic() + wait
    before = _children()
    timer = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
    hook = sys.unraisablehook
    if timer:
        previous = signal.signal(signal.SIGALRM, _alarm)
        # where Python ignores the timer's exception it prints "Exception ignored in ..."; keep that quiet
        sys.unraisablehook = lambda u: None if isinstance(u.exc_value, _StartTimeout) else hook(u)
        _ALARM_ON[0] = True
        signal.setitimer(signal.ITIMER_REAL, wait)
    try:
        while True:
            try:
                ray.init(**kw)
                if time.monotonic() > deadline:  # the timer was swallowed somewhere inside Ray: late is late
                    raise _StartTimeout()
                return
            except _StartTimeout:
                raise
            except Exception as e:  # Ray raises a bare Exception when its node "timed out during startup"
                if "timed out" not in str(e).lower():
                    raise
                _stop_started(ray, before)
                if time.monotonic() >= deadline:
                    raise _StartTimeout() from None
    except _StartTimeout:
        _ALARM_ON[0] = False
        if timer:
            signal.setitimer(signal.ITIMER_REAL, 0)
        _stop_started(ray, before)
        raise ExternalError(f"the local Ray cluster did not start within {wait:g} s (a loaded machine?)",
                            hint=START_HINT) from None
    finally:
        _ALARM_ON[0] = False
        if timer:
            signal.setitimer(signal.ITIMER_REAL, 0)
            sys.unraisablehook = hook
            if previous is not None:  # None: a handler set outside Python, which cannot be put back
                signal.signal(signal.SIGALRM, previous)


def _children() -> set[int]:
    try:
        import psutil  # Ray's own dependency: there whenever Ray is
        return {p.pid for p in psutil.Process().children(recursive=True)}
    except Exception:
        return set()


def _stop_started(ray, before: set[int]) -> None:
    """Shut down what a failed start left: Ray's session, and the processes it started (GCS, raylet) that
    a start stopped half-way does not know about."""
    with contextlib.suppress(Exception):
        ray.shutdown()
    try:
        import psutil  # Ray's own dependency
        procs = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
        for p in procs:
            with contextlib.suppress(Exception):
                p.kill()
        psutil.wait_procs(procs, timeout=5)
    except Exception:
        pass


@contextlib.contextmanager
def _own_sigterm():
    """Ray's ``init`` sets a SIGTERM handler of its own (``sys.exit(15)``): keep the caller's."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


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
