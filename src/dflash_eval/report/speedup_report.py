"""The predicted speed-up in the reports: its table (every strategy: τ, the round's cost, speed-up and tokens/s with
the intervals τ's CI maps to), the lines around it (device, plain decoding's speed, the round's parts, the best
budget, the floor and its verdict, as the run's verdict holds it), the verdict block's line and ``speedup.png``
(predicted speed-up against the DDTree budget, the chain beside it). From the typed result's speed-up
(:class:`~dflash_eval.metrics.speedup.Speedup`, eval.json's ``speedup`` block:
:func:`dflash_eval.metrics.speedup.speedup_block`); the arithmetic and what it leaves out: docs/speedup.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dflash_eval.common.number_text import ci_text, ends, fmt, is_number
from dflash_eval.metrics.speedup import MODELS, Loop, LoopModel, Prediction, Speedup, budget_of
from dflash_eval.metrics.verdict import SPEEDUP_FLOOR, Verdict
from dflash_eval.report.plot import draw_once
from dflash_eval.session.run_result import RunResult

if TYPE_CHECKING:  # matplotlib is imported when the plot is drawn
    from matplotlib.figure import Figure

__all__ = ["SPEEDUP_PLOT", "speedup_rows", "cost_rows", "speedup_lines", "verdict_line",
           "write_speedup_plot", "speedup_figure", "strategy_label", "model_name"]

#: The plot's file name in the report folder.
SPEEDUP_PLOT = "speedup.png"


def strategy_label(strategy: str) -> str:
    """``chain`` or ``DDTree-N`` (the reports' spelling)."""
    b = budget_of(strategy)
    return "chain" if b is None else f"DDTree-{b}"


def _x(v: object, digits: int = 2) -> str:
    return f"{fmt(v, digits)}x" if is_number(v) else fmt(v)


def _ci(ci: object, digits: int = 2, unit: str = "") -> str:
    lo, hi = ends(ci)
    if not is_number(lo) or not is_number(hi):
        return ""
    return f" {ci_text(lo, hi, digits, unit=unit, brackets=True)}"


def _ms(s: object) -> str:
    return fmt(1e3 * s, 2) if is_number(s) else fmt(s)


def _model(block: Speedup | None, model: Loop) -> LoopModel:
    """A model's loop (``server``: the server-style loop; ``loop``: the recompute loop) as the block says, else as
    :data:`dflash_eval.metrics.speedup.MODELS` does."""
    named = None if block is None else block.models.get(model)
    return named if named is not None else LoopModel(**MODELS[model])


def model_name(block: Speedup | None, model: Loop) -> str:
    """The name of a model's loop (``server``: the server-style loop; ``loop``: the recompute loop), as the block
    says (:data:`dflash_eval.metrics.speedup.MODELS`)."""
    return _model(block, model).name or MODELS[model]["name"]


def _speedup(p: Prediction | None) -> float | None:
    return None if p is None else p.speedup


def speedup_rows(block: Speedup | None) -> tuple[list[str], list[list[str]]]:
    """The table: one row per strategy of the server-style loop, then the chain as the recompute loop runs it, each
    row naming its loop (no rows without a prediction)."""
    header = ["strategy", "loop", "mean τ [95 % CI]", "round (ms)", "speed-up [95 % CI]", "tokens/s [95 % CI]"]
    if block is None:
        return header, []
    rows = []
    server, loop = model_name(block, "server"), model_name(block, "loop")
    preds = [(k, server, p) for k, p in block.strategies.items()]
    preds += [("", loop, p) for p in (block.loop.get("chain"),) if p]
    for key, name, p in preds:
        label = strategy_label(key or "chain") + (" (best)" if key == block.best else "")
        rows.append([label, name, fmt(p.tau) + _ci(p.tau_ci, 3), _ms(p.round_s),
                     _x(p.speedup) + _ci(p.speedup_ci, 2, "x"), fmt(p.tokens_per_s, 1) + _ci(p.tokens_per_s_ci, 1)])
    return header, rows


#: The measured costs in the order a round runs them, with what each is: (cost key, its index in a pair or None, the
#: key of its timings' spread, what it is).
_COSTS: tuple[tuple[str, int | None, str, str], ...] = (
    ("step", None, "step", "plain decoding: one target step (1 token) and its argmax"),
    ("draft", None, "draft", "server-style loop: the drafter's block pass against its kept context, and lm_head"),
    ("build", None, "build", "server-style loop: the chain's argmax (the tokens to verify)"),
    ("verify", None, "verify", "server-style loop: the target's forward over the chain's B tokens (and its inputs), "
                               "every token's linear-attention state kept"),
    ("accept", None, "accept", "server-style loop: the target's tokens read on the host, the drafts compared"),
    ("commit", 0, "commit_1", "server-style loop: 1 committed token's states, KV cut, drafter context append"),
    ("commit", 1, "commit_b", "the same for B committed tokens"),
    ("draft_full", None, "draft_full", "recompute loop: the drafter's block pass recomputing its context"),
    ("forward_b", None, "forward_b", "recompute loop: a plain target forward over B tokens (its verify)"),
    ("forward_2", None, "forward_2", "recompute loop: a plain target forward over 2 tokens (a commit of 1 draft)"),
    ("project", 0, "project_1", "recompute loop: projecting the target features of 1 committed token"),
    ("project", 1, "project_b", "the same for B committed tokens"),
    ("snapshot", None, "snapshot", "recompute loop: a copy of the target cache before the verify"),
)


def cost_rows(block: Speedup | None) -> tuple[list[str], list[list[str]]]:
    """The measured costs a prediction is made of: every part of a round and the plain decoding step, each the median
    of its timings (ms) with their spread (the interquartile range over the median), in the order a round runs them,
    then each DDTree budget's tree parts (no rows without a prediction). The costs are the measurement's own
    (:class:`dflash_eval.metrics.speedup.RoundCosts`: a part not timed is NaN, which reads like a missing one)."""
    header = ["part", "median (ms)", "spread (IQR / median)", "what"]
    if block is None:
        return header, []
    costs = block.costs
    spread = costs.spread
    rows = []
    for key, index, name, what in _COSTS:
        value = getattr(costs, key)
        if isinstance(value, tuple):  # a part of 1 and of B tokens
            value = value[index] if index is not None and index < len(value) else None
        rows.append([name, _ms(value), fmt(spread.get(name), 2), what])
    for b in costs.budgets:
        for part, what in (("tree_build", f"DDTree-{b}: top-{b} and the best-first tree (the tokens to verify)"),
                           ("tree_verify", f"DDTree-{b}: the target's forward over {b + 1} tokens under the tree "
                                           "mask, every node's linear-attention state kept"),
                           ("tree_accept", f"DDTree-{b}: the target's tokens read, the walk down the tree")):
            tree: dict[int, float] = getattr(costs, part)
            rows.append([f"{part}_{b}", _ms(tree.get(b)), fmt(spread.get(f"{part}_{b}"), 2), what])
    return header, rows


def _source(block: Speedup) -> str:
    return "read from the cache (timed by an earlier run)" if block.cached else "timed in this run"


def speedup_lines(block: Speedup | None, verdict: Verdict) -> list[str]:
    """The lines under the table: where and how the costs were measured, plain decoding's speed, the parts of a
    chain round, the best strategy and budget, the floor's verdict (as the run's ``verdict`` holds it), what the
    prediction assumes."""
    if block is None:
        return []
    costs = block.costs
    st = block.strategies
    chain = st.get("chain")
    parts = ", ".join(f"{k} {_ms(v)}" for k, v in (chain.parts if chain is not None else {}).items())
    server = _model(block, "server")
    lines = [f"Predicted for the {server.name} ({server.module}: {server.what}; "
             f"{server.checked}) and, in the last row, for the {model_name(block, 'loop')}.",
             f"On {block.device} ({block.dtype}, backend {block.backend}), context "
             f"{block.context_len} tokens, costs "
             f"{_source(block)}: medians of {costs.repeats} timings. Plain greedy decoding "
             f"{fmt(block.plain_tokens_per_s, 1)} tokens/s (a step {_ms(costs.step)} ms); a chain "
             f"round of the {server.name} (ms): {parts}."]
    best, bb = block.best, block.best_budget
    if best:
        near = [f"{strategy_label(k)} {_x(_speedup(st.get(k)))}" for k in block.near_best]
        lines.append(f"Best: {strategy_label(best)} {_x(_speedup(st.get(best)))}"
                     + (f" ({', '.join(near)} within 5 %: not told apart by these timings)" if near else "")
                     + (f"; best DDTree budget {bb}" if bb is not None else "") + ". The CIs carry τ's over (the "
                     "95 % t CI of mean τ over prompts through the formula), not the timing noise.")
    if block.pooled:
        lines.append("Over the prompt set as a whole (pooled τ, every token alike: the throughput of decoding them one "
                     "after another): " + ", ".join(
                         f"{strategy_label(k)} {_x(v.speedup)} (τ {fmt(v.tau)}, "
                         f"{fmt(v.tokens_per_s, 1)} tokens/s)" for k, v in block.pooled.items()) + ".")
    part = verdict.part(SPEEDUP_FLOOR)  # the floor's verdict, as the run's verdict holds it
    if part is not None and block.floor is not None:
        lines.append(f"--speedup-floor {block.floor:g} (the {server.name}'s chain): "
                     + ("PASS" if part.passed else "FAIL: " + "; ".join(part.reasons)))
    lines.append("Valid for this device only; a prediction for batch size 1 in this implementation (no serving "
                 "engine's kernels, CUDA graphs or scheduler): docs/speedup.md.")
    return lines


def verdict_line(block: Speedup | None, verdict: Verdict) -> str | None:
    """The verdict block's line: the chain's and the best strategy's predicted speed-up with their CIs, the device,
    the floor and its verdict (``verdict``: the run's; None without a prediction)."""
    if block is None:
        return None
    st = block.strategies
    chain = st.get("chain")
    text = (f"predicted speed-up ({model_name(block, 'server')}) on {block.device} ({block.dtype}): "
            f"chain {_x(_speedup(chain))}"
            f"{_ci(None if chain is None else chain.speedup_ci, 2, 'x')} "
            f"({fmt(None if chain is None else chain.tokens_per_s, 1)} tokens/s, plain "
            f"{fmt(block.plain_tokens_per_s, 1)})")
    best = block.best
    if best and best != "chain":
        text += f", best {strategy_label(best)} {_x(st[best].speedup)}{_ci(st[best].speedup_ci, 2, 'x')}"
    part = verdict.part(SPEEDUP_FLOOR)
    if part is not None and block.floor is not None:
        text += f"; floor {block.floor:g} " + part.label.upper()
    return text


def _bars(p: Prediction) -> tuple[float, float]:
    """How far the speed-up's CI reaches below and above it (0 where either is not a number)."""
    lo, hi = ends(p.speedup_ci)
    s = p.speedup
    if not is_number(s):
        return 0.0, 0.0
    return (max(0.0, s - lo) if is_number(lo) else 0.0), (max(0.0, hi - s) if is_number(hi) else 0.0)


def speedup_figure(result: RunResult) -> Figure | None:
    """Predicted speed-up (with τ's interval as bars) against the DDTree budget, the chain as a horizontal line with
    its band, 1x (plain decoding) marked; None without a prediction."""
    block = result.speedup
    if block is None or not block.strategies:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    st = block.strategies
    trees = sorted(((int(k.removeprefix("ddtree-")), p) for k, p in st.items() if k != "chain"), key=lambda t: t[0])
    fig, ax = plt.subplots(figsize=(7.0, 4.2), dpi=100)
    chain = st.get("chain")
    if chain is not None and is_number(chain.speedup):
        ax.axhline(chain.speedup, color="C1", label=f"chain {_x(chain.speedup)}")
        lo, hi = ends(chain.speedup_ci)
        if is_number(lo) and is_number(hi):
            ax.axhspan(lo, hi, color="C1", alpha=0.15, label="chain: 95 % CI from τ's")
    if trees:
        xs = [b for b, _ in trees]
        ys = [p.speedup for _, p in trees]
        bars = [_bars(p) for _, p in trees]
        err = [[below for below, _ in bars], [above for _, above in bars]]
        ax.errorbar(xs, [y if is_number(y) else float("nan") for y in ys], yerr=err, marker="o", capsize=3,
                    color="C0", label="DDTree-N (bars: 95 % CI from τ's)")
        bb = block.best_budget
        if bb is not None:
            y = st[f"ddtree-{bb}"].speedup
            ax.annotate(f"best N = {bb}: {_x(y)}", (bb, y), textcoords="offset points", xytext=(6, 8), fontsize=9)
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
    ax.axhline(1.0, color="#777777", linestyle="--", linewidth=1, label="plain decoding (1x)")
    ax.set_xlabel("DDTree node budget N")
    ax.set_ylabel("predicted speed-up over plain decoding")
    ax.set_title(f"Predicted speed-up, {model_name(block, 'server')}, on {block.device} ({block.dtype}), "
                 f"context "
                 f"{block.context_len}", fontsize=10)
    ax.legend(fontsize=8, loc="best")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def write_speedup_plot(result: RunResult, path: Path, store: Path | None = None, *,
                       source: str | None = None) -> Path | None:
    """Write ``speedup.png`` (None when the result holds no prediction), drawn once
    (:func:`~dflash_eval.report.plot.draw_once`, ``store``: the cache folder's plots; ``source``: the result's
    :func:`~dflash_eval.report.plot.plot_source`, made already)."""
    return draw_once(path, result, speedup_figure, store, source=source)
