"""reports/eval.html: the run in one self-contained page (inline CSS, SVG and a few lines of JavaScript; nothing is
fetched), to see where in a completion the drafter fails.

From top to bottom:

- the verdict: the lines of the terminal's verdict block (:func:`dflash_eval.report.summary.verdict_lines`, of the
  verdict the data holds; the report folder's files are links below it instead of its last line);
- the report folder's files, each a link (every file the run wrote);
- τ per category (the tables of eval.md: :mod:`dflash_eval.report.table_rows`) and, as inline SVG, τ along the
  response (the mean accept length of the rounds starting in each :data:`BUCKET`-token bucket of completion
  positions, pooled over a category's prompts and samples) and the per-position acceptance (slot k of the block
  accepted, per category);
- the predicted speed-up (when predicted): per strategy τ, the round's cost, the speed-up and tokens/s with their
  CIs, the floor's verdict, the measured costs and ``speedup.png`` (:mod:`dflash_eval.report.speedup_report`);
- the hidden-state drift (when measured): per comparison and layer the drift against its tolerance and the drift
  gate's drift x safety against the drift budget and its CI, the budget, its ladder and ``drift_budget.png``;
- the prompts, worst first (:func:`dflash_eval.report.plot.worst_rows`: failing, then least room above the floor),
  each with its τ along the response and per-position acceptance, and its completion text with every verification
  round marked (:func:`segments`): the drafts a round accepted, the token where its first draft was rejected (the
  target's token there), the bonus token of a round that accepted the whole block, the last token, where the loop
  ends without a rejection. Hovering a mark shows the round, its accept length and the positions (``title``). A
  switch marks the rounds of the chain loop or of a DDTree budget (the tree's accepted path: its tokens are the
  reference's); at temperature > 0, each sampled reference (up to :data:`SAMPLES_SHOWN` a prompt).

Sections of the first :data:`PROMPTS_SHOWN` prompts are written in full; the rest are rows of the prompt index (their
text is in samples.jsonl). The rounds come from each prompt row's ``completions``
(:class:`dflash_eval.session.rows.CompletionRow`); data without them (an eval.json of an earlier version) gives the
page without the texts.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from dflash_eval.common.atomic import atomic_write_text
from dflash_eval.common.number_text import fmt, is_number, verdict_text
from dflash_eval.metrics.verdict import DRIFT_GATE
from dflash_eval.report.plot import worst_rows
from dflash_eval.report.speedup_report import SPEEDUP_PLOT, cost_rows, speedup_lines, speedup_rows
from dflash_eval.report.summary import REPORT_FILES, verdict_lines
from dflash_eval.report.table_rows import (
    acceptance_rows,
    budget_line,
    budgets,
    category_ci_name,
    category_rows,
    drift_rows,
    gate_rows,
    ladder_rows,
    tau_kinds_line,
)
from dflash_eval.session.rows import CompletionRow, PromptRow
from dflash_eval.session.run_blocks import ContextBlock
from dflash_eval.session.run_result import RunResult

__all__ = ["HTML_NAME", "BUCKET", "PROMPTS_SHOWN", "SAMPLES_SHOWN", "TITLES", "Segment", "segments", "title",
           "marked_text", "tau_by_position", "html_verdict_lines", "render_html", "write_html"]

#: The file's name in the report folder.
HTML_NAME = "eval.html"
#: Completion positions per point of τ along the response.
BUCKET = 16
#: Prompts whose sections (text and rounds) the page holds; the others are rows of the index.
PROMPTS_SHOWN = 100
#: Sampled references shown per prompt at temperature > 0.
SAMPLES_SHOWN = 4
#: Series colours (colour-blind safe, Okabe-Ito).
_PALETTE = ("#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000", "#f0e442")


# ----------------------------------------------------------------------------------------------------- the rounds
@dataclass(frozen=True)
class Segment:
    """Completion tokens ``lo .. hi - 1`` in one role: ``prefill`` (position 0, the prefill's token), ``accepted``
    (drafts a round accepted), ``rejected`` (the target's token where the round's first draft was rejected),
    ``bonus`` (the target's token after a round that accepted the whole block), ``end`` (the last token: the round
    stops there, no rejection) or ``unreached`` (no round reached it: ``--max-blocks``); ``round`` is 1-based (0: no
    round), ``accept`` its accept length."""

    kind: str
    lo: int
    hi: int
    round: int = 0
    accept: int = 0


def segments(accept_lengths: Sequence[int], n: int, block_size: int | None) -> list[Segment]:
    """The roles of ``n`` completion tokens under the rounds of ``accept_lengths`` (the conventions of
    :mod:`dflash_eval.metrics.tau`: round ``r`` starts at ``c_r``, ``c_1 = 0``, accepts the drafts of ``c_r + 1 ..
    c_r + a_r - 1`` and the target's token at ``c_r + a_r`` ends it). Rounds that would run past the completion (data
    that does not fit it) are cut there."""
    if n <= 0:
        return []
    out = [Segment("prefill", 0, 1)]
    start = 0
    for r, a in enumerate(accept_lengths, 1):
        end = start + int(a)
        if a < 1 or end > n - 1:
            break
        if a > 1:
            out.append(Segment("accepted", start + 1, end, r, a))
        kind = "bonus" if a == block_size else "end" if end == n - 1 else "rejected"
        out.append(Segment(kind, end, end + 1, r, a))
        start = end
    if start < n - 1:
        out.append(Segment("unreached", start + 1, n))
    return out


def round_starts(accept_lengths: Iterable[int]) -> list[tuple[int, int]]:
    """``(start position, accept length)`` of every round."""
    out, start = [], 0
    for a in accept_lengths:
        out.append((start, int(a)))
        start += int(a)
    return out


def tau_by_position(rounds: Iterable[tuple[int, int]], bucket: int = BUCKET) -> dict[int, tuple[float, int]]:
    """``{bucket index: (mean accept length, rounds)}`` of the rounds (``(start, accept length)``) starting in each
    ``bucket``-position bucket."""
    sums: dict[int, list[int]] = {}
    for start, a in rounds:
        s = sums.setdefault(start // bucket, [0, 0])
        s[0] += a
        s[1] += 1
    return {b: (s[0] / s[1], s[1]) for b, s in sorted(sums.items())}


def _methods(result: RunResult) -> list[tuple[str, str]]:
    """``(key, label)`` of the marked loops: the chain and each DDTree budget."""
    return [("chain", "chain")] + [(f"ddtree-{b}", f"DDTree-{b}") for b in budgets(result)]


def _lengths(c: CompletionRow, method: str) -> list[int]:
    return list(c.accept_lengths if method == "chain" else
                c.ddtree_accept_lengths.get(method.removeprefix("ddtree-"), []))


# ----------------------------------------------------------------------------------------------------- SVG
@dataclass
class Series:
    """One line of a chart: ``points`` ``(x, y, note)`` (note: the tooltip's extra words)."""

    label: str
    points: Sequence[tuple[float, float, str]]
    dashed: bool = False


def _nice_step(span: float, ticks: int = 5) -> float:
    """A round tick step (1, 2, 2.5 or 5 times a power of ten) giving about ``ticks`` ticks over ``span``."""
    if span <= 0:
        return 1.0
    raw = span / ticks
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if raw <= m * mag)


def _ticks(lo: float, hi: float, *, integer: bool = False) -> list[float]:
    step = max(1.0, _nice_step(hi - lo)) if integer else _nice_step(hi - lo)
    first = math.ceil(lo / step) * step
    return [first + k * step for k in range(int((hi - first) / step + 1e-9) + 1)]


def line_chart(series: Sequence[Series], *, x_label: str, y_label: str, width: int = 560, height: int = 240,
               x_range: tuple[float, float] | None = None, y_max: float | None = None, title: str = "",
               integer_x: bool = False) -> str:
    """An inline SVG line chart: axes from ``x_range`` (else the points') and 0 .. ``y_max`` (else the points'
    largest y), round ticks, the legend right of the plot, a ``<title>`` tooltip on every point."""
    pts = [p for s in series for p in s.points]
    if not pts:
        return ""
    legend_w = min(150, 28 + 7 * max(len(s.label) for s in series))
    ml, mr, mt, mb = 44, 12 + legend_w, 24 if title else 10, 38
    x0, x1 = x_range if x_range is not None else (min(p[0] for p in pts), max(p[0] for p in pts))
    x1 = x1 if x1 > x0 else x0 + 1
    ym = y_max if y_max is not None else max(p[1] for p in pts) or 1.0
    pw, ph = width - ml - mr, height - mt - mb

    def sx(x: float) -> float:
        return ml + pw * (x - x0) / (x1 - x0)

    def sy(y: float) -> float:
        return mt + ph * (1 - y / ym)

    e = html.escape
    parts = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="{e(title or y_label)}">']
    if title:
        parts.append(f'<text x="{ml}" y="15" class="ct">{e(title)}</text>')
    for y in _ticks(0.0, ym):
        parts.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" class="grid"/>'
                     f'<text x="{ml - 4}" y="{sy(y) + 4:.1f}" class="tick" text-anchor="end">{fmt(y, 3, "g")}</text>')
    for x in _ticks(x0, x1, integer=integer_x):
        parts.append(f'<text x="{sx(x):.1f}" y="{mt + ph + 14}" class="tick" text-anchor="middle">'
                     f'{fmt(x, 4, "g")}</text>')
    parts.append(f'<line x1="{ml}" x2="{ml}" y1="{mt}" y2="{mt + ph}" class="axis"/>'
                 f'<line x1="{ml}" x2="{ml + pw}" y1="{mt + ph}" y2="{mt + ph}" class="axis"/>'
                 f'<text x="{ml + pw / 2:.1f}" y="{height - 6}" class="label" text-anchor="middle">{e(x_label)}</text>'
                 f'<text x="12" y="{mt + ph / 2:.1f}" class="label" text-anchor="middle" '
                 f'transform="rotate(-90 12 {mt + ph / 2:.1f})">{e(y_label)}</text>')
    for i, s in enumerate(series):
        color = _PALETTE[i % len(_PALETTE)]
        xy = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y, _ in s.points)
        dash = ' stroke-dasharray="5 3"' if s.dashed else ""
        parts.append(f'<g class="series"><polyline points="{xy}" fill="none" stroke="{color}" stroke-width="1.6"'
                     f'{dash}/>')
        for x, y, note in s.points:
            parts.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.6" fill="{color}">'
                         f'<title>{e(s.label)}: {fmt(y, 3)} at {fmt(x, 4, "g")}{e(note)}</title></circle>')
        parts.append("</g>")
        lx, ly = ml + pw + 10, mt + 8 + 15 * i
        parts.append(f'<line x1="{lx}" x2="{lx + 18}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2"{dash}/>'
                     f'<text x="{lx + 22}" y="{ly + 4}" class="legend">{e(s.label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


# ----------------------------------------------------------------------------------------------------- charts
def _position_series(rows: Iterable[PromptRow], method: str, label: str, *, dashed: bool = False) -> Series:
    """τ along the response of the references of ``rows`` (pooled), as a chart series."""
    rounds = [r for row in rows for c in row.completions or [] for r in round_starts(_lengths(c, method))]
    pts = [(b * BUCKET + BUCKET / 2, tau, f" (rounds starting at positions {b * BUCKET}–{(b + 1) * BUCKET - 1}: {n})")
           for b, (tau, n) in tau_by_position(rounds).items()]  # each point at its bucket's middle
    return Series(label, pts, dashed)


def _max_len(rows: Iterable[PromptRow]) -> int:
    return max((len(c.ids) for row in rows for c in row.completions or []), default=0)


def _block_size(result: RunResult) -> int | None:
    """The drafter's block size (the run's context; None: not known)."""
    return None if result.context is None else result.context.block_size


def _category_charts(result: RunResult) -> str:
    rows = [r for r in result.prompts.values() if r.completions]
    if not rows:
        return ""
    block = _block_size(result)
    cats = sorted({r.category for r in rows})
    xr = (0.0, float(_max_len(rows)))
    chain = [_position_series([r for r in rows if r.category == c], "chain", c) for c in cats]
    if len(cats) > 1:
        chain.append(_position_series(rows, "chain", "all", dashed=True))
    methods = [_position_series(rows, m, label) for m, label in _methods(result)]
    acc = result.categories or {}
    pos = [Series(c, [(k, rate, "") for k, rate in enumerate(acc[c].acceptance["chain"].position_rates, 1)
                      if is_number(rate)], c == "all")
           for c in [*cats, "all"] if c in acc and "chain" in acc[c].acceptance and (c != "all" or len(cats) > 1)]
    along = partial(line_chart, x_label=f"completion position (buckets of {BUCKET})", y_label="mean accept length",
                    x_range=xr, y_max=float(block) if block else None)
    out = ['<div class="charts">', along(chain, title="chain τ along the response, by category"),
           along(methods, title="τ along the response, every prompt"),
           line_chart(pos, x_label="slot k of the block", y_label="accepted / rounds",
                      x_range=(1.0, float(block - 1)) if block else None, y_max=1.0, integer_x=True,
                      title="per-position acceptance (chain), by category") if pos else "",
           "</div>"]
    return "".join(out)


def _prompt_charts(result: RunResult, row: PromptRow) -> str:
    block = _block_size(result)
    series = [_position_series([row], m, label, dashed=m != "chain") for m, label in _methods(result)]
    rates = [(k, r, "") for k, r in enumerate(row.position_rates, 1) if is_number(r)]
    return ('<div class="charts small">'
            + line_chart(series, x_label=f"completion position (buckets of {BUCKET})", y_label="mean accept length",
                         width=460, height=180, x_range=(0.0, float(_max_len([row]))),
                         y_max=float(block) if block else None, title="τ along the response")
            + (line_chart([Series("chain", rates)], x_label="slot k", y_label="accepted / rounds", width=330,
                          height=180, x_range=(1.0, float(block - 1)) if block else None, y_max=1.0,
                          integer_x=True, title="per-position acceptance") if rates else "")
            + "</div>")


# ----------------------------------------------------------------------------------------------------- text
#: The tooltip of each mark (``title``, set by the page's script from the span's data attributes: ``data-r`` the
#: round, ``data-a`` its accept length, ``data-p`` the first position, ``data-q`` the last; ``{m}`` the loop).
TITLES = {
    "prefill": "position {p}: the target's token from the prefill (before any round)",
    "accepted": "{m} round {r}: accept length {a}; drafts accepted at positions {p}–{q}",
    "rejected": "{m} round {r}: accept length {a}; the draft at position {p} was rejected (the target's token shown)",
    "bonus": "{m} round {r}: accept length {a}, the whole block; the target's bonus token at position {p}",
    "end": "{m} round {r}: accept length {a}; position {p} is the last token (the loop ends, no rejection)",
    "unreached": "positions {p}–{q}: no round reached them (--max-blocks)",
}


def _piece_html(text: str, kind: str) -> str:
    e = html.escape(text)
    if kind in ("rejected", "bonus", "end") and "\n" in text:  # a marked line break shows where it is
        e = e.replace("\n", '<span class="nl">↵</span>\n')
    return e


def title(kind: str, loop: str, seg: Segment) -> str:
    """The tooltip of a mark (:data:`TITLES`), as the page's script writes it."""
    return TITLES[kind].format(m=loop, r=seg.round, a=seg.accept, p=seg.lo, q=seg.hi - 1)


def marked_text(pieces: Sequence[str], accept_lengths: Sequence[int], block_size: int | None) -> str:
    """The completion's pieces as HTML with every round's marks (:func:`segments`): one span per segment, its round,
    accept length and positions as data attributes (the page's script turns them into its ``title``)."""
    out = []
    for s in segments(accept_lengths, len(pieces), block_size):
        text = "".join(pieces[s.lo:s.hi])
        data = f' data-p="{s.lo}"' + (f' data-r="{s.round}" data-a="{s.accept}"' if s.round else "") + (
            f' data-q="{s.hi - 1}"' if s.hi - s.lo > 1 else "")
        out.append(f'<span class="{s.kind}"{data}>{_piece_html(text, s.kind)}</span>')
    return "".join(out)


def _sample_html(result: RunResult, c: CompletionRow, several: bool) -> str:
    block = _block_size(result)
    head = [f"sample {c.sample}" if several else "reference", f"source {c.source}", f"{len(c.ids)} tokens",
            f"chain τ {fmt(c.tau)}"]
    head += [f"DDTree-{b} τ {fmt(v)}" for b, v in c.ddtree.items()]
    if c.seed is not None:
        head.append(f"seed {c.seed}")
    marks = "".join(f'<div class="marks" data-method="{m}">{marked_text(c.pieces, _lengths(c, m), block)}</div>'
                    for m, _ in _methods(result))
    return (f'<div class="sample"><div class="shead">{html.escape(" · ".join(head))}</div>'
            f'<div class="text">{marks}</div></div>')


def _prompt_section(result: RunResult, rank: int, pid: str, row: PromptRow) -> str:
    e = html.escape
    passed = row.passed
    verdict = "none" if passed is None else "pass" if passed else "fail"
    facts = [f"chain τ {fmt(row.tau)}" + (f" (floor {fmt(row.floor)})" if row.floor is not None else "")]
    facts += [f"DDTree-{b} τ {fmt(v)}" for b, v in row.ddtree.items()]
    facts += [f"{row.rounds} rounds", f"prompt {row.prompt_tokens} tokens",
              f"completion {row.completion_tokens} tokens"]
    if row.samples:
        facts.append(f"{row.samples} samples")
    parts = [f'<section class="prompt {verdict}" id="p-{e(pid)}">',
             f'<h3><span class="rank">#{rank}</span> {e(pid)} <span class="cat">{e(row.category)}'
             f'</span> <span class="badge {verdict}">{verdict_text(passed)}</span></h3>',
             f'<p class="facts">{e(" · ".join(facts))}</p>']
    comps = row.completions or []
    if comps:
        parts.append(_prompt_charts(result, row))
    if row.prompt_text is not None:
        parts.append(f'<details><summary>prompt text</summary><pre class="ptext">{e(row.prompt_text)}</pre>'
                     "</details>")
    for c in comps[:SAMPLES_SHOWN]:
        parts.append(_sample_html(result, c, bool(row.samples)))
    if len(comps) > SAMPLES_SHOWN:
        parts.append(f'<p class="note">{len(comps) - SAMPLES_SHOWN} more samples in samples.jsonl</p>')
    if not comps:
        parts.append('<p class="note">no completion text in this data (an eval.json written before they were '
                     "recorded)</p>")
    parts.append("</section>")
    return "".join(parts)


# ----------------------------------------------------------------------------------------------------- page
def _table(header: Sequence[str], rows: Iterable[Sequence[str]], *, raw: int | None = None, cls: str = "") -> str:
    """An HTML table; cell ``raw`` of each row is HTML already (a link), every other cell is escaped."""
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c if i == raw else e(str(c))}</td>" for i, c in enumerate(r)) + "</tr>"
                   for r in rows)
    attr = f' class="{cls}"' if cls else ""
    return f"<table{attr}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _prompt_index(result: RunResult, order: list[str]) -> str:
    prompts = result.prompts
    bs = budgets(result)
    header = ["#", "prompt", "category", "chain τ", *[f"DDTree-{b} τ" for b in bs], "floor", "rounds", "verdict"]
    rows = []
    for k, pid in enumerate(order, 1):
        r = prompts[pid]
        link = (f'<a href="#p-{html.escape(pid)}">{html.escape(pid)}</a>' if k <= PROMPTS_SHOWN
                else html.escape(pid))
        rows.append([str(k), link, r.category, fmt(r.tau), *[fmt(r.ddtree.get(b)) for b in bs], fmt(r.floor),
                     str(r.rounds), verdict_text(r.passed)])
    return _table(header, rows, raw=1, cls="index")


def _plot(name: str, files: Sequence[str], alt: str) -> str:
    """The report folder's plot ``name`` shown where it is (a link to the file), when this run wrote it."""
    if name not in files:
        return ""
    e = html.escape
    return f'<p><a href="{e(name)}"><img class="plot" src="{e(name)}" alt="{e(alt)}"></a></p>'


def _drift_section(result: RunResult, files: Sequence[str]) -> str:
    """The hidden-state drift: per comparison and layer, the drift against its tolerance and, where the budget was
    measured, the drift gate's drift x safety against the budget and its CI; the budget itself, its ladder and its
    plot (nothing when the run measured no drift)."""
    dh, drows = drift_rows(result)
    gh, grows = gate_rows(result)
    budget = budget_line(result)
    if not drows and not grows and not budget:
        return ""
    e = html.escape
    gate = result.final_verdict().outcome(DRIFT_GATE)
    out = ['<section id="drift"><h2>Hidden-state drift and the drift budget'
           + (f' <span class="badge {e(gate)}">drift gate {e(gate.upper())}</span>' if gate else "") + "</h2>"]
    if drows:
        out += ['<h3>Drift per comparison and layer (worst prompt) against its tolerance</h3>',
                '<p class="sub">relative L2 error and cosine of the features of the two sides of each comparison; '
                "max |Δτ|: the largest difference of a prompt's τ between them</p>", _table(dh, drows, cls="drift")]
    if budget:
        out.append(f'<p class="sub budget">{e(budget)}</p>')
    if grows:
        out += ["<h3>Drift gate: the drift x the safety factor against the drafter's drift budget and its CI</h3>",
                _table(gh, grows, cls="gate")]
    lh, lrows = ladder_rows(result)
    if lrows:
        out.append("<details><summary>the drift budget's ladder: τ against the injected feature error</summary>"
                   f"{_table(lh, lrows)}</details>")
    out.append(_plot(BUDGET_PLOT, files, "τ and the mean τ drop against the injected feature error, the measured "
                                         "drift marked"))
    return "".join(out) + "</section>"


def _speedup_section(result: RunResult, files: Sequence[str]) -> str:
    """The predicted speed-up: per strategy τ, the round's cost, the speed-up and tokens/s with the intervals τ's CI
    maps to; the lines around it (device, plain decoding, the best strategy, the floor's verdict); the measured
    costs the prediction is made of; the plot (nothing when the run predicted none)."""
    block = result.speedup
    header, rows = speedup_rows(block)
    if not rows:
        return ""
    e = html.escape
    out = ['<section id="speedup"><h2>Predicted speed-up over plain decoding on this run\'s device</h2>',
           _table(header, rows, cls="speedup")]
    out += [f'<p class="sub">{e(line)}</p>' for line in speedup_lines(block, result.final_verdict())]
    ch, crows = cost_rows(block)
    if crows:
        out += ["<h3>Measured costs the prediction is made of (each the median of its timings)</h3>",
                _table(ch, crows, cls="costs")]
    out.append(_plot(SPEEDUP_PLOT, files, "predicted speed-up against the DDTree budget, the chain beside it"))
    return "".join(out) + "</section>"


def html_verdict_lines(result: RunResult, *, recorded: bool = False) -> list[str]:
    """The verdict block's lines for the run's ``result`` as the terminal prints them (the verdict it holds); without
    the ``reports:`` line (the page links the files)."""
    return verdict_lines(result, report_dir=None, recorded=recorded)


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d1d1f;background:#fff}
main{max-width:1240px;margin:0 auto;padding:16px 24px 48px}
h1{font-size:22px;margin:8px 0 2px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:0 0 4px}.sub{color:#555;margin:0 0 12px;font-size:13px}
.verdict{border-radius:6px;padding:10px 14px;margin:10px 0;font:13px/1.5 ui-monospace,Menlo,Consolas,monospace;
white-space:pre-wrap;border:1px solid #ccc;background:#fafafa}
.verdict .first{font-weight:700}.verdict.pass{border-color:#2e7d32;background:#f1f8f1}
.verdict.fail{border-color:#c62828;background:#fdf2f2}.verdict.pass .first{color:#1b5e20}
.verdict.fail .first{color:#b71c1c}
table{border-collapse:collapse;margin:6px 0 12px;font-size:13px}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:right}th{background:#f3f3f3}
td:first-child,th:first-child,table.index td:nth-child(2),table.index td:nth-child(3){text-align:left}
.index-wrap{max-height:330px;overflow:auto;display:inline-block;border-bottom:1px solid #ddd}
.index-wrap table{margin:0}.index-wrap th{position:sticky;top:0}
.charts{display:flex;flex-wrap:wrap;gap:12px;margin:8px 0}.chart{background:#fff;border:1px solid #e3e3e3}
.chart .grid{stroke:#eee}.chart .axis{stroke:#888}.chart .tick{font-size:10px;fill:#555}
.chart .label{font-size:11px;fill:#333}.chart .ct{font-size:12px;font-weight:600;fill:#222}
.chart .legend{font-size:11px;fill:#333}
.prompt{border:1px solid #ddd;border-left:5px solid #9a9a9a;border-radius:4px;padding:10px 14px;margin:14px 0}
.prompt.fail{border-left-color:#c62828}.prompt.pass{border-left-color:#2e7d32}
.rank{color:#888;font-weight:400}.cat{color:#555;font-weight:400;font-size:13px}
.badge{font-size:11px;padding:1px 6px;border-radius:8px;background:#eee;color:#333}
.badge.fail{background:#c62828;color:#fff}.badge.pass{background:#2e7d32;color:#fff}
.facts{margin:0 0 6px;color:#333;font-size:13px}.note{color:#666;font-size:12px}
.ptext{white-space:pre-wrap;background:#f7f7f7;padding:6px;font-size:12px;max-height:240px;overflow:auto}
.sample{margin:8px 0}.shead{font-size:12px;color:#444;margin-bottom:2px}
.text{font:12.5px/1.6 ui-monospace,Menlo,Consolas,monospace;white-space:pre-wrap;word-break:break-word;
background:#fcfcfc;border:1px solid #eee;padding:8px;max-height:520px;overflow:auto}
.marks{display:none}
.accepted{background:#c8ecc9}.accepted:hover,.rejected:hover,.bonus:hover,.end:hover{outline:1px solid #333}
.rejected{background:#ffb3b3;box-shadow:inset 0 -2px 0 #c62828;font-weight:700}
.rejected:empty{border-left:3px solid #c62828}
.bonus{background:#b9d7f5}.end{background:#e0e0e0}.prefill{background:#ececec}
.unreached{background:repeating-linear-gradient(45deg,#f3f3f3,#f3f3f3 4px,#fff 4px,#fff 8px);color:#888}
.nl{color:#c62828;font-weight:400}
.legendbar span{display:inline-block;padding:0 6px;margin-right:6px;font:12px ui-monospace,monospace}
.switch{position:sticky;top:0;background:#fff;padding:6px 0;z-index:2;border-bottom:1px solid #eee}
.switch label{margin-right:12px}
img.plot{max-width:100%;border:1px solid #e3e3e3}.badge.inconclusive{background:#d95f02;color:#fff}
table.costs td:last-child,table.gate td:nth-child(4){text-align:left}
"""

_JS = """
(function(){
  var body=document.body, loops=LOOPS, titles=TITLES;
  function fill(t, v){ return t.replace(/\\{(\\w)\\}/g, function(_, k){ return v[k]; }); }
  [].forEach.call(document.querySelectorAll('.marks span[data-p]'), function(s){
    var t=titles[s.className]; if(!t){return;}
    var m=loops[s.parentNode.getAttribute('data-method')]||'';
    s.title=fill(t,{m:m, r:s.getAttribute('data-r'), a:s.getAttribute('data-a'), p:s.getAttribute('data-p'),
                    q:s.getAttribute('data-q')||s.getAttribute('data-p')});
  });
  function show(m){ if(!(m in loops)){return;} body.setAttribute('data-method',m);
    var i=document.querySelector('input[name=method][value="'+m+'"]'); if(i){i.checked=true;} count(); }
  function count(){ var n=document.querySelectorAll('.marks[data-method="'+body.getAttribute('data-method')+
      '"] .rejected').length, shown=document.getElementById('marks-count');
    if(shown){shown.textContent=n+' rejected drafts marked ('+loops[body.getAttribute('data-method')]+')';} }
  [].forEach.call(document.querySelectorAll('input[name=method]'),function(i){
    i.addEventListener('change',function(){show(i.value);});});
  var q=/[?&]method=([\\w-]+)/.exec(location.search)||/method=([\\w-]+)/.exec(location.hash);
  show(q ? q[1] : 'chain');
  window.addEventListener('load', function(){  // each plot's drawn width (0: the file could not be shown)
    [].forEach.call(document.querySelectorAll('img.plot'), function(i){
      i.setAttribute('data-width', i.naturalWidth); });
  });
  body.setAttribute('data-ready','1');
})();
"""


def _json(value: object) -> str:
    """``value`` as a JavaScript literal inside a ``<script>`` (``</`` cannot close it)."""
    return json.dumps(value, ensure_ascii=False).replace("</", "<\\/")


def _method_css(result: RunResult) -> str:
    return "".join(f'body[data-method="{m}"] .marks[data-method="{m}"]{{display:block}}' for m, _ in _methods(result))


def _shown_path(path: object) -> str:
    """A path of the run as the page shows it: relative to the working folder when inside it (where the run was
    started: what the user typed, not the machine's folders above it)."""
    if not isinstance(path, str) or not path:
        return "-"
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path


def _or_dash(value: object) -> object:
    """A field of the run's context, ``-`` where the context does not record it."""
    return "-" if value is None else value


def _head_lines(result: RunResult) -> list[str]:
    s, ctx = result.settings or {}, result.context if result.context is not None else ContextBlock()
    lines = [f"drafter {_shown_path(None if result.drafter is None else result.drafter.path)}",
             f"target {_shown_path(s.get('target_model') if result.target is None else result.target.path)}"]
    facts = [f"block size {_or_dash(ctx.block_size)}", f"max new tokens {_or_dash(ctx.max_new_tokens)}",
             f"{len(result.prompts)} prompts"]
    if is_number(s.get("temperature")) and s["temperature"] > 0:
        facts.append(f"temperature {fmt(s['temperature'], 2, 'g')}, {s.get('samples_per_prompt', '-')} samples per "
                     "prompt")
    if ctx.backend or ctx.dtype:
        facts.append(f"{_or_dash(ctx.backend)} / {_or_dash(ctx.dtype)}")
    if result.created:
        facts.append(f"written {result.created}")
    return [" · ".join(lines), " · ".join(facts)]


#: The report folder's files the page links (those that are there): every file a run writes but the page itself.
LINKED = tuple(n for n in REPORT_FILES if n != HTML_NAME)
#: The drift budget's plot (:mod:`dflash_eval.report.budget_plot`).
BUDGET_PLOT = "drift_budget.png"


def render_html(result: RunResult, verdict: Sequence[str], *, files: Sequence[str] = LINKED) -> str:
    """The page of the run's ``result`` (module docstring); ``verdict``: its lines (:func:`html_verdict_lines`);
    ``files``: the report folder's files it links."""
    e = html.escape
    prompts = result.prompts
    first = verdict[0] if verdict else "dflash-eval: no verdict"
    state = {True: "pass", False: "fail", None: ""}[result.final_verdict().passed] if verdict else ""
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           "<title>dflash-eval: " + e(first.removeprefix("dflash-eval: ").split(" — ")[0]) + "</title>",
           f"<style>{_CSS}{_method_css(result)}</style></head>", '<body data-method="chain"><main>',
           "<h1>DFlash drafter evaluation</h1>"]
    out += [f'<p class="sub">{e(line)}</p>' for line in _head_lines(result)]
    out.append(f'<div class="verdict {state}" id="verdict">'
               + "".join(f'<div class="{"first" if i == 0 else "line"}">{e(line)}</div>'
                         for i, line in enumerate(verdict or [first])) + "</div>")
    if files:
        out.append('<p class="sub">files: ' + " · ".join(f'<a href="{e(f)}">{e(f)}</a>' for f in files) + "</p>")
    if result.tau is not None:
        out.append("<h2>τ by category</h2>")
        kinds = tau_kinds_line(result)
        if kinds:
            out.append(f'<p class="sub">{e(kinds)}</p>')
        header, rows = category_rows(result)
        out.append(f'<p class="sub">macro mean over prompts, median, {e(category_ci_name(result))} of the mean</p>')
        out.append(_table(header, rows))
        out.append(_category_charts(result))
        header, rows = acceptance_rows(result)
        if rows:
            out.append("<details><summary>acceptance per position and accept lengths, every prompt and category"
                       f" (the table of eval.md)</summary>{_table(header, rows)}</details>")
    out.append(_speedup_section(result, files))
    out.append(_drift_section(result, files))
    if prompts:
        order = worst_rows(prompts, len(prompts))
        out.append(f"<h2>Prompts, worst first ({len(prompts)})</h2>")
        out.append('<p class="sub">failing prompts first, then the least room above the floor (the lowest τ without '
                   "a floor)</p>")
        out.append(f'<div class="index-wrap">{_prompt_index(result, order)}</div>')
        shown = order[:PROMPTS_SHOWN]
        if len(order) > len(shown):
            out.append(f'<p class="note">the {len(order) - len(shown)} prompts after the first {len(shown)}: rows '
                       "above, texts and rounds in samples.jsonl</p>")
        radios = "".join(f'<label><input type="radio" name="method" value="{m}"{" checked" if m == "chain" else ""}>'
                         f" {e(label)}</label>" for m, label in _methods(result))
        out.append('<div class="switch">mark the rounds of: ' + radios + ' <span class="legendbar">'
                   '<span class="accepted">accepted drafts</span><span class="rejected">first rejected</span>'
                   '<span class="bonus">bonus (whole block)</span><span class="end">last token</span>'
                   '<span class="prefill">prefill</span><span class="unreached">no round</span></span>'
                   ' <span class="note" id="marks-count"></span></div>')
        out.append('<p class="note">positions count completion tokens from 0; hover a mark for its round</p>')
        out += [_prompt_section(result, k, pid, prompts[pid]) for k, pid in enumerate(shown, 1)]
    script = _JS.replace("LOOPS", _json(dict(_methods(result)))).replace("TITLES", _json(TITLES))
    out += ["</main>", f"<script>{script}</script>", "</body></html>"]
    return "\n".join(out) + "\n"


def write_html(result: RunResult, path: Path, *, recorded: bool = False) -> Path:
    """eval.html at ``path`` (atomically) for the run's ``result``; ``recorded``: this run wrote the τ floors it is
    judged against (the verdict says so). OSError when it cannot be written (the caller names it)."""
    files = [n for n in LINKED if (path.parent / n).is_file()]
    atomic_write_text(path, render_html(result, html_verdict_lines(result, recorded=recorded), files=files))
    return path
