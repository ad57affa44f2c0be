"""What ``optimize`` did: :class:`Application` per place, :class:`OptimizeResult`.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from npu_deploy._result import Result
from npu_deploy.converters.optimize.measure import COST_MODEL, _pct


@dataclasses.dataclass
class Application:
    """One place one rule matched, and what became of it: ``status`` is ``applied``, ``not applicable``
    (``reason`` from the rule's check), ``rolled back`` (numbers or checks failed: ``reason``),
    ``worse`` (verified, but the cost model estimates it slower: dropped by default, kept with
    ``--all``) or ``not faster`` (``--keep-if-faster``)."""

    rule: str
    where: str
    status: str
    reason: str | None = None
    before: dict | None = None
    after: dict | None = None
    max_abs_diff: float | None = None
    #: with a device timer: ``{"before_ms", "after_ms", "runs", "change_pct"}`` (median compute times)
    device: dict | None = None


@dataclasses.dataclass
class OptimizeResult(Result):
    """What ``optimize`` did. ``bool()``: every applied rewrite matched the original's outputs and the
    output passed the checks (rolled-back rewrites are reported, not failures)."""

    SCHEMA: ClassVar[str] = "npu-deploy/optimize-result"
    SCHEMA_VERSION: ClassVar[int] = 1

    model: str
    output: str | None
    soc: str
    rules: list
    inputs: dict
    atol: float
    rtol: float
    before: dict
    after: dict
    applications: list = dataclasses.field(default_factory=list)
    keep_if_faster: bool = False
    outputs_match: bool = True
    #: what judged ``keep_if_faster``: the cost model, or also the device timer (its label)
    measured_by: str = COST_MODEL
    #: with a device timer: the original's and the output's device time ``{"before_ms", "after_ms",
    #: "runs", "margin_pct"}`` (None when no step reached the device)
    device: dict | None = None
    #: which verified steps were kept: ``not worse`` (the default), ``faster`` (``keep_if_faster``), ``all``
    keep: str = "not worse"

    @classmethod
    def from_dict(cls, d: dict) -> "OptimizeResult":
        r = super().from_dict(d)
        r.applications = [a if isinstance(a, Application) else Application(**a) for a in r.applications]
        return r

    def __bool__(self) -> bool:
        return self.outputs_match

    def applied(self) -> list[Application]:
        return [a for a in self.applications if a.status == "applied"]

    def applied_count(self) -> int:
        return len(self.applied())

    def per_rule(self) -> dict[str, dict[str, int]]:
        """Rule name → count per status."""
        out: dict[str, dict[str, int]] = {r: {} for r in self.rules}
        for a in self.applications:
            out.setdefault(a.rule, {})
            out[a.rule][a.status] = out[a.rule].get(a.status, 0) + 1
        return out

    def table(self) -> str:
        timed = any(a.device for a in self.applications)
        rows = [("rule", "applied", "not applicable", "rolled back / worse / not faster", "TransData", "AI CPU",
                 "est. us") + (("device ms",) if timed else ())]
        for rule, counts in self.per_rule().items():
            apps = [a for a in self.applied() if a.rule == rule and a.before is not None]
            td = sum(a.after["transdata"] - a.before["transdata"] for a in apps)
            cpu = sum(a.after["ai_cpu"] - a.before["ai_cpu"] for a in apps)
            us = sum((a.after["est_us"] or 0) - (a.before["est_us"] or 0) for a in apps)
            ms = sum(a.device["after_ms"] - a.device["before_ms"] for a in apps if a.device)
            rows.append((rule, str(counts.get("applied", 0)), str(counts.get("not applicable", 0)),
                         str(counts.get("rolled back", 0) + counts.get("worse", 0) + counts.get("not faster", 0)),
                         f"{td:+d}", f"{cpu:+d}", f"{us:+.1f}") + ((f"{ms:+.3f}",) if timed else ()))
        widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
        return "\n".join("  ".join(c.ljust(w) if k == 0 else c.rjust(w) for k, (c, w) in
                                   enumerate(zip(r, widths))) for r in rows)

    def verdict(self) -> str:
        n = self.applied_count()
        pct = _pct(self.before.get("est_us"), self.after.get("est_us"))
        est = "est. n/a" if pct is None else f"est. {pct:+.0f} %".replace("+-", "-")
        back = sum(1 for a in self.applications if a.status == "rolled back")
        slow = sum(1 for a in self.applications if a.status == "not faster")
        worse = sum(1 for a in self.applications if a.status == "worse")
        tail = "outputs match" if self.outputs_match else "OUTPUTS DIFFER"
        extra = (f", {back} rolled back" if back else "") \
            + (f", {worse} estimated slower and dropped" if worse else "") + (f", {slow} not faster" if slow else "")
        dev = ""
        if self.device:
            b, a = self.device["before_ms"], self.device["after_ms"]
            dpct = _pct(b, a)
            dev = f", device {b:.3f} -> {a:.3f} ms" + ("" if dpct is None else f", {dpct:+.0f} %") \
                + " (ATC + ACL, stand-in verified only)"
        return (f"{n} rewrite{'s' if n != 1 else ''}{extra}, TransData {self.before['transdata']} -> "
                f"{self.after['transdata']}, AI CPU {self.before['ai_cpu']} -> {self.after['ai_cpu']}, "
                f"{est}{dev}, {tail}")
