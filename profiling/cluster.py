"""Multi-rank profiles: one verdict per rank and the cluster view, parsed in parallel.

A *cluster folder* holds one profile per rank: ``*_ascend_pt`` / ``*_ascend_ms`` folders (torch_npu,
MindSpore; one per rank), ``PROF_*`` folders (msprof; one per process), or the ``device_N`` folders of one
``PROF_*`` folder whose ``summary`` was exported per device. Every entry of the folder is a candidate rank;
one that holds no profile is reported and skipped, never fatal.

Each rank is analysed by :func:`~npu_deploy.profiling.analyze.analyze_profile` in a worker process (a
process pool locally; Ray tasks when ``address`` is given, which then needs the folder at the same path on
every node). The analysis streams its rows, a worker holds one rank at a time and sends back only a small
summary of it, so memory stays bounded per worker whatever the number of ranks (Ray workers are also
replaced after :data:`TASKS_PER_WORKER` ranks).

The cluster view (:class:`ClusterReport`):

* the FormatTrans share of every rank against the threshold (one verdict line each; one flagged rank
  flags the cluster);
* the slowest rank (most device compute time) and by how much it exceeds the median rank;
* where TransData time differs between ranks: per conversion kind (``NCHW→NC1HWC0``...), the time on each
  rank, the ranks with the least and the most, largest spread first.

>>> from npu_deploy.profiling.cluster import analyze_cluster                     # doctest: +SKIP
>>> print(analyze_cluster("cluster_prof/").verdict())                             # doctest: +SKIP
8 ranks: FormatTrans 3.1-9.4 % (threshold 8 %): FLAGGED (1 of 8 ranks: rank_5); slowest rank_5 +12.0 % vs median
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import html
import multiprocessing
import os
import re
import resource
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from npu_deploy._html import page
from npu_deploy._io import atomic_write
from npu_deploy._ray import connect, import_ray
from npu_deploy._result import Result
from npu_deploy._text import printable
from npu_deploy._thresholds import FORMATTRANS_THRESHOLD_PCT
from npu_deploy.errors import ExternalError, NpuDeployError, ProfileError
from npu_deploy.profiling.analyze import analyze_profile

#: rank folder names: torch_npu / MindSpore per-rank folders, msprof PROF folders and device folders
RANK_NAME = re.compile(r"(_ascend_(pt|ms)$)|(^PROF_)|(^device_\d+$)|(^rank[_-]?\d+)", re.I)
#: ranks one Ray worker process analyses before Ray replaces it (bounds what a long run can accumulate)
TASKS_PER_WORKER = 8
#: a TransData kind is listed as differing when its spread is at least this share of its mean ...
SPREAD_MIN_RATIO = 0.10
#: ... and at least this share of the median rank's device compute time
SPREAD_MIN_OF_COMPUTE = 0.001


@dataclass
class RankResult:
    """One rank: its verdict and shares, or why it was skipped (``error``)."""

    rank: str
    path: str
    ok: bool = True
    error: str | None = None
    verdict: str = ""
    compute_us: float = 0.0
    compute_ops: int = 0
    formattrans_us: float = 0.0
    formattrans_pct: float = 0.0
    transdata_us: float = 0.0
    transdata_pct: float = 0.0
    flagged: bool = False
    estimated: bool = False
    #: TransData time by conversion kind label (``NCHW→NC1HWC0``), µs
    transdata_kinds: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    #: peak resident memory of the worker process that analysed this rank, MB
    worker_rss_mb: float = 0.0


@dataclass
class TransDataSpread:
    """One TransData kind whose time differs between ranks."""

    kind: str
    per_rank_us: dict
    min_rank: str
    min_us: float
    max_rank: str
    max_us: float
    spread_us: float


@dataclass
class ClusterReport(Result):
    """The cluster view of a folder of per-rank profiles. ``bool(report)`` is True when no rank is flagged.

    >>> r = ClusterReport(path="c", ranks=[RankResult("r0", "c/r0", compute_us=100.0, formattrans_pct=2.0)])
    >>> r.verdict()
    '1 ranks: FormatTrans 2.0 % (threshold 8 %): ok'
    """

    SCHEMA: ClassVar[str] = "npu-deploy/cluster-profile-report"
    SCHEMA_VERSION: ClassVar[int] = 1

    path: str = ""
    threshold_pct: float = FORMATTRANS_THRESHOLD_PCT
    include_transpose: bool = True
    workers: int = 0
    executor: str = "process pool"
    ranks: list[RankResult] = field(default_factory=list)
    slowest_rank: str | None = None
    slowest_over_median_pct: float = 0.0
    fastest_rank: str | None = None
    slowest_over_fastest_pct: float = 0.0
    transdata_spread: list[TransDataSpread] = field(default_factory=list)
    max_worker_rss_mb: float = 0.0

    def __bool__(self) -> bool:
        return not any(r.flagged for r in self.analysed())

    @property
    def flagged(self) -> bool:
        return not bool(self)

    def analysed(self) -> list[RankResult]:
        return [r for r in self.ranks if r.ok]

    def skipped(self) -> list[RankResult]:
        return [r for r in self.ranks if not r.ok]

    def verdict(self) -> str:
        ok = self.analysed()
        if not ok:
            return f"0 of {len(self.ranks)} ranks hold a profile: nothing analysed"
        shares = [r.formattrans_pct for r in ok]
        lo, hi = min(shares), max(shares)
        span = f"{lo:.1f} %" if len(ok) == 1 or abs(hi - lo) < 0.05 else f"{lo:.1f}-{hi:.1f} %"
        line = f"{len(ok)} ranks: FormatTrans {span} (threshold {self.threshold_pct:g} %): "
        bad = [r for r in ok if r.flagged]
        if bad:  # a rank of several devices is flagged when one device is: name ranks, not a pooled share
            names = ", ".join(printable(r.rank) for r in bad[:3]) + (", ..." if len(bad) > 3 else "")
            line += f"FLAGGED ({len(bad)} of {len(ok)} ranks: {names})"
        else:
            line += "ok"
        if self.slowest_rank is not None and len(ok) > 1:
            line += f"; slowest {printable(self.slowest_rank)} +{self.slowest_over_median_pct:.1f} % vs median"
        if self.skipped():
            line += f"; {len(self.skipped())} skipped (not a profile)"
        return line

    @classmethod
    def from_dict(cls, d: dict) -> "ClusterReport":
        d = dict(d)
        d["ranks"] = [RankResult(**{k: v for k, v in x.items() if k in _names(RankResult)}) for x in d.get("ranks", [])]
        d["transdata_spread"] = [TransDataSpread(**{k: v for k, v in x.items() if k in _names(TransDataSpread)})
                                 for x in d.get("transdata_spread", [])]
        return cls(**{k: v for k, v in d.items() if k in _names(cls)})


def _names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


# ------------------------------------------------------------------------------------------ ranks
def is_cluster_folder(path: str | os.PathLike) -> bool:
    """True when ``path`` is a folder holding at least two rank folders (by their names), or a PROF
    folder with at least two exported ``device_N/summary`` folders."""
    p = Path(path)
    if not p.is_dir():
        return False
    try:
        names = [e.name for e in os.scandir(p) if e.is_dir()]
    except OSError:
        return False
    if sum(1 for n in names if RANK_NAME.search(n)) >= 2:
        return True
    return len(_device_folders(p)) >= 2


def _device_folders(p: Path) -> list[Path]:
    try:
        return sorted((e.path for e in os.scandir(p) if e.is_dir() and re.fullmatch(r"device_\d+", e.name)
                       and (Path(e.path) / "summary").is_dir()), key=lambda s: int(s.rsplit("_", 1)[1]))
    except OSError:
        return []


def rank_paths(path: str | os.PathLike) -> list[Path]:
    """The candidate ranks of a cluster folder, in natural order (``rank_2`` before ``rank_10``)."""
    top = Path(path)
    if not top.is_dir():
        raise ProfileError("not a folder", path=str(top), hint="give the folder holding one profile per rank")
    devices = _device_folders(top)
    if len(devices) >= 2:
        return [Path(d) for d in devices]
    out = []
    for e in os.scandir(top):
        if e.name.startswith(".") or e.name == "__pycache__":
            continue
        out.append(Path(e.path))
    return sorted(out, key=_natural)


def _natural(p: Path):
    return [int(t) if t.isdigit() else t.lower() for t in re.split(r"(\d+)", p.name)]


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def analyze_rank(path: str, rank: str, threshold: float, include_transpose: bool) -> RankResult:
    """Analyse one rank (runs in a worker). A folder that is not a profile comes back with ``ok=False``."""
    try:
        r = analyze_profile(path, threshold=threshold, include_transpose=include_transpose)
    except NpuDeployError as e:
        return RankResult(rank=rank, path=path, ok=False, error=str(e), worker_rss_mb=_peak_rss_mb())
    except (OSError, UnicodeError) as e:  # a vanished or unreadable rank must not end the others
        return RankResult(rank=rank, path=path, ok=False, error=f"cannot read it ({e})", worker_rss_mb=_peak_rss_mb())
    kinds: dict[str, float] = {}
    for k in r.conversions:
        if k.category == "format":
            kinds[k.label] = kinds.get(k.label, 0.0) + k.total_us
    return RankResult(rank=rank, path=path, verdict=r.verdict(), compute_us=r.compute_us, compute_ops=r.compute_ops,
                      formattrans_us=r.formattrans_us, formattrans_pct=r.formattrans_pct,
                      transdata_us=r.transdata_us, transdata_pct=r.transdata_pct, flagged=r.flagged,
                      estimated=r.estimated, transdata_kinds=kinds, warnings=r.warnings[:5],
                      worker_rss_mb=_peak_rss_mb())


def _analyze_rank_star(args) -> RankResult:
    return analyze_rank(*args)


def analyze_cluster(path: str | os.PathLike, *, threshold: float | None = None, include_transpose: bool = True,
                    workers: int | None = None, address: str | None = None) -> ClusterReport:
    """Analyse every rank under ``path`` in parallel and build the cluster view.

    ``workers``: processes (default: the CPU count, at most the number of ranks); ``address``: a Ray
    cluster (``host:port``, ``ray://host:port``, ``auto``) whose nodes see ``path`` at the same place.

    >>> analyze_cluster("cluster_prof/", workers=2).slowest_rank                   # doctest: +SKIP
    'rank_5_ascend_pt'
    """
    threshold = FORMATTRANS_THRESHOLD_PCT if threshold is None else float(threshold)
    if not (0.0 <= threshold <= 100.0):
        raise ProfileError(f"threshold {threshold:g} is not a percentage between 0 and 100", hint="e.g. --threshold 8")
    top = Path(path)
    paths = rank_paths(top)
    if not paths:
        raise ProfileError("the folder is empty: no rank profiles in it", path=str(top),
                           hint="give the folder holding one *_ascend_pt / PROF_* folder per rank")
    jobs = [(str(p), p.name, threshold, bool(include_transpose)) for p in paths]
    if address is not None:
        results, n, how = _run_on_ray(jobs, address, workers)
    else:
        n = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
        results, how = _run_in_pool(jobs, n), "process pool"
    report = ClusterReport(path=str(top), threshold_pct=threshold, include_transpose=bool(include_transpose),
                           workers=n, executor=how, ranks=results)
    _cluster_view(report)
    return report


def _run_in_pool(jobs: list, n: int) -> list[RankResult]:
    if n == 1:
        return [_analyze_rank_star(j) for j in jobs]
    # spawn: a fresh interpreter per worker (no state forked from a caller that may hold threads or Ray).
    # No max_tasks_per_child: on Python 3.11 replacing a retired worker can hang the pool (seen with 64
    # ranks); a worker's memory is bounded by the one rank it parses, which it frees before the next.
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=n, mp_context=ctx) as pool:
        try:
            return list(pool.map(_analyze_rank_star, jobs, chunksize=1))
        except cf.process.BrokenProcessPool as e:
            raise ExternalError(f"a worker parsing the ranks died ({e}); out of memory?",
                                hint="retry with fewer --workers") from None


def _run_on_ray(jobs: list, address: str, workers: int | None) -> tuple[list[RankResult], int, str]:
    started = connect(address)
    ray = import_ray()
    try:
        task = ray.remote(num_cpus=1, max_calls=TASKS_PER_WORKER)(analyze_rank)
        n = workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        results: dict[int, RankResult] = {}
        pending: dict = {}
        it = iter(enumerate(jobs))
        exhausted = False
        while True:
            while not exhausted and len(pending) < n:  # bounded in flight: summaries only, n at a time
                nxt = next(it, None)
                if nxt is None:
                    exhausted = True
                    break
                i, job = nxt
                pending[task.remote(*job)] = i
            if not pending:
                break
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                i = pending.pop(ref)
                try:
                    results[i] = ray.get(ref)
                except ray.exceptions.RayError as e:
                    text = str(e).strip().splitlines()
                    results[i] = RankResult(rank=jobs[i][1], path=jobs[i][0], ok=False,
                                            error=f"the Ray task failed ({text[-1][:200] if text else type(e).__name__})")
        return [results[i] for i in range(len(jobs))], n, f"Ray at {address}"
    finally:
        if started:
            ray.shutdown()


# ------------------------------------------------------------------------------------------ the view
def _median(xs: list[float]) -> float:
    s = sorted(xs)
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2.0


def _cluster_view(rep: ClusterReport) -> None:
    ok = rep.analysed()
    rep.max_worker_rss_mb = max((r.worker_rss_mb for r in rep.ranks), default=0.0)
    if not ok:
        return
    slow = max(ok, key=lambda r: r.compute_us)
    fast = min(ok, key=lambda r: r.compute_us)
    med = _median([r.compute_us for r in ok])
    rep.slowest_rank, rep.fastest_rank = slow.rank, fast.rank
    rep.slowest_over_median_pct = 100.0 * (slow.compute_us - med) / med if med > 0 else 0.0
    rep.slowest_over_fastest_pct = 100.0 * (slow.compute_us - fast.compute_us) / fast.compute_us \
        if fast.compute_us > 0 else 0.0
    if len(ok) < 2:
        return
    kinds = sorted({k for r in ok for k in r.transdata_kinds})
    spreads = []
    for k in kinds:
        per = {r.rank: float(r.transdata_kinds.get(k, 0.0)) for r in ok}
        lo_rank = min(per, key=per.get)
        hi_rank = max(per, key=per.get)
        spread = per[hi_rank] - per[lo_rank]
        mean = sum(per.values()) / len(per)
        if spread <= 0 or spread < SPREAD_MIN_RATIO * mean or spread < SPREAD_MIN_OF_COMPUTE * med:
            continue
        spreads.append(TransDataSpread(kind=k, per_rank_us=per, min_rank=lo_rank, min_us=per[lo_rank],
                                       max_rank=hi_rank, max_us=per[hi_rank], spread_us=spread))
    rep.transdata_spread = sorted(spreads, key=lambda s: -s.spread_us)


# ------------------------------------------------------------------------------------------ rendering
def _us(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:.2f} s"
    if us >= 1e3:
        return f"{us / 1e3:.2f} ms"
    return f"{us:.1f} µs"


def render_cluster_text(rep: ClusterReport, *, top: int = 10) -> str:
    """Terminal text: one verdict line per rank, skipped ranks, slowest rank, TransData spread, summary."""
    lines = []
    width = max([8] + [len(printable(r.rank)) for r in rep.ranks])
    for r in rep.analysed():
        lines.append(f"{printable(r.rank):<{width}}  {printable(r.verdict)}")
    for r in rep.skipped():
        why = printable(r.error or "")
        lines.append(f"{printable(r.rank):<{width}}  skipped: {why[:117] + '...' if len(why) > 120 else why}")
    ok = rep.analysed()
    if len(ok) > 1:
        lines.append("")
        lines.append(f"Slowest rank: {printable(rep.slowest_rank)} "
                     f"({_us(max(r.compute_us for r in ok))} device compute), "
                     f"+{rep.slowest_over_median_pct:.1f} % vs the median rank, "
                     f"+{rep.slowest_over_fastest_pct:.1f} % vs the fastest ({printable(rep.fastest_rank)})")
        if rep.transdata_spread:
            lines.append("TransData time that differs between ranks (largest spread first):")
            for s in rep.transdata_spread[:top]:
                lines.append(f"  {printable(s.kind):<28} {printable(s.min_rank)} {_us(s.min_us)} .. "
                             f"{printable(s.max_rank)} {_us(s.max_us)} (spread {_us(s.spread_us)})")
        else:
            lines.append("TransData time is the same on every rank (within 10 %).")
    lines.append(f"Parsed by {rep.workers} workers ({rep.executor}); peak worker memory {rep.max_worker_rss_mb:.0f} MB")
    lines.append("Summary: " + printable(rep.verdict()))
    return "\n".join(lines)


def _e(x) -> str:
    return html.escape("" if x is None else str(x), quote=True)


def _chart(rep: ClusterReport) -> str:
    """A horizontal bar per rank: FormatTrans share, with the threshold as a dashed line (inline SVG)."""
    ok = rep.analysed()
    bar_h, gap, left, width = 18, 6, 220, 460
    scale = max([rep.threshold_pct * 1.25] + [r.formattrans_pct * 1.1 for r in ok]) or 10.0
    height = len(ok) * (bar_h + gap) + 30
    out = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{left + width + 80}' height='{height}' role='img' "
           f"aria-label='FormatTrans share per rank'>"]
    for i, r in enumerate(ok):
        y = i * (bar_h + gap) + 4
        w = width * r.formattrans_pct / scale
        color = "#d9534f" if r.flagged else "#5cb85c"
        est = " (estimate)" if r.estimated else ""
        out.append(f"<text x='{left - 8}' y='{y + bar_h - 5}' text-anchor='end'>{_e(r.rank[:32])}{est}</text>")
        out.append(f"<rect x='{left}' y='{y}' width='{w:.1f}' height='{bar_h}' fill='{color}'>"
                   f"<title>{_e(r.rank)}: {r.formattrans_pct:.2f} %</title></rect>")
        out.append(f"<text x='{left + w + 4:.1f}' y='{y + bar_h - 5}'>{r.formattrans_pct:.1f} %</text>")
    tx = left + width * rep.threshold_pct / scale
    out.append(f"<line x1='{tx:.1f}' x2='{tx:.1f}' y1='0' y2='{height - 22}' stroke='#333' stroke-dasharray='4 3'/>")
    out.append(f"<text x='{tx:.1f}' y='{height - 8}' text-anchor='middle'>threshold {rep.threshold_pct:g} %</text>")
    out.append("</svg>")
    return "".join(out)


def render_cluster_html(rep: ClusterReport, *, top: int = 20) -> str:
    """One self-contained page (inline CSS and SVG, no script, no network); every name escaped."""
    cls = "flagged" if rep.flagged else "ok"
    out = ["<h1>FormatTrans across ranks</h1>", f"<div class='muted small'>{_e(rep.path)}</div>",
           f"<div class='verdict {cls}'>{_e(rep.verdict())}</div>", "<h2>FormatTrans share per rank</h2>",
           _chart(rep), "<h2>Ranks</h2><table><tr><th>rank</th><th class='num'>device compute</th>"
           "<th class='num'>FormatTrans</th><th class='num'>TransData</th><th>verdict</th></tr>"]
    for r in rep.analysed():
        mark = " (slowest)" if r.rank == rep.slowest_rank and len(rep.analysed()) > 1 else ""
        est = "<span class='est'>emulator estimate</span>" if r.estimated else ""
        out.append(f"<tr><td>{_e(r.rank)}{mark}{est}</td><td class='num'>{_e(_us(r.compute_us))}</td>"
                   f"<td class='num'>{r.formattrans_pct:.2f} %</td><td class='num'>{_e(_us(r.transdata_us))}</td>"
                   f"<td>{'FLAGGED' if r.flagged else 'ok'}</td></tr>")
    out.append("</table>")
    n_est = sum(1 for r in rep.analysed() if r.estimated)
    if n_est:
        out.append(f"<p class='small'><span class='est'>emulator estimate</span> {n_est} of {len(rep.analysed())} "
                   "ranks were profiled on the CPU emulator: their durations come from its cost model, not from "
                   "an NPU.</p>")
    if len(rep.analysed()) > 1:
        out.append(f"<p>Slowest rank <b>{_e(rep.slowest_rank)}</b>: +{rep.slowest_over_median_pct:.1f} % device "
                   f"compute vs the median rank, +{rep.slowest_over_fastest_pct:.1f} % vs the fastest "
                   f"({_e(rep.fastest_rank)}).</p>")
    if rep.transdata_spread:
        out.append("<h2>TransData time that differs between ranks</h2><table><tr><th>kind</th><th>least</th>"
                   "<th>most</th><th class='num'>spread</th></tr>")
        for s in rep.transdata_spread[:top]:
            out.append(f"<tr><td>{_e(s.kind)}</td><td>{_e(s.min_rank)} {_e(_us(s.min_us))}</td>"
                       f"<td>{_e(s.max_rank)} {_e(_us(s.max_us))}</td><td class='num'>{_e(_us(s.spread_us))}</td></tr>")
        out.append("</table>")
    if rep.skipped():
        out.append("<h2>Skipped (not a profile)</h2><ul class='small'>")
        for r in rep.skipped():
            out.append(f"<li>{_e(r.rank)}: {_e(r.error)}</li>")
        out.append("</ul>")
    out.append(f"<p class='muted small'>Shares are of device compute time (communication excluded). Parsed by "
               f"{rep.workers} workers ({_e(rep.executor)}). Schema {_e(rep.SCHEMA)} v{rep.SCHEMA_VERSION}. "
               f"Generated by npu-deploy.</p>")
    return page(f"npu-deploy cluster profile: {rep.verdict()}", "\n".join(out))


def write_cluster_html(rep: ClusterReport, path: str | os.PathLike) -> None:
    """Write :func:`render_cluster_html` atomically."""
    text = render_cluster_html(rep)
    with atomic_write(path, "w", encoding="utf-8") as f:
        f.write(text)
