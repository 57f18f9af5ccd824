"""Declarative conditions over the record's figures, with staleness, and the release decision.

Each condition names a *check* (below), a severity, a maximum age and the identity parts its
evidence must share with the released run. Evaluation is a pure function of the figures, the
sources' identities, the released run's identity and the time, so ``field record check`` can redo it
from ``record.json`` alone, at a later time, where evidence may have aged out.

The decision is the conjunction of the critical conditions and nothing else: missing or stale
evidence for a critical condition holds it, and no advisory figure (a good forecast, a high goodput)
can offset a critical failure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from lightning_field.record.errors import RecordConfigError
from lightning_field.record.identity import staleness_reasons

PASS, FAIL, MISSING, STALE = "pass", "fail", "missing", "stale"
OWN_RUN_KINDS = ("checkpoint", "profile", "events", "time_to_quality")  # what a run records about itself
GO, HOLD = "go", "hold"
RULE = (
    "go only when every critical condition passes with fresh evidence; missing or stale evidence holds it,"
    " and advisory figures are shown but cannot offset a critical failure"
)


@dataclass
class Outcome:
    status: str
    detail: str
    figures: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)


@dataclass
class Context:
    """What a check sees: the figures, and why any one of them is stale for this condition."""

    figures: Sequence[Mapping[str, Any]]
    release: Mapping[str, Any]
    reasons: Callable[[Mapping[str, Any]], list[str]]

    def named(self, name: str, released_only: bool = False) -> list[Mapping[str, Any]]:
        """Figures called ``name``, newest first; ``released_only``: from the released run's directory."""
        found = [f for f in self.figures if f["name"] == name]
        run_dir = self.release.get("run_dir")
        if released_only and run_dir:
            found = [f for f in found if f["source"]["path"].startswith(str(run_dir).rstrip("/") + "/")]
        return sorted(found, key=lambda f: f.get("date_unix") or 0.0, reverse=True)

    def released_or_any(self, name: str) -> list[Mapping[str, Any]]:
        """Figures called ``name`` from the released run's directory if it has any, else from anywhere."""
        return self.named(name, released_only=True) or self.named(name)

    def freshest(self, figures: Sequence[Mapping[str, Any]]) -> tuple[Mapping[str, Any] | None, list[str]]:
        """The newest fresh figure, or (None, why the newest one is stale)."""
        for figure in figures:
            if not self.reasons(figure):
                return figure, []
        return None, self.reasons(figures[0]) if figures else []

    def fresh(self, found: Sequence[Mapping[str, Any]], missing: str, what: str) -> Mapping[str, Any] | Outcome:
        """The newest fresh figure of ``found``, or the outcome saying there is none (``missing``) or that
        every one is stale (naming ``what``): the common start of a check."""
        if not found:
            return Outcome(MISSING, missing)
        figure, reasons = self.freshest(found)
        return _stale(found[0], reasons, what) if figure is None else figure


@dataclass
class Check:
    """One kind of condition: its parameters (with defaults) and its evaluation."""

    params: dict[str, Any]
    evaluate: Callable[[Mapping[str, Any], Context], Outcome]
    doc: str

    def validate(self, params: dict[str, Any], where: str) -> None:
        unknown = set(params) - set(self.params)
        if unknown:
            raise RecordConfigError(f"{where}: unknown parameter(s) {sorted(unknown)}; known: {sorted(self.params)}")
        for key, default in self.params.items():
            value = params.setdefault(key, default)
            if isinstance(default, list) and not isinstance(value, list):
                raise RecordConfigError(f"{where}.{key}: {value!r} must be a list")
            if isinstance(default, bool) and not isinstance(value, bool):
                raise RecordConfigError(f"{where}.{key}: {value!r} must be true or false")
            number = isinstance(default, (int, float)) and not isinstance(default, bool)
            if number and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
                raise RecordConfigError(f"{where}.{key}: {value!r} must be a non-negative number")
        if "confidence" in params and not 0 < params["confidence"] < 1:
            raise RecordConfigError(f"{where}.confidence: {params['confidence']!r} must be in (0, 1)")


def _stale(figure: Mapping[str, Any] | None, reasons: list[str], what: str) -> Outcome:
    ids = [figure["id"]] if figure else []
    return Outcome(STALE, f"{what} is stale: " + "; ".join(reasons), ids, reasons)


# ---------------------------------------------------------------------------------------------- checks
def _resume_evidence(params: Mapping[str, Any], ctx: Context) -> Outcome:
    bundles = ctx.named("resume_evidence")
    if not bundles:
        return Outcome(MISSING, "no resume evidence bundle found (field-evidence writes one)")
    wide = [b for b in bundles if (b["value"].get("world_size") or 1) >= params["min_world_size"]]
    if not wide:
        sizes = sorted({b["value"].get("world_size") for b in bundles})
        return Outcome(
            MISSING, f"no resume evidence at >= {params['min_world_size']} ranks (found world sizes {sizes})"
        )
    figure, reasons = ctx.freshest(wide)
    if figure is None:
        return _stale(wide[0], reasons, f"resume evidence {wide[0]['value'].get('id')}")
    v = figure["value"]
    problems = []
    if v.get("verdict") not in params["accept_verdicts"]:
        problems.append(f"verdict {v.get('verdict')!r} is not one of {params['accept_verdicts']}")
    if not v.get("gate_passed"):
        problems.append(f"its gate failed ({', '.join(v.get('gate_failed') or [])})")
    if not v.get("bundle_check_passed"):
        problems.append("the bundle is damaged: " + "; ".join(v.get("bundle_problems") or []))
    where = f"evidence {v.get('id')} ({v.get('world_size')} rank(s))"
    if problems:
        return Outcome(FAIL, f"{where}: " + "; ".join(problems) + f" — {v.get('summary')}", [figure["id"]])
    return Outcome(PASS, f"{where}: verdict {v.get('verdict')}, gate passed — {v.get('summary')}", [figure["id"]])


def _newest_checkpoint(params: Mapping[str, Any], ctx: Context) -> Outcome:
    newest = ctx.named("newest_checkpoint", released_only=True)
    if not newest:
        return Outcome(MISSING, "the released run has no committed checkpoint")
    figure = newest[0]
    reasons = ctx.reasons(figure)
    if reasons:
        return _stale(figure, reasons, f"checkpoint {figure['value']['name']}")
    v = figure["value"]
    intact = next((f for f in ctx.named("checkpoint_intact") if f["source"]["id"] == figure["source"]["id"]), None)
    ids = [figure["id"], *([intact["id"]] if intact else [])]
    if not v["recoverable"]:
        return Outcome(
            FAIL, f"{v['name']} (step {v['step']}) is not recoverable, it lacks: {'; '.join(v['missing'])}", ids
        )
    if intact is None or not intact["value"]:
        problems = "; ".join(intact["limitations"]) if intact else "not verified"
        return Outcome(FAIL, f"{v['name']} (step {v['step']}) failed verification: {problems}", ids)
    return Outcome(PASS, f"{v['name']} (step {v['step']}) is recoverable and every file matches its manifest", ids)


def _restore_tested(params: Mapping[str, Any], ctx: Context) -> Outcome:
    drills = ctx.named("restore_drill", released_only=True)
    newest = ctx.named("newest_checkpoint", released_only=True)
    failed = [d for d in drills if d["value"].get("outcome") == "mismatch"]
    if failed:
        names = ", ".join(d["value"]["checkpoint"] for d in failed)
        return Outcome(FAIL, f"a restore drill found a mismatch: {names}", [d["id"] for d in failed])
    if params["require_newest"]:
        if not newest:
            return Outcome(MISSING, "the released run has no committed checkpoint")
        v = newest[0]["value"]
        if not v["restore_tested"]:
            return Outcome(FAIL, f"the newest checkpoint {v['name']} was never restored by a drill", [newest[0]["id"]])
        return Outcome(PASS, f"the newest checkpoint {v['name']} passed a restore drill", [newest[0]["id"]])
    passed = [d for d in drills if d["value"].get("passed")]
    if not passed:
        return Outcome(MISSING, "no checkpoint of the released run was restore-tested (RestoreDrill is off?)")
    figure, reasons = ctx.freshest(passed)
    if figure is None:
        return _stale(passed[0], reasons, f"restore drill of {passed[0]['value']['checkpoint']}")
    v = figure["value"]
    newest_name = newest[0]["value"]["name"] if newest else "?"
    return Outcome(
        PASS,
        f"{len(passed)} drill(s) passed, newest on {v['checkpoint']} (step {v['step']}); none failed;"
        f" the newest checkpoint {newest_name} shares its identity",
        [figure["id"]],
    )


def _no_stragglers(params: Mapping[str, Any], ctx: Context) -> Outcome:
    found = ctx.released_or_any("straggler_reports")
    figure = ctx.fresh(
        found, "no straggler reports (StragglerMonitor writes field/profile/reports.jsonl)", "the straggler reports"
    )
    if isinstance(figure, Outcome):
        return figure
    total, n = figure["value"]["reports"], int(params["last_n_reports"])
    recent = [r for r in figure["value"]["flagged"] if r["index"] >= total - n]
    if recent:
        flags = "; ".join(
            f"step {r['step']}: rank {f.get('rank')} ({f.get('host')}) in {f.get('section')}"
            for r in recent
            for f in r["flags"]
        )
        return Outcome(FAIL, f"stragglers flagged in the last {n} of {total} reports: {flags}", [figure["id"]])
    return Outcome(PASS, f"no rank flagged in the last {min(n, total)} of {total} reports", [figure["id"]])


def _time_to_quality(params: Mapping[str, Any], ctx: Context) -> Outcome:
    found = ctx.released_or_any("time_to_quality")
    figure = ctx.fresh(
        found, "no time-to-quality summary (TimeToQuality writes field/time_to_quality.json)", "time to quality"
    )
    if isinstance(figure, Outcome):
        return figure
    v, ids = figure["value"], [figure["id"]]
    if v.get("deadline_s") is None:
        return Outcome(MISSING, "no deadline set (callbacks.time_to_quality.deadline_hours)", ids)
    deadline_h = v["deadline_s"] / 3600
    if v.get("reached"):
        verdict = PASS if v.get("deadline_met") else FAIL
        return Outcome(
            verdict,
            f"target reached at step {v['step']} after {v['wall_s']:.1f} s, deadline"
            f" {deadline_h:g} h {'met' if verdict == PASS else 'MISSED'} (measured)",
            ids,
        )
    miss = v.get("deadline_miss_probability")
    if not v.get("forecast_available") or miss is None:
        return Outcome(MISSING, f"not reached and {v.get('forecast_reason') or 'no forecast'}", ids)
    allowed = 1 - params["confidence"]
    verdict = PASS if miss <= allowed else FAIL
    return Outcome(
        verdict,
        f"not reached; forecast misses the {deadline_h:g} h deadline with probability {miss:.2f}"
        f" (allowed {allowed:.2f} at {params['confidence']:.0%} confidence) (estimate)",
        ids,
    )


def _goodput(params: Mapping[str, Any], ctx: Context) -> Outcome:
    found = ctx.released_or_any("goodput")
    figure = ctx.fresh(found, "no event log to compute goodput from", "goodput")
    if isinstance(figure, Outcome):
        return figure
    value = figure["value"]
    verdict = PASS if value >= params["min_goodput"] else FAIL
    return Outcome(
        verdict, f"goodput {value:.1%} (minimum {params['min_goodput']:.0%}); {figure['population']}", [figure["id"]]
    )


def _preflight(params: Mapping[str, Any], ctx: Context) -> Outcome:
    found = ctx.named("preflight")
    figure = ctx.fresh(
        found, "no preflight record (field preflight writes field/preflight/preflight.json)", "the preflight"
    )
    if isinstance(figure, Outcome):
        return figure
    v = figure["value"]
    if not v["passed"]:
        return Outcome(FAIL, f"preflight failed: {', '.join(v['failed'])}", [figure["id"]])
    return Outcome(PASS, "preflight passed (data and labels, tiny overfit, baseline, fit)", [figure["id"]])


def _scaling(params: Mapping[str, Any], ctx: Context) -> Outcome:
    found = ctx.named("scaling")
    figure = ctx.fresh(found, "no scaling record (field scale writes scale.json)", "the scaling study")
    if isinstance(figure, Outcome):
        return figure
    v = figure["value"]
    problems = []
    if v["max_ranks"] < params["min_ranks"]:
        problems.append(f"measured up to {v['max_ranks']} rank(s), {params['min_ranks']} needed")
    if v.get("decision") != "add devices":
        problems.append(f"verdict: {v.get('message')}")
    if (v.get("efficiency") or 0.0) < params["min_efficiency"]:
        problems.append(f"efficiency {v.get('efficiency') or 0:.2f} < {params['min_efficiency']}")
    if not v.get("gradients_equivalent"):
        problems.append("gradients not equivalent across rank counts")
    if problems:
        return Outcome(FAIL, "; ".join(problems), [figure["id"]])
    return Outcome(PASS, f"{v['max_ranks']} ranks at {v['efficiency']:.0%} efficiency: add devices", [figure["id"]])


CHECKS: dict[str, Check] = {
    "resume_evidence": Check(
        {"accept_verdicts": ["exact", "within_noise"], "min_world_size": 1},
        _resume_evidence,
        "the newest fresh evidence bundle passed its gate with an accepted verdict",
    ),
    "newest_checkpoint_recoverable": Check({}, _newest_checkpoint, "the newest checkpoint is recoverable and intact"),
    "restore_tested": Check({"require_newest": False}, _restore_tested, "a restore drill passed; none failed"),
    "no_stragglers": Check({"last_n_reports": 5}, _no_stragglers, "no straggler in the last N reports"),
    "time_to_quality": Check({"confidence": 0.8}, _time_to_quality, "target within the deadline"),
    "goodput": Check({"min_goodput": 0.8}, _goodput, "goodput at least the minimum"),
    "preflight": Check({}, _preflight, "preflight passed"),
    "scaling": Check({"min_ranks": 2, "min_efficiency": 0.7}, _scaling, "the scaling study says add devices"),
}


# ---------------------------------------------------------------------------------------------- evaluation
def evaluate_conditions(
    conditions: Sequence[Any],
    figures: Sequence[Mapping[str, Any]],
    sources: Mapping[str, Mapping[str, Any]],
    release: Mapping[str, Any],
    now: float,
    roles_for: Callable[[str], list[str]] = lambda _: [],
) -> list[dict[str, Any]]:
    """Every condition's result: status (pass/fail/missing/stale), detail, figures used, staleness."""
    results = []
    for spec in conditions:

        def reasons(figure: Mapping[str, Any], spec: Any = spec) -> list[str]:
            source = sources[figure["source"]["id"]]
            run_dir = str(release.get("run_dir") or "").rstrip("/") + "/"
            own = run_dir != "/" and source.get("kind") in OWN_RUN_KINDS and str(source.get("path")).startswith(run_dir)
            out = staleness_reasons(
                source["identity"],
                source.get("config_projection"),
                release.get("identity") or {},
                release.get("config_projection"),
                spec.compare_identity,
                own_run=own,
            )
            if spec.max_age_hours is not None:
                when = figure.get("date_unix")
                if when is None:
                    out.append("undated, and the condition has a maximum age")
                elif (age := (now - when) / 3600) > spec.max_age_hours:
                    out.append(f"{age:.1f} h old, the condition allows {spec.max_age_hours:g} h")
            return out

        outcome = CHECKS[spec.check].evaluate(spec.params, Context(figures, release, reasons))
        results.append(
            {
                "name": spec.name,
                "check": spec.check,
                "severity": spec.severity,
                "description": spec.description,
                "max_age_hours": spec.max_age_hours,
                "compare_identity": list(spec.compare_identity),
                "params": dict(spec.params),
                "roles": roles_for(spec.name),
                **asdict(outcome),
                "passed": outcome.status == PASS,
            }
        )
    return results


def decide(results: Sequence[Mapping[str, Any]], missing_signoffs: Sequence[str] = ()) -> dict[str, Any]:
    """Go only when every critical condition passed and no enforced sign-off is missing; the
    advisories are listed, never counted. ``field record build`` and ``field record check`` both
    decide here, so the stored decision and a check at the same moment cannot disagree."""
    held = [r for r in results if r["severity"] == "critical" and not r["passed"]]
    advisories = [r for r in results if r["severity"] == "advisory" and not r["passed"]]
    signoff = (
        [{"name": "signoff", "status": "missing", "detail": "; ".join(missing_signoffs)}] if missing_signoffs else []
    )
    return {
        "verdict": HOLD if held or signoff else GO,
        "held_by": [{"name": r["name"], "status": r["status"], "detail": r["detail"]} for r in held] + signoff,
        "advisories_not_met": [{"name": r["name"], "status": r["status"]} for r in advisories],
        "rule": RULE,
    }
