"""The host a benchmark ran on, and whether it was quiet enough to trust wall-clock figures.

Every benchmark prints :func:`describe` beside its figures (and writes it into its README), so a
figure always travels with the CPU model, the usable cores and the load it was measured under.

* ``cpu``: the model name from ``/proc/cpuinfo`` (else :func:`platform.processor`);
* ``cores``: the cores this process may run on (``sched_getaffinity``), ``logical`` all of them;
* ``caches``: L2 / L3 sizes from sysfs where the kernel exposes them;
* ``load``: the 1-, 5- and 15-minute load averages;
* ``quiet``: the 1-minute load average is at most half the usable cores: other jobs then leave
  this one a core most of the time. On a loaded machine the figures that matter are the process
  CPU-time ratios (the benchmarks report those); wall-clock ratios are then only indicative.

    python benchmarks/_host.py          # one line
"""

from __future__ import annotations

import os
import platform
import re
import statistics
import sys
from pathlib import Path

QUIET_LOAD_PER_CORE = 0.5


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def caches() -> dict[str, str]:
    """{"L2": "2048K", "L3": "32768K"} from sysfs (cpu0), empty where not exposed."""
    out: dict[str, str] = {}
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        for idx in sorted(base.glob("index*")):
            level = (idx / "level").read_text().strip()
            kind = (idx / "type").read_text().strip()
            if kind in ("Unified", "Data") and level in ("1", "2", "3"):
                name = f"L{level}" + ("d" if level == "1" else "")
                out[name] = (idx / "size").read_text().strip()
    except OSError:
        pass
    return out


def load() -> tuple[float, float, float]:
    try:
        return os.getloadavg()
    except (AttributeError, OSError):
        return (float("nan"),) * 3


def is_quiet(load1: float | None = None, cores: int | None = None) -> bool:
    load1 = load()[0] if load1 is None else load1
    cores = usable_cores() if cores is None else cores
    return load1 <= QUIET_LOAD_PER_CORE * cores


def info() -> dict:
    ld = load()
    cores = usable_cores()
    return {"cpu": cpu_model(), "cores": cores, "logical": os.cpu_count(), "caches": caches(),
            "load": ld, "quiet": is_quiet(ld[0], cores), "python": platform.python_version(),
            "system": f"{platform.system()} {platform.release()}", "machine": platform.machine()}


def describe(d: dict | None = None) -> str:
    """One line: CPU model, cores, caches, load averages and the quiet verdict."""
    d = d or info()
    cache = ", ".join(f"{k} {v}" for k, v in d["caches"].items())
    ld = ", ".join(f"{v:.2f}" for v in d["load"])
    verdict = ("quiet" if d["quiet"] else
               f"NOT quiet (load above {QUIET_LOAD_PER_CORE:g} per core: read the CPU-time figures)")
    return (f"{d['cpu']}, {d['cores']} usable cores ({d['logical']} logical)"
            + (f", {cache}" if cache else "")
            + f"; {d['system']} {d['machine']}, Python {d['python']}; load average {ld}; quiet? {verdict}")


def kind(line: str | None = None) -> str:
    """The host *kind* of a :func:`describe` line (this host's when None): the CPU model and the L2
    size per core, e.g. ``AMD EPYC, L2 1024K``. Absolute times (seconds of CPU for one job) are held
    only against a figure documented on the same kind: an AMD EPYC Zen 3 (L2 512K) and Zen 4 (L2
    1024K) report the same model name and plan the same graph in 0.78 and 0.45 s. Ratios measured
    side by side are compared on every host."""
    line = describe() if line is None else line
    cpu = line.split(",", 1)[0].strip()
    m = re.search(r"\bL2 (\S+?)[,;]", line)
    return f"{cpu}, L2 {m.group(1)}" if m else cpu


def load_line() -> str:
    ld = load()
    return f"load {ld[0]:.2f} ({'quiet' if is_quiet(ld[0]) else 'not quiet'})"


# ------------------------------------------------------------------------------------------------
# self-checks: the figures a benchmark measured against its targets and its README's figures
# ------------------------------------------------------------------------------------------------

RSS_NOISE = 0.10   # peak RSS: a fixed +-10 % (it does not depend on load; the imports it holds do move)


def ratio_noise(values) -> tuple[float, float]:
    """(median, noise) of per-round figures (ratios of interleaved rounds): noise is half their
    interquartile range, at least 2 % of the median (the timer and cache state of a single round)."""
    r = sorted(float(v) for v in values)
    if not r:
        return float("nan"), float("nan")
    q = statistics.quantiles(r, n=4, method="inclusive") if len(r) > 1 else [r[0]] * 3
    m = float(statistics.median(r))
    return m, max((q[2] - q[0]) / 2, 0.02 * abs(m))


def section(text: str, marker: str) -> str:
    """The text between the first two ``marker`` lines ("" when the README has no such section)."""
    parts = text.split(marker)
    return parts[1] if len(parts) >= 3 else ""


def tables(text: str) -> list[list[dict[str, str]]]:
    """Every markdown table of ``text``: a list of rows, each {header cell: cell}, cells stripped of
    surrounding spaces (bold markers kept: :func:`number` reads through them)."""
    out: list[list[dict[str, str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
        if line.startswith("|") and re.fullmatch(r"\|(\s*:?-{3,}:?\s*\|)+", nxt):
            head = [c.strip() for c in line.strip("|").split("|")]
            rows = []
            i += 2
            while i < len(lines) and lines[i].strip().startswith("|"):
                cells = [c.strip() for c in lines[i].strip().strip("|").split("|")]
                if len(cells) == len(head):
                    rows.append(dict(zip(head, cells)))
                i += 1
            out.append(rows)
            continue
        i += 1
    return out


def number(cell: str, after: str = "") -> float | None:
    """The first number in ``cell`` (after the text ``after`` when given), bold and thousands
    separators read through: "**0.82×**" -> 0.82, "1,211 MiB" -> 1211.0; None when there is none."""
    if after:
        k = cell.find(after)
        if k < 0:
            return None
        cell = cell[k + len(after):]
    m = re.search(r"-?\d[\d,]*(?:\.\d+)?", cell.replace("*", ""))
    return float(m.group(0).replace(",", "")) if m else None


class Check:
    """The figures of one run held against targets and documented values; ``bad`` names each one off.

    ``wall=True`` marks a wall-clock figure: on a host that is not quiet it is reported ("not
    checked: ...") and never fails the run."""

    def __init__(self, quiet: bool | None = None):
        self.quiet = is_quiet() if quiet is None else quiet
        self.bad: list[str] = []
        self.notes: list[str] = []

    def _skip(self, name: str, wall: bool) -> bool:
        if wall and not self.quiet:
            self.notes.append(f"{name}: a wall-clock figure, reported but not checked: the host was not quiet "
                              f"at the start (load above {QUIET_LOAD_PER_CORE:g} per core), other jobs set it")
            return True
        return False

    def at_most(self, name: str, value: float, limit: float, noise: float = 0.0, wall: bool = False) -> None:
        """Target ``value <= limit``: off when missed by more than ``noise``."""
        if not self._skip(name, wall) and value - noise > limit:
            self.bad.append(f"{name}: {value:.3g} ± {noise:.2g}, target <= {limit:g}")

    def at_least(self, name: str, value: float, limit: float, noise: float = 0.0, wall: bool = False) -> None:
        """Target ``value >= limit``: off when missed by more than ``noise``."""
        if not self._skip(name, wall) and value + noise < limit:
            self.bad.append(f"{name}: {value:.3g} ± {noise:.2g}, target >= {limit:g}")

    def documented(self, name: str, value: float, doc: float | None, allowed: float, wall: bool = False,
                   doc_quiet: bool = True, doc_rounds: list[float] | None = None, noise: float = 0.0) -> None:
        """The README documents ``doc`` for this figure: off when ``|value - doc| > allowed`` and, where the
        README lists the documented run's rounds (``doc_rounds``), ``value`` also lies outside their range
        widened by this run's ``noise`` (a figure whose rounds were bimodal, e.g. 0.78 and 1.14, is not
        off at either mode). A wall-clock figure is compared only when both this run and the documented
        one were on a quiet host."""
        if doc is None:
            self.notes.append(f"{name}: the README documents no figure to compare with")
            return
        if self._skip(name, wall):
            return
        if wall and not doc_quiet:
            self.notes.append(f"{name}: not compared (the README's figure was measured on a host that was not quiet)")
            return
        inside = bool(doc_rounds) and min(doc_rounds) - noise <= value <= max(doc_rounds) + noise
        if abs(value - doc) > allowed and not inside:
            self.bad.append(f"{name}: README documents {doc:.3g}, measured {value:.3g} (allowed ± {allowed:.2g})")

    def absolute(self, name: str, value: float, doc: float | None, allowed: float, doc_host: str | None) -> None:
        """An absolute time against the documented one, compared only when the README's figure was
        measured on this host's :func:`kind` (else a note says where it was measured)."""
        here = kind()
        if doc is not None and doc_host and kind(doc_host) != here:
            self.notes.append(f"{name}: the README's {doc:.3g} was measured on {kind(doc_host)}, this host is "
                              f"{here}: an absolute time, not compared (its target still is)")
            return
        self.documented(name, value, doc, allowed)

    def rss(self, name: str, value_mb: float, doc_mb: float | None) -> None:
        """A peak RSS against the documented one, within the fixed :data:`RSS_NOISE`."""
        self.documented(name, value_mb, doc_mb, RSS_NOISE * (doc_mb or 0.0))

    def finish(self, script: str, no_check: bool = False) -> int:
        """Print the host line, the notes and what is off; the exit status (1 when something is off,
        unless ``no_check``)."""
        for n in dict.fromkeys(self.notes):
            print(f"note: {n}")
        print("host:", describe(), flush=True)
        if self.bad:
            print(f"{script}: FAILED: {len(self.bad)} figure(s) off:", file=sys.stderr)
            for b in self.bad:
                print(f"  {b}", file=sys.stderr)
            return 0 if no_check else 1
        print(f"{script}: all figures within their targets and documented values")
        return 0


if __name__ == "__main__":
    print(describe())
    sys.exit(0)
