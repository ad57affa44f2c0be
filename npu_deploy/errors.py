"""The error hierarchy of npu-deploy.

Every error a user can cause or meet derives from :class:`NpuDeployError` and carries the exit code of
the command line (``design.md``: 1 check failed, 2 bad usage or input, 3 environment or external tool).
Messages are one line, written for the user: what happened, to what, and what to try.

Bugs in npu-deploy itself are :class:`InternalError`, which is *not* an ``NpuDeployError``.

>>> try:
...     raise ModelError("model.onnx: not an ONNX model", hint="check the file is a .onnx export")
... except NpuDeployError as e:
...     (e.exit_code, str(e))
(2, 'model.onnx: not an ONNX model (check the file is a .onnx export)')
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_ENVIRONMENT = 3
EXIT_INTERNAL = 4
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT); a signal N in general gives 128 + N, so SIGTERM gives 143


class NpuDeployError(Exception):
    """Base of every error npu-deploy raises on purpose.

    ``message`` says what happened and to what; ``hint`` (optional) what to try.
    """

    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message} ({self.hint})"
        return self.message


class InputError(NpuDeployError):
    """Bad usage or bad input: a missing file, a wrong shape, a value out of range (exit 2)."""


class FormatError(InputError):
    """A tensor storage format problem: unknown format, wrong rank, size mismatch, unsupported dtype."""


class ModelError(InputError):
    """An ONNX model cannot be used: not ONNX, invalid graph, unsupported op or opset, unknown input."""


class BundleError(InputError):
    """An offline bundle cannot be read: wrong magic, unknown version, bad checksum, bad offsets."""


class OmError(InputError):
    """An ``.om`` file cannot be read: wrong magic, truncated, bad partition table, malformed ModelDef."""


class ProfileError(InputError):
    """Profiler output cannot be used. Carries the file and, where known, the line."""

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
                 hint: str | None = None):
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(where + message, hint=hint)
        self.path = path
        self.line = line


class ExternalError(NpuDeployError):
    """The environment or an external tool failed: ATC, the device, the ACL runtime (exit 3)."""

    exit_code = EXIT_ENVIRONMENT


class AtcError(ExternalError):
    """ATC failed. ``codes`` are the parsed error codes (``E19010``, ``EZ3002``…), ``log_path`` where
    ATC's log went, ``returncode`` its exit status."""

    def __init__(self, message: str, *, codes: list[str] | None = None, log_path: str | None = None,
                 returncode: int | None = None, details: list[dict] | None = None,
                 hint: str | None = None):
        super().__init__(message, hint=hint)
        self.codes = list(codes or [])
        self.log_path = log_path
        self.returncode = returncode
        self.details = list(details or [])


class AclError(ExternalError):
    """An ACL call returned non-zero. ``call`` is the function (``acl.mdl.execute``), ``code`` the
    return code."""

    def __init__(self, message: str, *, call: str | None = None, code: int | None = None,
                 hint: str | None = None):
        super().__init__(message, hint=hint)
        self.call = call
        self.code = code


class OutputError(ExternalError):
    """An output could not be written: disk full, read-only file system, permission denied (exit 3).
    ``path`` is the output; the message carries the operating system's reason."""

    def __init__(self, message: str, *, path: str | None = None, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.path = path


class DependencyError(ExternalError):
    """An optional dependency (pyACL, acllite, msprof, ATC) is missing; the message says what to install."""


class CheckFailed(NpuDeployError):
    """A check ran and failed (compare mismatch, profile flagged with ``--fail-on-flag``): exit 1."""

    exit_code = EXIT_CHECK_FAILED


class Interrupted(BaseException):
    """A signal (SIGINT = Ctrl-C, SIGTERM) stopped the run. Like ``KeyboardInterrupt`` it is not an
    ``Exception``, so ``except Exception`` clean-up code does not swallow it; the CLI exits 128 + N
    (130 for Ctrl-C, 143 for SIGTERM) after temporaries and the run's outputs are removed."""

    def __init__(self, signum: int):
        super().__init__(int(signum))
        self.signum = int(signum)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class InternalError(Exception):
    """A bug in npu-deploy. Not an NpuDeployError: the CLI reports it differently (exit 4)."""
