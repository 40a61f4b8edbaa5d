"""A run's result (:class:`~dflash_eval.session.run_result.RunResult`) as text: the τ table, the per-category table,
the per-position acceptance table, the multi-turn conversation table, the predicted speed-up, the drift summary and
the drift budget with its gate, for the terminal (:func:`render_terminal`) and as markdown (:func:`render_markdown`:
eval.md, $GITHUB_STEP_SUMMARY). Both take their rows from the same row builders (:mod:`.table_rows`,
:mod:`.speedup_report`) and write them through one table type (:mod:`.tables`), so a number reads the same on every
surface (:mod:`dflash_eval.common.number_text`)."""

from __future__ import annotations

from dflash_eval.common.number_text import fmt
from dflash_eval.common.paths import normal_path
from dflash_eval.report.plot import worst_rows
from dflash_eval.report.speedup_report import cost_rows, speedup_lines, speedup_rows
from dflash_eval.report.summary import not_checked_lines, verdict_head
from dflash_eval.report.table_rows import (
    NEAR_TIE_NOTE,
    acceptance_rows,
    baseline_line,
    budget_line,
    budgets,
    category_ci_name,
    category_rows,
    conversation_rows,
    drift_rows,
    gate_rows,
    ladder_rows,
    measurement_tables,
    near_tie_rows,
    sampled_line,
    tau_kinds_line,
    tau_rows,
)
from dflash_eval.report.tables import TextTable, markdown_table, terminal_text
from dflash_eval.session.rows import ABSENT
from dflash_eval.session.run_blocks import ProvenanceBlock, TargetBlock
from dflash_eval.session.run_result import RunResult, Timings

__all__ = ["render_terminal", "render_markdown", "compile_text", "TERMINAL_ROWS_FULL", "TERMINAL_ROWS_SHOWN",
           "plain_dtype", "plain_versions"]

#: The terminal prints every prompt's row up to this many prompts (conversations likewise) ...
TERMINAL_ROWS_FULL = 15
#: ... and beyond, only the rows of this many prompts with the least room above their floors (eval.md: all).
TERMINAL_ROWS_SHOWN = 10
_ORDER = "failing first, then least room above the floor"
_ACCEPT_LEFT = frozenset({"scope", "source", "conversation", "category"})
_DRIFT_LEFT = frozenset({"comparison", "axis", "perturbation", "worst prompt"})


def _sort_key(x: float | None) -> float:
    """Sort key of a number that strict JSON may have turned into null (NaN: last)."""
    return float("inf") if x is None else x


def _shown_prompts(result: RunResult, limit: int | None) -> list[str] | None:
    """The prompts whose rows the terminal prints, worst first (:func:`worst_rows`), or None for all of them:
    ``limit`` None, or at most :data:`TERMINAL_ROWS_FULL` prompts."""
    prompts = result.prompts
    if limit is None or len(prompts) <= max(limit, TERMINAL_ROWS_FULL):
        return None
    return worst_rows(prompts, limit)


def _collapse(rows: list[list[str]], keys: set[str], shown: list[str] | None) -> list[list[str]]:
    """The rows whose first cell is one of ``shown`` (in that order), then the rows that are not keyed by ``keys``
    (means, categories) in their order; every row when ``shown`` is None."""
    if shown is None:
        return rows
    order = {k: i for i, k in enumerate(shown)}
    keyed = sorted((r for r in rows if r[0] in order), key=lambda r: order[r[0]])  # stable: sources stay in order
    return keyed + [r for r in rows if r[0] not in keys]


def _collapsed_caption(what: str, shown: list[str] | None, total: int, order: str) -> str | None:
    if shown is None:
        return None
    return f"{len(shown)} of {total} {what} ({order}); … {total - len(shown)} more in eval.md, all here with pytest -v"


def _category_title(result: RunResult, what: str) -> str:
    return f"τ per category ({what}; floors chain/" + "/".join(f"DDTree-{b}" for b in budgets(result)) + ")"


def _tau_tables(result: RunResult, max_rows: int | None) -> list[TextTable | str | None]:
    """The terminal's τ, category, acceptance and conversation tables (long per-prompt tables collapsed)."""
    prompts = result.prompts
    shown = _shown_prompts(result, max_rows)
    caption = _collapsed_caption("prompts", shown, len(prompts), _ORDER)
    header, rows = tau_rows(result)
    convs = result.conversations or {}
    conv_shown = None if max_rows is None or len(convs) <= max(max_rows, TERMINAL_ROWS_FULL) else sorted(
        convs, key=lambda c: _sort_key(convs[c].tau))[:max_rows]
    ah, arows = acceptance_rows(result)
    vh, vrows = conversation_rows(result)
    return [TextTable(header, _collapse(rows, set(prompts), shown), title=_title(result), caption=caption,
                      left=frozenset({"prompt"})),
            tau_kinds_line(result),
            baseline_line(result),
            sampled_line(result),
            TextTable(*category_rows(result), no_wrap=True, left=frozenset({"category"}),
                      title=_category_title(result, f"macro mean over prompts, {category_ci_name(result)}")),
            TextTable(ah, _collapse(arows, set(prompts), shown), title=_ACCEPT_TITLE, caption=caption,
                      left=_ACCEPT_LEFT),
            TextTable(vh, _collapse(vrows, set(convs), conv_shown), title=_CONV_TITLE, left=_ACCEPT_LEFT,
                      caption=_collapsed_caption("conversations", conv_shown, len(convs),
                                                 "lowest conversation τ first"))]


def _drift_tables(result: RunResult) -> list[TextTable | str | None]:
    """The terminal's drift, drift budget and drift gate tables, then the budget's line."""
    tm = result.timings.sum
    return [TextTable(*drift_rows(result), title="hidden-state drift, regression check (worst prompt per layer)",
                      left=_DRIFT_LEFT),
            TextTable(*ladder_rows(result), title="drift budget: τ against injected feature error", left=_DRIFT_LEFT),
            TextTable(*gate_rows(result), title="drift gate: measured drift against the drafter's drift budget",
                      left=_DRIFT_LEFT),
            budget_line(result),
            "timings (s, summed over processes): " + _timings(tm) + compile_text(result.timings, terse=True)
            if tm else None]


def _timings(tm: dict[str, float]) -> str:
    return ", ".join(f"{k} {fmt(v, 2)}" for k, v in tm.items())


def compile_text(timings: Timings, *, terse: bool = False) -> str:
    """``; GPU kernel compilation 48.20 s of those (kernel_probe 40.10, ...; 312 kernels compiled, 4 loaded from the
    kernel cache <path>)`` from the run's timings' ``compile`` block ("" without it; ``terse``: also "" when no kernel
    was compiled or loaded, as on a CPU)."""
    c = timings.compile
    if c is None or (terse and not c.kernels_compiled and not c.kernels_loaded):
        return ""
    cache = c.kernel_cache
    where = (f"the kernel cache {normal_path(cache.path)} ({cache.source})" if cache is not None and cache.path else
             "Triton's default kernel cache ("
             + (cache.why if cache is not None and cache.why is not None else "not under --cache-dir") + ")")
    stages = ", ".join(f"{k} {fmt(v, 2)}" for k, v in c.by_stage.items())
    return (f"; GPU kernel compilation {fmt(c.seconds, 2)} s of those" + (f" ({stages})" if stages else "")
            + f": {c.kernels_compiled} kernels compiled, {c.kernels_loaded} loaded from {where}")


def render_terminal(result: RunResult, *, width: int = 120, max_rows: int | None = TERMINAL_ROWS_SHOWN) -> str:
    """The run's τ tables, the drift summary and the drift budget as text (rich tables, no colour codes). Beyond
    :data:`TERMINAL_ROWS_FULL` prompts, the per-prompt tables keep only the ``max_rows`` prompts with the least room
    above their floors (conversations: the lowest τ) and say how many more eval.md holds; ``max_rows`` None: all."""
    return terminal_text(_tau_tables(result, max_rows) + _speedup_tables(result) + list(measurement_tables(result))
                         + _drift_tables(result), width=width)


_SPEEDUP_TITLE = "predicted speed-up over plain decoding on this run's device (docs/speedup.md)"
_COSTS_TITLE = "Measured costs the prediction is made of (each the median of its timings on this run's device)"


def _speedup_tables(result: RunResult) -> list[TextTable | str | None]:
    """The predicted speed-up's table and its lines (nothing without a prediction)."""
    block = result.speedup
    return [TextTable(*speedup_rows(block), title=_SPEEDUP_TITLE, left=frozenset({"strategy"})),
            *(speedup_lines(block, result.final_verdict()) if block else [])]


_ACCEPT_TITLE = ("acceptance per draft position (per prompt, category and run; sources: chain = offline simulation, "
                 "online = real speculative loop, server = SGLang's histogram)")
_CONV_TITLE = "multi-turn conversations (τ per turn; conversation τ over all its rounds)"


def _drafter_text(result: RunResult) -> tuple[str, str]:
    """The drafter's path and fingerprint (``?``: not known)."""
    d = result.drafter
    return ("?", "?") if d is None else (d.path, d.fingerprint)


def _title(result: RunResult) -> str:
    t = result.target
    path, fingerprint = _drafter_text(result)
    target = ("?", "?") if t is None else (t.path, t.identity)
    return (f"τ per prompt — target {normal_path(target[0]).name} ({str(target[1])[:12]}), "
            f"drafter {normal_path(path).name} ({str(fingerprint)[:12]})")


def _recorded(value: object) -> object:
    """A field of a block as eval.md shows it: ``?`` where the block does not record it (null shows as ``None``)."""
    return "?" if value is ABSENT else value


def plain_dtype(dtype: object) -> str:
    """A dtype as a reader writes it: ``float32`` (eval.json of older runs held ``torch.float32``)."""
    return "?" if dtype is None else str(dtype).removeprefix("torch.")


def plain_versions(versions: object) -> str:
    """Library versions as text: ``torch 2.13.0, transformers 5.20.0, fla not installed, python 3.11.7``."""
    if not isinstance(versions, dict) or not versions:
        return "?"
    return ", ".join(f"{k} {v if v is not None else 'not installed'}" for k, v in versions.items())


def _git_text(p: ProvenanceBlock) -> str:
    """``host h, git abc123def456 (dirty) in /repo`` for eval.md's provenance line ("" when neither is known)."""
    parts = [f"host {p.host}"] if p.host else []
    g = p.git
    if g is not None:
        state = {True: " (uncommitted changes)", False: "", None: " (state unknown)"}[g.dirty]
        parts.append(f"git commit {g.commit[:12]}{state}" + (f" in `{g.root}`" if g.root else ""))
    return ", ".join(parts)


def _target_line(result: RunResult) -> str:
    t = result.target if result.target is not None else TargetBlock("?", "?")  # no target: every field unknown
    dtype = None if t.dtype is ABSENT else t.dtype
    return (f"- target: `{normal_path(t.path)}` identity `{str(t.identity)[:16]}`, {_recorded(t.num_layers)} layers, "
            f"dtype {plain_dtype(dtype)}, device {_recorded(t.device)}")


def _provenance_lines(result: RunResult) -> list[str]:
    """eval.md's list of what ran: target, drafter, backend and versions, host and commit, kernel probe, tests."""
    p = result.provenance if result.provenance is not None else ProvenanceBlock()
    path, fingerprint = _drafter_text(result)
    parts = [_target_line(result),
             f"- drafter: `{normal_path(path)}` fingerprint `{str(fingerprint)[:16]}`",
             f"- backend {_recorded(p.backend)}, versions: {plain_versions(p.versions)}"]
    if _git_text(p):
        parts.append(f"- ran on {_git_text(p)}")
    kp = p.kernel_probe
    if kp is not None and kp.probes:
        parts.append(f"- kernel probe ({fmt((kp.seconds if kp.seconds is not None else 0.0) * 1e3, 0)} ms): "
                     + ", ".join(f"{q.get('backend')}/{q.get('dtype')} `{str(q.get('digest'))[:12]}`"
                                 for q in kp.probes))
    parts += [f"- **{c.message}**" + ("" if c.by_witness else "; made again with the live kernels")
              for c in p.kernel_changes]  # the witness's message says what it did
    tc = result.tests.counts
    if tc:
        parts.append("- tests: " + ", ".join(f"{k} {v}" for k, v in sorted(tc.items())))
    return parts


def _section(title: str, table: TextTable, *after: str | None) -> list[str]:
    """A markdown section: its heading, the table and the lines after it (nothing when the table has no rows)."""
    if not table:
        return []
    return ["", f"### {title}", "", markdown_table(table)] + [x for line in after if line for x in ("", line)]


def render_markdown(result: RunResult) -> str:
    """eval.md of the run's ``result``: the verdict (as the result holds it), the named causes of a failure, what
    ran, then every table in full."""
    parts = ["## DFlash drafter evaluation", ""]
    head = verdict_head(result, recorded=bool((result.settings or {}).get("update_tau_floors")))
    parts += [f"**{head[0]}**", ""] + [f"- {line}" for line in head[1:]] + ([""] if head[1:] else [])
    if result.diagnoses:  # named causes first: they explain the failures below
        parts += [f"**{line}**" for line in result.diagnoses] + [""]
    parts += _provenance_lines(result)
    if result.not_checked:  # what a pass does not vouch for, before the tables
        parts += ["", "### Not checked", ""] + [f"- {line.removeprefix('not checked: ')}"
                                                 for line in not_checked_lines(result)]
    parts += _section("Near ties", TextTable(*near_tie_rows(result)), f"Each row is {NEAR_TIE_NOTE}.")
    parts += _section("τ per prompt", TextTable(*tau_rows(result)), tau_kinds_line(result), baseline_line(result),
                      sampled_line(result))
    parts += _section(_category_title(result, f"macro mean over prompts, median, {category_ci_name(result)} of the "
                                              "mean"), TextTable(*category_rows(result)))
    for title, rows in ((_ACCEPT_TITLE, acceptance_rows(result)), (_CONV_TITLE, conversation_rows(result))):
        parts += _section(f"{title[0].upper()}{title[1:]}", TextTable(*rows))
    speed = result.speedup
    parts += _section(f"{_SPEEDUP_TITLE[0].upper()}{_SPEEDUP_TITLE[1:]}", TextTable(*speedup_rows(speed)),
                      *(speedup_lines(speed, result.final_verdict()) if speed else []),
                      "Plot: `speedup.png`." if speed else None)
    parts += _section(_COSTS_TITLE, TextTable(*cost_rows(speed)))
    for table in measurement_tables(result):
        parts += _section(f"Measurement: {(table.title or '').removeprefix('measurement: ')}", table, table.caption)
    parts += _section("Hidden-state drift (regression check)", TextTable(*drift_rows(result)))
    budget = budget_line(result)
    if budget:
        gate = TextTable(*gate_rows(result))
        parts += ["", "### Drift budget and gate", "", budget, "", markdown_table(
            TextTable(*ladder_rows(result)))] + (["", markdown_table(gate)] if gate else [])
        parts += ["", "Plot: `drift_budget.png` (τ and the mean τ drop against the injected feature error along each "
                  "axis, this run's measured drift marked)."]
    tm = result.timings
    if tm.sum:
        parts += ["", "### Timings (s)", "", f"wall {fmt(tm.wall_s, 2)}; summed over processes: "
                  + _timings(tm.sum) + compile_text(tm)]
    return "\n".join(parts) + "\n"
