"""The ``npu-deploy`` entry point: a lazy click group and the one place errors become exit codes.

Each command lives in its own module (``npu_deploy.cli.<name>``) exposing ``command``. Modules are
imported only when their command runs (or its help is shown), so a command whose optional dependency
is missing still appears in ``npu-deploy --help`` and says what to install when used.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback

import click

from npu_deploy._version import __version__
from npu_deploy.errors import EXIT_INTERNAL, NpuDeployError

# command name -> (module, one-line help shown in `npu-deploy --help` without importing the module)
COMMANDS = {
    "convert": ("npu_deploy.cli.convert", "Lower an ONNX model to an Ascend offline model (ATC .om or built-in bundle)."),
    "run": ("npu_deploy.cli.run", "Run a bundle (CPU emulator) or .om (device) and report latency."),
    "compare": ("npu_deploy.cli.compare", "Compare a converted model's outputs with onnxruntime on the original."),
    "profile": ("npu_deploy.cli.profile", "Find format-conversion (FormatTrans) overhead in profiler output."),
    "inspect": ("npu_deploy.cli.inspect", "Show what an ONNX model, offline bundle or .om file holds."),
    "layout": ("npu_deploy.cli.layout", "Describe and convert tensors between Ascend storage formats."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        entry = COMMANDS.get(name)
        if entry is None:
            return None
        module_name, short = entry
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            missing = getattr(e, "name", None) or str(e)

            @click.command(name, help=short, context_settings={"ignore_unknown_options": True})
            @click.argument("args", nargs=-1, type=click.UNPROCESSED)
            def unavailable(args):
                raise click.ClickException(
                    f"'{name}' needs {missing}, which is not installed here (pip install {missing})")

            return unavailable
        return module.command

    def format_commands(self, ctx, formatter):
        rows = [(name, short) for name, (_, short) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _debug_requested(argv: list[str]) -> bool:
    return "--debug" in argv or os.environ.get("NPU_DEPLOY_DEBUG", "") not in ("", "0")


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="npu-deploy")
@click.option("--debug", is_flag=True, help="Show full tracebacks on errors.")
@click.pass_context
def cli(ctx, debug):
    """npu-deploy: take ONNX models to Huawei Ascend NPUs, and tell how well they run there.

    Exit codes: 0 success, 1 check failed, 2 bad usage or input, 3 environment or external tool
    failure, 4 internal error (a bug: please report it with --debug output).
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return (and, as a console script, exit with) the documented exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = _debug_requested(args)
    try:
        rv = cli.main(args=args, prog_name="npu-deploy", standalone_mode=False)
    except click.exceptions.Exit as e:
        return _finish(e.exit_code, argv)
    except click.Abort:
        click.echo("npu-deploy: aborted", err=True)
        return _finish(130, argv)
    except click.ClickException as e:
        e.show()
        return _finish(e.exit_code, argv)
    except NpuDeployError as e:
        if debug:
            traceback.print_exc()
        click.echo(f"npu-deploy: error: {e}", err=True)
        return _finish(e.exit_code, argv)
    except KeyboardInterrupt:
        click.echo("npu-deploy: interrupted", err=True)
        return _finish(130, argv)
    except BrokenPipeError:
        return _finish(0, argv)
    except Exception as e:  # a bug in npu-deploy
        if debug:
            traceback.print_exc()
        click.echo(f"npu-deploy: internal error: {type(e).__name__}: {e} "
                   f"(this is a bug; re-run with --debug and report the traceback)", err=True)
        return _finish(EXIT_INTERNAL, argv)
    code = rv if isinstance(rv, int) else 0
    return _finish(code, argv)


def _finish(code: int, argv) -> int:
    if argv is None:  # console script
        sys.exit(code)
    return code


if __name__ == "__main__":  # pragma: no cover
    main()
