"""Feedback on long work, on a terminal only: the stage under way, a bar where the fraction is known.

``convert``'s pipeline calls ``progress(stage, fraction)`` ("ONNX from path", "op support", "plan from
ONNX", "bundle from plan", "writing weights (k/n)"; ``"atc: <line>"`` for each line ATC prints);
``run`` reports each finished run. :class:`Stages` shows that on stderr with ``rich`` when stderr is a
terminal and the user did not ask for ``--quiet``; otherwise it shows nothing, so logs, pipes and the
JSON outputs never change.

:func:`early` puts a stage line up within the command's first second, before the heavy imports (onnx,
onnxruntime, Ray) and the model load that would otherwise leave a loaded machine silent for seconds; the
next :class:`Stages` or :class:`RunProgress` takes the line over, and it is gone when the command ends.
"""

from __future__ import annotations

import atexit
import sys
import time

from npu_deploy._text import printable


def interactive(quiet: bool = False) -> bool:
    """True when feedback may be shown: stderr is a terminal and ``--quiet`` was not given."""
    if quiet:
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


_early: list = []   # [Progress, task] of the line :func:`early` put up, while it is shown


def _stop_early() -> None:
    if _early:
        progress, _ = _early
        _early.clear()
        progress.stop()


def end_early() -> None:
    """Take the :func:`early` line down (before printing results on stdout)."""
    _stop_early()


def early(stage: str, quiet: bool = False) -> None:
    """Show ``stage`` with a spinner now, on a terminal only (see the module docstring); a second call
    changes the text. Nothing is written when stderr is not a terminal or ``quiet`` is set."""
    if not interactive(quiet):
        return
    if _early:
        _early[0].update(_early[1], description=printable(stage))
        return
    from rich.console import Console  # rich loads in ~0.1 s, still within the first second
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    # stdout is left alone (no redirection into the display): it may be a pipe while stderr is a terminal
    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                        console=Console(file=sys.stderr), transient=True, redirect_stdout=False,
                        redirect_stderr=False)
    progress.start()
    _early[:] = [progress, progress.add_task(printable(stage), total=None)]
    atexit.register(_stop_early)   # an error exit leaves no spinner behind


class _Bar:
    """A rich progress display that may or may not have started; stopped when the block ends."""

    _progress = None

    def __exit__(self, *exc):
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        _stop_early()
        return False


class Stages(_Bar):
    """A ``progress(stage, fraction)`` callback drawing a live line on stderr (a no-op when disabled).

    >>> with Stages(enabled=False) as say:
    ...     say("ONNX from path", None)
    """

    def __init__(self, enabled: bool, *, echo_atc: bool = True):
        self.enabled = enabled
        self.echo_atc = echo_atc  # ATC's own lines, shown (plainly when not a terminal) unless quiet
        self._progress = None
        self._task = None

    def __enter__(self):
        if self.enabled and _early:   # take over the line early() put up
            self._progress, self._task = _early
            _early.clear()
        elif self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            console = Console(file=sys.stderr)
            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                      TimeElapsedColumn(), console=console, transient=True)
            self._progress.start()
            self._task = self._progress.add_task("starting", total=None)
        return self


    def __call__(self, stage: str, fraction: float | None = None) -> None:
        if stage.startswith("atc: "):
            line = printable(stage[5:])
            if self._progress is not None:
                self._progress.console.print(line, markup=False, highlight=False)
            elif self.echo_atc:
                print(line, file=sys.stderr, flush=True)
            return
        if self._progress is None:
            return
        total = 1.0 if fraction is not None else None
        self._progress.update(self._task, description=printable(stage), total=total,
                              completed=fraction if fraction is not None else 0)


class RunProgress(_Bar):
    """Progress of ``loop`` runs, shown only once the work has lasted ``after_s`` seconds (a short run
    stays quiet; a long one, whatever its loop count, shows a bar)."""

    def __init__(self, total: int, enabled: bool, *, after_s: float = 2.0, label: str = "running"):
        self.total, self.enabled, self.after_s, self.label = total, enabled, after_s, label
        self.done = 0
        self._t0 = None
        self._progress = None
        self._task = None

    def __enter__(self):
        self._t0 = time.perf_counter()
        if self.enabled:   # a stage line at once; the bar replaces it once the runs last after_s
            early(f"{self.label}: warm-up and {self.total} run{'s' if self.total != 1 else ''}")
        return self


    def __call__(self, *_):
        self.done += 1
        if not self.enabled:
            return
        if self._progress is None:
            if time.perf_counter() - self._t0 < self.after_s:
                return
            _stop_early()
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(TextColumn(self.label), BarColumn(), MofNCompleteColumn(),
                                      TimeRemainingColumn(), console=Console(file=sys.stderr), transient=True)
            self._progress.start()
            self._task = self._progress.add_task(self.label, total=self.total)
        self._progress.update(self._task, completed=self.done)
