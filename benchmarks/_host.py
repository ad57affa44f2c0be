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


def load_line() -> str:
    ld = load()
    return f"load {ld[0]:.2f} ({'quiet' if is_quiet(ld[0]) else 'not quiet'})"


if __name__ == "__main__":
    print(describe())
    sys.exit(0)
