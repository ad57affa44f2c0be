"""The ``npu-deploy`` entry point: a lazy click group and the one place errors become exit codes.

Each command lives in its own module (``npu_deploy.cli.<name>``) exposing ``command``. Modules are
imported only when their command runs (or its help is shown), so a command whose optional dependency
is missing still appears in ``npu-deploy --help`` and says what to install when used.
"""

from __future__ import annotations

# The command modules are imported when their command runs (COMMANDS below), and they import the API
# inside the command body: `npu-deploy --help` and a mistyped option answer without loading onnx,
# onnxruntime, numpy's dependents or Ray. Those inside-function imports are lazy on purpose.

import contextlib
import importlib
import os
import signal
import sys
import threading
import traceback

import click

from npu_deploy._io import defer_signal, outputs, rollback_outputs
from npu_deploy.cli.feedback import early, end_early
from npu_deploy._text import printable
from npu_deploy._version import __version__
from npu_deploy.errors import (EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK,
                               DependencyError, Interrupted, NpuDeployError)

# command name -> (module, one-line help shown in `npu-deploy --help` without importing the module)
COMMANDS = {
    "convert": ("npu_deploy.cli.convert", "Lower an ONNX model to an Ascend offline model (ATC .om or built-in bundle)."),
    "run": ("npu_deploy.cli.run", "Run a bundle (CPU emulator) or .om (device) and report latency."),
    "compare": ("npu_deploy.cli.compare", "Compare a converted model's outputs with onnxruntime on the original."),
    "profile": ("npu_deploy.cli.profile", "Find format-conversion (FormatTrans) overhead in profiler output."),
    "inspect": ("npu_deploy.cli.inspect", "Show what an ONNX model, offline bundle or .om file holds."),
    "layout": ("npu_deploy.cli.layout", "Describe and convert tensors between Ascend storage formats."),
    "debug": ("npu_deploy.cli.debug", "Accuracy debugging: dumps against onnxruntime per layer; ops to keep in fp32."),
    "aipp": ("npu_deploy.cli.aipp", "Write an AIPP preprocessing config from mean/std/size, or check one."),
    "optimize": ("npu_deploy.cli.optimize", "Rewrite an ONNX model for Ascend; every rewrite verified and measured."),
    "cost": ("npu_deploy.cli.cost", "Check the cost model against real captures (cost check) or fit a SoC profile (cost fit)."),
}


class LazyGroup(click.Group):
    _rest: list = []   # the arguments after the command name, while it is being resolved

    def resolve_command(self, ctx, args):
        self._rest = list(args[1:])
        return super().resolve_command(ctx, args)

    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        entry = COMMANDS.get(name)
        if entry is None:
            return None
        module_name, short = entry
        if module_name not in sys.modules and not set(self._rest) & {"-h", "--help", "-q", "--quiet"}:
            early(f"{name}: loading")  # importing a command (onnx, onnxruntime) can take seconds
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            end_early()
            missing = getattr(e, "name", None) or str(e)

            @click.command(name, help=short, context_settings={"ignore_unknown_options": True})
            @click.argument("args", nargs=-1, type=click.UNPROCESSED)
            def unavailable(args):
                raise DependencyError(f"'{name}' needs {missing}, which is not installed here",
                                      hint=f"pip install {missing}")

            return unavailable
        end_early()
        return module.command

    def invoke(self, ctx):
        # click turns these two into a bare "Aborted!"; keep them apart: a signal, or input that ended early
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise Interrupted(signal.SIGINT) from None
        except EOFError as e:
            raise _EndOfInput(str(e)) from e

    def format_commands(self, ctx, formatter):
        rows = [(name, short) for name, (_, short) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


class _EndOfInput(Exception):
    """An EOFError no reader turned into a clear error: some input file ended early."""


_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _on_signal(signum, frame):
    for sig in _SIGNALS:  # a second signal must not interrupt the clean-up
        signal.signal(sig, signal.SIG_IGN)
    if not defer_signal(signum):  # else raised as soon as the file operation under way is whole
        raise Interrupted(signum)


@contextlib.contextmanager
def _signals_as_exceptions():
    """Ctrl-C and SIGTERM unwind the run the same way, so that temporaries and outputs are removed
    (only the main thread can set signal handlers; elsewhere Python's defaults stay)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # a signal the parent chose to ignore (a background job's SIGINT, nohup) stays ignored
    previous = {sig: signal.signal(sig, _on_signal) for sig in _SIGNALS
                if signal.getsignal(sig) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _debug_requested(argv: list[str]) -> bool:
    return "--debug" in argv or os.environ.get("NPU_DEPLOY_DEBUG", "") not in ("", "0")


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="npu-deploy")
@click.option("--debug", is_flag=True, help="Show full tracebacks on errors.")
@click.pass_context
def cli(ctx, debug):
    """npu-deploy: take ONNX models to Huawei Ascend NPUs, and tell how well they run there.

    Exit codes: 0 success, 1 check failed, 2 bad usage or input, 3 environment or external tool
    failure (a full disk included), 4 internal error (a bug: please report it with --debug output),
    130 interrupted by Ctrl-C (128 + N for signal N: 143 for SIGTERM). A failed or interrupted run
    removes the outputs it had written.
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return (and, as a console script, exit with) the documented exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = _debug_requested(args)
    with _signals_as_exceptions():
        code = _run(args, debug)
    return _finish(code, argv)


def _error(text: str) -> None:
    click.echo(f"npu-deploy: error: {printable(' '.join(str(text).split()))}", err=True)


def _command_path(args: list[str]) -> str:
    name = next((a for a in args if not a.startswith("-")), None)
    return f"npu-deploy {name}" if name in COMMANDS else "npu-deploy"


def _run(args: list[str], debug: bool) -> int:
    """One run: its outputs are kept only when it ends with 0 or 1 (a check that ran and failed)."""
    try:
        with outputs():
            rv = cli.main(args=args, prog_name="npu-deploy", standalone_mode=False)
            code = rv if isinstance(rv, int) else EXIT_OK
            if code not in (EXIT_OK, EXIT_CHECK_FAILED):
                rollback_outputs()
            return code
    except click.exceptions.Exit as e:
        return e.exit_code
    except Interrupted as e:
        name = signal.Signals(e.signum).name
        click.echo(f"npu-deploy: interrupted ({name}); no partial output left", err=True)
        return e.exit_code
    except click.Abort:  # a prompt interrupted (none today); click already printed a newline
        click.echo("npu-deploy: aborted", err=True)
        return EXIT_INTERRUPTED
    except click.UsageError as e:
        where = e.ctx.command_path if e.ctx is not None else _command_path(args)
        _error(f"{e.format_message()} (see '{where} --help')")
        return EXIT_BAD_INPUT
    except click.ClickException as e:
        _error(e.format_message())
        return e.exit_code
    except NpuDeployError as e:
        if debug:
            traceback.print_exc()
        _error(str(e))
        return e.exit_code
    except _EndOfInput as e:
        if debug:
            traceback.print_exc()
        _error(f"an input file ended early (empty or truncated): {e or 'end of file'}")
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:  # outside a command (while parsing)
        click.echo("npu-deploy: interrupted (SIGINT); no partial output left", err=True)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK
    except Exception as e:  # a bug in npu-deploy
        if debug:
            traceback.print_exc()
        click.echo(printable(f"npu-deploy: internal error: {type(e).__name__}: {e} "
                             f"(this is a bug; re-run with --debug and report the traceback)"), err=True)
        return EXIT_INTERNAL


def _finish(code: int, argv) -> int:
    if argv is None:  # console script
        sys.exit(code)
    return code


if __name__ == "__main__":  # pragma: no cover
    main()
