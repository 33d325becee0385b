"""SUMMARY.md of a run: the verdict block (one line per tier and recipe, the ranking question) from each notebook's
``metrics.json["verdicts"]`` (contract in docs/interfaces.md, producer ``claims.verdict_block``), then the run's
facts and one row per notebook. Standard library only, as ``runner``.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

TIERS = {0: "Tier 0, the authors' shipped predictions", 1: "Tier 1, our re-implementation",
         2: "Tier 2, live on the local GPU"}


@dataclass
class NotebookResult:
    name: str
    status: str          # OK | SKIPPED | FAILED | INTERRUPTED
    seconds: float
    reason: str = ""
    parameters: dict = field(default_factory=dict)   # what ``--param`` set for this notebook


def format_params(params: dict) -> str:
    """``--param`` values as the console and SUMMARY.md show them: ``key=<JSON>, ...``."""
    return ", ".join(f"{k}={json.dumps(v)}" for k, v in params.items())


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` aside and rename it over ``path``: a full disk or a kill never leaves a half-written
    file under the finished name (the partial one is removed and the error raised)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _counts(c: dict) -> str:
    main = ", ".join(f"{v} {c.get(v, 0)}" for v in ("REPRODUCED", "DEVIATES", "NOT COMPUTABLE"))
    g = c.get("graded") or {}
    graded = ", ".join(f"{k} {n}" for k, n in g.items())
    return main + (f" (graded: {graded})" if graded else "")


def _ranking_text(r: dict, key: str) -> str:
    mape = r.get("mape") or {}
    from neusight_core.predictors import registry
    # the ranking compares the release's predictors: the paper's names, NeuSight for the recipe being judged
    vals = ", ".join(f"{'NeuSight' if k in (key, 'neusight') else registry.label(k)} "
                     + ("n/a" if v is None else f"{v:.1f}") for k, v in mape.items())
    holds = r.get("holds")
    word = "cannot be judged" if holds is None else ("yes" if holds else "NO")
    return f"{word} ({vals} %; {r.get('configurations', '?')} configurations)"


#: the extensions beyond the paper that report a verdict line: metrics.json["verdicts"] key -> its title
EXTENSIONS = {"external": "External validation", "error_bars": "Each answer's interval", "serving": "Serving"}


def verdict_block(run_dir: Path, results: list[NotebookResult]) -> list[str]:
    """The lines that open SUMMARY.md: one per tier (and recipe), then the ranking question.

    Reads ``<run>/<notebook>/metrics.json["verdicts"]`` (contract in docs/interfaces.md)."""
    by_tier: dict[int, list[tuple[NotebookResult, dict]]] = {}
    external: list[str] = []       # verdicts {<an EXTENSIONS key>: true, "summary": ...} (notebooks 07, 08)
    for r in results:
        m = run_dir / r.name / "metrics.json"
        try:
            v = json.loads(m.read_text()).get("verdicts") if m.is_file() else None
        except (json.JSONDecodeError, OSError):
            v = None
        if isinstance(v, dict) and v.get("tier") in TIERS:
            by_tier.setdefault(int(v["tier"]), []).append((r, v))
        elif isinstance(v, dict) and v.get("summary") and any(v.get(k) for k in EXTENSIONS):
            quick = " [quick mode: subset, quick predictors]" if v.get("quick") else ""
            title = next(t for k, t in EXTENSIONS.items() if v.get(k))
            external.append(f"- **{title}** ({r.name}, {r.status}){quick}: {v['summary']}")
    not_ok = [r for r in results if r.status in ("FAILED", "INTERRUPTED")]
    lines = ["## Verdict", ""]
    rank = []
    for tier, title in TIERS.items():
        entries = by_tier.get(tier, [])
        if not entries:
            why = ("; ".join(f"{r.name} {r.status}" + (f" ({r.reason})" if r.reason else "") for r in not_ok)
                   if not_ok else "no notebook of this run reports it")
            lines.append(f"- **{title}**: not reported ({why})")
            continue
        for r, v in entries:
            quick = " [quick mode: subset, quick predictors]" if v.get("quick") else ""
            head = f"- **{title}** ({r.name}, {r.status}){quick}:"
            summary = str(v.get("summary") or "").strip()
            if r.status == "SKIPPED":
                summary = summary or f"SKIPPED: {r.reason}"
            if r.status == "FAILED":
                summary = f"FAILED: {r.reason}" + (f"; {summary}" if summary else "")
            claims = v.get("claims") or {}
            if not claims:
                lines.append(f"{head} {summary}")
            else:
                if summary:
                    lines.append(f"{head} {summary}")
                    head = "  -"
                for key, c in claims.items():
                    who = f"recipe `{key}`" if tier else str(v.get("label") or key)
                    corr = (v.get("correlation") or {}).get(key) or {}
                    extra = ""
                    if corr.get("pearson") is not None:
                        extra = (f"; predicted vs measured latency over {corr.get('n')} NVIDIA configurations: "
                                 f"MAPE {corr['mape']:.1f} %, Pearson {corr['pearson']:.3f}, "
                                 f"Spearman {corr['spearman']:.3f}")
                    own = (v.get("claims_neusight") or {}).get(key)
                    if own is None:     # a metrics.json from before the claims were split
                        lines.append(f"{head} claims with {who}: {_counts(c)}{extra}")
                    else:
                        base = (v.get("claims_baselines") or {}).get(key) or {}
                        whose = "our re-implemented baselines'" if tier else "the authors' baselines'"
                        lines.append(f"{head} claims with {who}, on NeuSight's own numbers: {_counts(own)}{extra}; "
                                     f"on {whose} numbers, apart: {_counts(base)}")
                    head = "  -"
            for key, rk in (v.get("ranking") or {}).items():
                who = "authors' predictions" if tier == 0 else f"ours, recipe `{key}`"
                rank.append(f"{who}: {_ranking_text(rk, key)}")
    if rank:
        lines.append("- **Ranking** (does NeuSight have a lower pooled MAPE than Roofline, Habitat and "
                     "Li et al. over the labelled single-GPU NVIDIA configurations of Figures 7 and 8?): "
                     + "; ".join(rank))
    else:
        lines.append("- **Ranking** (NeuSight against Roofline, Habitat, Li et al.): not reported in this run")
    lines += external
    lines.append("- Tolerance: a claim is REPRODUCED within half a unit of the last digit the paper prints "
                 "(\"9.7\" within 0.05, \"about 13\" within 0.5); graded: within tolerance / within 10 % / "
                 "within 2x / worse. A claim's NeuSight numbers and its baselines' are judged apart.")
    return lines + claims_table(by_tier)


def _claim_cell(c: dict) -> str:
    own = f"NeuSight {c['neusight']}" + (f" ({c['grade']})" if c.get("grade") else "") if c.get("neusight") else ""
    base = f"baselines {c['baselines']}" if c.get("baselines") else ""
    why = str(c.get("why") or "").replace("|", "/").replace("\n", " ")
    return "; ".join(x for x in (own, base) if x) + (f" — {why}" if why else "")


def claims_table(by_tier: dict) -> list[str]:
    """Every claim's verdict with its reason beside it, one column per tier and recipe (``claim_list`` of the
    notebooks' verdicts); nothing when no notebook reported claims."""
    cols = [(f"Tier {t}" + (f" `{key}`" if t else " (authors' predictions)"), rows)
            for t, entries in sorted(by_tier.items()) for _, v in entries
            for key, rows in (v.get("claim_list") or {}).items()]
    if not cols:
        return []
    text = {c["claim"]: c.get("text", "") for _, rows in cols for c in rows}
    out = ["", "## Claims: each verdict and why", "",
           "| claim | the paper says | " + " | ".join(name for name, _ in cols) + " |",
           "|---|---|" + "---|" * len(cols)]
    for claim, said in text.items():
        cells = [next((_claim_cell(c) for c in rows if c["claim"] == claim), "") for _, rows in cols]
        out.append(f"| {claim} | {str(said).replace('|', '/')} | " + " | ".join(cells) + " |")
    return out


def weights_lines(quick: bool, recipes=None, seeds=(0, 1, 2)) -> list[str]:
    """One line per NeuSight recipe: where and how long its weights of this mode trained (on the GPU
    when there is one), from their meta.json; weights not there are not listed."""
    from neusight_core import predictors as P
    from neusight_core.run.run_estimate import FULL_RECIPES
    out = []
    for name in recipes or FULL_RECIPES:
        where, secs = {}, []
        for s in seeds:
            try:
                info = json.loads((P.folder(name, quick, s) / "meta.json").read_text()).get("info", {})
            except (OSError, ValueError, AttributeError):
                continue
            where.setdefault(info.get("trained_on") or "cpu (not recorded: trained before training devices were recorded)", []).append(s)
            if isinstance(info.get("train_seconds"), (int, float)):
                secs.append(info["train_seconds"])
        if where:
            lo, hi = (f"{min(secs):.0f}", f"{max(secs):.0f}") if secs else ("", "")
            took = (f" in {lo} s per seed" if lo == hi else f" in {lo}-{hi} s per seed") if secs else ""
            out.append(f"- {name} ({'quick' if quick else 'full'} weights){took}: " + "; ".join(
                f"seed{'s' if len(v) > 1 else ''} {', '.join(map(str, v))} trained on {k}" for k, v in where.items()))
    return out


def write_summary(run_dir: Path, results: list[NotebookResult], env: dict, quick: bool, total: float,
                  interrupted: str | None = None, tarball: str | None = None) -> Path:
    icon = {"OK": "OK", "SKIPPED": "SKIPPED", "FAILED": "**FAILED**", "INTERRUPTED": "**INTERRUPTED**"}
    lines = [f"# NeuSight artifact run {run_dir.name}", ""]
    if interrupted:
        done = [r.name for r in results if r.status != "INTERRUPTED"]
        lines += [f"**INTERRUPTED** by {interrupted} after {total / 60:.1f} min: "
                  f"{len(done)} notebook(s) finished ({', '.join(done) or 'none'}); the rest did not run. "
                  "No tarball was made; this folder is incomplete evidence.", ""]
    lines += verdict_block(run_dir, results) + [""]
    lines += ["## Run", "",
              f"- mode: {'quick' if quick else 'full'}; total wall time {total / 60:.1f} min",
              f"- artifact commit {env.get('artifact_commit', '')[:12] or '?'}"
              f"{' (uncommitted changes)' if env.get('artifact_dirty') else ''}; "
              f"release commit {env.get('release', {}).get('commit', '?')[:7]}; "
              f"checksums: {env.get('release', {}).get('checksums', '?')}",
              f"- Python {env.get('python', '?')} on {env.get('platform', '?')}; GPU: "
              + (", ".join(env['gpu']['names']) if env.get('gpu', {}).get('available')
                 else f"none ({env.get('gpu', {}).get('reason', '')})"),
              *weights_lines(quick),
              *([f"- tarball: {tarball}"] if tarball else []),
              *[f"- {r.name} ran with --param {format_params(r.parameters)}" for r in results if r.parameters],
              "", "| notebook | status | wall time (s) | reason |", "|---|---|---:|---|"]
    for r in results:
        reason = r.reason.replace("|", "/").replace("\n", " ")
        lines.append(f"| {r.name} | {icon.get(r.status, r.status)} | {r.seconds:.1f} | {reason} |")
    for r in results:
        part = run_dir / r.name / "summary.md"
        if part.is_file():
            lines += ["", f"## {r.name}", "", part.read_text().strip()]
    p = run_dir / "SUMMARY.md"
    write_atomic(p, "\n".join(lines) + "\n")  # never half-written: written aside, then renamed
    return p
