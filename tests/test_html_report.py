"""reports/eval.html: the rounds marked in the completion text (accepted drafts, the first rejected draft, the bonus
token of a whole block, the last token), τ along the response, worst prompts first, and the page as a browser draws
it: the suite run in-process on the bundled target and drafter, its eval.html opened in headless Chromium (Debian's
``chromium`` or ``chromium-headless-shell``; skipped, naming what was not checked, where none is installed), its
screenshot and its DOM after the scripts ran checked against the run's eval.json: the whole verdict (the drift and
speed-up sections, every reason a test was skipped) and a link to every file the run wrote.

Run: ``pytest tests/test_html_report.py -p no:cacheprovider``
"""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from dflash_eval.report.html_report import (
    BUCKET,
    Segment,
    html_verdict_lines,
    render_html,
    segments,
    tau_by_position,
    title,
)
from dflash_eval.report.speedup_report import speedup_rows
from dflash_eval.session.run_result import RunResult
from dflash_eval.testing import browser

NO_BROWSER = ("no Chromium (apt-get install -y chromium, or $DFLASH_EVAL_CHROMIUM): eval.html not opened in a "
              "browser; its rendering, its scripts and its screenshot not checked")


# ------------------------------------------------------------------------------------------------- the rounds
def test_segments_follow_the_rounds() -> None:
    # block 4, 12 tokens: rounds start at 0, 3, 4, 8 (a = 3, 1, 4, 3); the last ends on the last token (11)
    got = segments([3, 1, 4, 3], 12, 4)
    assert got == [Segment("prefill", 0, 1), Segment("accepted", 1, 3, 1, 3), Segment("rejected", 3, 4, 1, 3),
                   Segment("rejected", 4, 5, 2, 1), Segment("accepted", 5, 8, 3, 4), Segment("bonus", 8, 9, 3, 4),
                   Segment("accepted", 9, 11, 4, 3), Segment("end", 11, 12, 4, 3)]
    assert sum(s.hi - s.lo for s in got) == 12  # every token in exactly one role
    # --max-blocks stopped the loop: the rest is reached by no round
    assert segments([2], 6, 4)[-1] == Segment("unreached", 3, 6)
    # rounds that do not fit the completion are cut where they would run past it
    assert segments([2, 9], 5, 8) == [Segment("prefill", 0, 1), Segment("accepted", 1, 2, 1, 2),
                                      Segment("rejected", 2, 3, 1, 2), Segment("unreached", 3, 5)]
    assert segments([], 0, 8) == []


def test_tau_by_position_is_the_mean_accept_length_of_the_rounds_starting_in_a_bucket() -> None:
    rounds = [(0, 4), (4, 2), (6, 8), (BUCKET, 1), (BUCKET + 1, 3), (3 * BUCKET, 5)]
    assert tau_by_position(rounds) == {0: (14 / 3, 3), 1: (2.0, 2), 3: (5.0, 1)}


def _row(ids: list[int], pieces: list[str], accept: list[int], dd: list[int], **over: Any) -> dict[str, Any]:
    comp = {"sample": 0, "source": "local", "ids": ids, "text": "".join(pieces), "pieces": pieces,
            "accept_lengths": accept, "tau": sum(accept) / len(accept), "ddtree": {"8": sum(dd) / len(dd)},
            "ddtree_accept_lengths": {"8": dd}}
    return {"category": "code", "tau": comp["tau"], "rounds": len(accept), "accept_lengths": accept,
            "histogram": [], "position_rates": [], "ddtree": comp["ddtree"], "ddtree_accept_lengths": {"8": dd},
            "floor": 1.5, "ddtree_floor": {}, "prompt_tokens": 3, "completion_tokens": len(ids), "passed": True,
            "prompt_ids": [1, 2, 3], "prompt_text": "<b>prompt</b>", "completions": [comp], **over}


def test_text_is_escaped_and_worst_prompts_come_first() -> None:
    pieces = ["x", "<script>", "alert(1)", "</script>", " &", "\n", "y"]
    from result_rows import fragment

    from dflash_eval.report import merge

    run = merge([fragment(context={"block_size": 8}, mean_tau=2.0, mean_floor=1.0, mean_ddtree={},
                          mean_ddtree_floor={},
                          prompts={"good": _row(list(range(7)), pieces, [3, 3], [3, 3]),
                                   "bad": _row(list(range(7)), pieces, [1, 1, 4], [2, 4], passed=False, tau=1.0)})])
    page = render_html(run, ["dflash-eval: FAIL (τ below its floors) — <mean>"])
    assert "&lt;script&gt;alert(1)" in page and "&lt;/script&gt;" in page and " &amp;" in page
    assert "&lt;b&gt;prompt&lt;/b&gt;" in page and "FAIL (τ below its floors) — &lt;mean&gt;" in page
    assert page.index('id="p-bad"') < page.index('id="p-good"')  # the failing prompt first
    assert page.count("<script") == page.count("</script>") == 1  # the page's own script, nothing from the data
    assert '<span class="rejected" data-p="2" data-r="2" data-a="1">' in page  # round 2 ends at position 2
    assert title("rejected", "chain", Segment("rejected", 2, 3, 2, 1)) == (
        "chain round 2: accept length 1; the draft at position 2 was rejected (the target's token shown)")


def _whole_run(files: tuple[str, ...]) -> tuple[dict[str, Any], str]:
    """eval.json data of a run with τ, drift, the drift budget and its gate, the predicted speed-up, six reasons of
    skipped tests and its verdict; and its page, linking ``files``."""
    from result_rows import fragment
    from test_run_summary import budget
    from test_speedup import costs

    from dflash_eval.metrics.speedup import speedup_block
    from dflash_eval.metrics.verdict import run_verdict
    from dflash_eval.report import merge

    pieces = ["def ", "f", "(", "):"]
    frag: dict[str, Any] = {"worker": "master", "context": {"block_size": 8}, "settings": {}, "mean_tau": 2.0,
                            "mean_floor": 1.0, "mean_ddtree": {}, "mean_ddtree_floor": {},
                            "prompts": {"a": _row(list(range(4)), pieces, [2, 1], [2, 1])}}
    frag["drift"] = [{"comparison": c, "prompt_id": "a", "layer": layer, "rel_err": 1e-3 * (layer + 1), "cos": 0.9999,
                      "max_abs": 0.01, "rel_tol": 5e-2, "cos_tol": 0.998, "passed": True}
                     for c in ("bf16-vs-fp32", "torch-vs-torch-recurrent") for layer in (1, 3)]
    frag["drift_accept"] = [{"comparison": c, "prompt_id": "a", "tau_a": 2.0, "tau_b": 2.0, "diff": 0.0, "tol": 0.5,
                             "passed": True, "a": "x", "b": "y"} for c in ("bf16-vs-fp32", "torch-vs-torch-recurrent")]
    frag.update(budget("pass"))
    frag["speedup"] = speedup_block(costs(), (2.0, (1.8, 2.2)), {8: (2.5, (2.2, 2.8))}, floor=1.0).to_dict()
    data = merge([fragment(**frag)]).to_dict()  # eval.json's data, whole: the page's verdict reads it typed
    data["not_checked"] = [{"reason": f"reason number {k}", "tests": k, "first": f"t{k}"} for k in range(1, 7)]
    data["verdict"] = run_verdict(RunResult.from_dict(data)).to_dict()
    result = RunResult.from_dict(data)
    return data, render_html(result, html_verdict_lines(result), files=files)


def test_the_page_shows_the_whole_verdict_and_links_every_file() -> None:
    """eval.html's drift section (per comparison and layer: the drift against its tolerance, the gate's drift x
    safety against the budget and its CI, the budget, the plot), its speed-up section (per strategy: τ, the
    speed-up and tokens/s with their CIs; the measured costs; the plot), every reason a test was skipped, and a link
    to every file the run wrote."""
    from dflash_eval.report.html_report import LINKED

    assert set(LINKED) == {"eval.md", "eval.json", "eval.png", "drift_budget.png", "speedup.png", "samples.jsonl"}
    data, page = _whole_run(LINKED)
    dom = _Dom(page)
    links = {a["href"] for a, _ in dom.find("a") if "href" in a and not a["href"].startswith("#")}
    assert links == set(LINKED)
    drift = [(a, t) for a, t in dom.find("table", section="drift")]
    assert [a.get("class") for a, _ in drift] == ["drift", "gate", None]  # drift vs tolerance, the gate, the ladder
    rows = dom.find("tr", section="drift")
    cells = [t for _, t in dom.find("td", section="drift")]
    assert "bf16-vs-fp32" in cells and "torch-vs-torch-recurrent" in cells and "5.0e-02" in cells  # its tolerance
    assert len(rows) == 1 + 4 + 1 + len(data["drift_gate"]) + 1 + len(data["drift_budget"]["levels"])
    assert "0.08–0.12" in cells  # the budget's CI, beside the drift x safety it is compared with
    (badge,) = dom.find("span", "badge", section="drift")
    assert badge[1] == "drift gate PASS"
    (line,) = [t for _, t in dom.find("p", "budget", section="drift")]
    assert line.startswith("drift budget of drafter") and "(90 % CI 8.00e-02–1.20e-01)" in line
    (plot,) = dom.find("img", "plot", section="drift")
    assert plot[0]["src"] == "drift_budget.png"
    speed = dom.find("table", section="speedup")
    assert [a.get("class") for a, _ in speed] == ["speedup", "costs"]
    cells = [t for _, t in dom.find("td", section="speedup")]
    strategies = cells[0:18:6]  # the first column of the strategies' table (6 columns), then the costs' table
    assert strategies == ["chain", "DDTree-8 (best)", "chain"], strategies
    assert cells[1:18:6] == ["server-style loop", "server-style loop", "recompute loop"]  # each row's loop
    assert cells[4].startswith(f"{data['speedup']['strategies']['chain']['speedup']:.2f}x [")  # with its CI
    assert {"step", "verify", "draft", "commit_1", "commit_b", "tree_verify_8"} <= set(cells[18:])  # the costs
    (plot,) = dom.find("img", "plot", section="speedup")
    assert plot[0]["src"] == "speedup.png"
    verdict = " ".join(t for _, t in dom.find("div", "line"))
    assert all(f"not checked: reason number {k} ({k} test" in verdict for k in range(1, 7))
    assert "more reasons" not in page and "--speedup-floor 1 (the server-style loop" in page and "chain): PASS" in page
    # a plot the run did not write is neither linked nor shown
    _, without = _whole_run(("eval.md", "eval.json"))
    assert "drift_budget.png" not in without and "speedup.png" not in without


# ------------------------------------------------------------------------------------------------- in a browser
class _Dom(HTMLParser):
    """Elements of a dumped DOM: tag, attributes, text (of the element and its descendants) and where it is: the id
    of the prompt section and the loop (``data-method``) of the marks it is in."""

    VOID = {"meta", "link", "br", "img", "input", "hr", "circle", "line", "polyline", "path", "rect"}

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[tuple[str, dict[str, str], list[str], dict[str, str]]] = []
        self._open: list[tuple[str, dict[str, str], list[str], dict[str, str]]] = []
        self.feed(html)

    def _element(self, tag: str, attrs: list[tuple[str, str | None]]) -> tuple[str, dict[str, str], list[str],
                                                                                 dict[str, str]]:
        a = {k: v or "" for k, v in attrs}
        ctx = dict(self._open[-1][3]) if self._open else {}
        if tag == "section":
            ctx["section"] = a.get("id", "")
        if "marks" in a.get("class", "").split():
            ctx["method"] = a.get("data-method", "")
        el = (tag, a, [], ctx)
        self.elements.append(el)
        return el

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        el = self._element(tag, attrs)
        if tag not in self.VOID:
            self._open.append(el)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._element(tag, attrs)

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i][0] == tag:
                del self._open[i:]
                break

    def handle_data(self, data: str) -> None:
        for _, _, text, _ in self._open:
            text.append(data)

    def find(self, tag: str | None = None, cls: str | None = None, *, section: str | None = None,
             method: str | None = None, **attrs: str) -> list[tuple[dict[str, str], str]]:
        """``(attributes, text)`` of the matching elements, in document order (``section``, ``method``: inside that
        prompt section, inside the marks of that loop)."""
        return [(a, "".join(t)) for g, a, t, ctx in self.elements
                if (tag is None or g == tag) and (cls is None or cls in a.get("class", "").split())
                and (section is None or ctx.get("section") == section)
                and (method is None or ctx.get("method") == method)
                and all(a.get(k.replace("_", "-")) == v for k, v in attrs.items())]


def _expected_marks(comp: dict[str, Any], lengths: list[int], block: int) -> dict[str, int]:
    """Counts of the marks of one reference, computed from its rounds alone (not through :func:`segments`)."""
    n, start, out = len(comp["ids"]), 0, {"rejected": 0, "bonus": 0, "end": 0}
    for a in lengths:
        start += a
        out["bonus" if a == block else "end" if start == n - 1 else "rejected"] += 1
    return out


@pytest.fixture
def chromium() -> str:
    exe = browser.find_chromium()
    if exe is None:
        pytest.skip(NO_BROWSER)
    return exe


@pytest.mark.slow
def test_eval_html_of_a_bundled_run_in_a_browser(chromium, bundled_suite, tmp_path) -> None:
    res = bundled_suite("-k", "tau or speedup or drift", "--max-new-tokens", "48", "--tau-floor", "1.5",
                        "--drift-budget-min-prompts", "2", report="reports", cache=tmp_path / "cache")
    assert res.ret == 0, res.stdout.str()
    reports = tmp_path / "reports"
    data = json.loads((reports / "eval.json").read_text())
    page = reports / "eval.html"
    assert page.is_file() and (reports / "samples.jsonl").is_file()
    block = data["context"]["block_size"]
    prompts = data["prompts"]
    assert len(prompts) == 2 and all(r["completions"] for r in prompts.values())

    dom = _Dom(browser.dump_dom(page))
    (body,) = [a for t, a, *_ in dom.elements if t == "body"]
    assert body.get("data-ready") == "1" and body.get("data-method") == "chain"  # the script ran
    (first,) = dom.find("div", "first")
    assert first[1] == html_verdict_lines(RunResult.from_dict(data))[0] and first[1].startswith("dflash-eval: PASS")
    sections = dom.find("section", "prompt")
    assert len(sections) == len(prompts)
    lowest = min(prompts, key=lambda p: prompts[p]["tau"])
    assert sections[0][0]["id"] == f"p-{lowest}"  # worst (lowest τ above one floor) first
    for section, _ in sections:
        pid = section["id"].removeprefix("p-")
        (comp,) = prompts[pid]["completions"]
        for method, lengths in [("chain", comp["accept_lengths"]), ("ddtree-8", comp["ddtree_accept_lengths"]["8"])]:
            want = _expected_marks(comp, lengths, block)
            for kind, count in want.items():
                assert len(dom.find("span", kind, section=section["id"], method=method)) == count, (pid, method, kind)
            assert want["rejected"] > 0  # the bundled drafter is rejected somewhere in 48 tokens
            (marks,) = dom.find("div", "marks", section=section["id"], data_method=method)
            assert marks[1].replace("↵", "") == comp["text"]  # the marks hold the whole text, in order
            label = "chain" if method == "chain" else "DDTree-8"
            spans = [a for a, _ in dom.find("span", section=section["id"], method=method) if "data-p" in a]
            assert spans and all(a.get("title") for a in spans)  # every mark has its tooltip, written by the script
            first_round = [a["title"] for a in spans if a.get("data-r") == "1"]
            assert first_round[0].startswith(f"{label} round 1: accept length {lengths[0]}; "), first_round
    (count,) = dom.find("span", id="marks-count")
    assert count[1] == f"{len(dom.find('span', 'rejected', method='chain'))} rejected drafts marked (chain)"

    # the whole verdict: the drift section per comparison and layer, the speed-up section, the plots drawn, every
    # file linked
    links = {a["href"] for a, _ in dom.find("a") if "href" in a and not a["href"].startswith("#")}
    assert links == {n for n in ("eval.md", "eval.json", "eval.png", "drift_budget.png", "speedup.png",
                                 "samples.jsonl") if (reports / n).is_file()} and "speedup.png" in links
    layers = {(r["comparison"], r["layer"]) for r in data["drift"]}
    assert len(dom.find("tr", section="drift")) >= 1 + len(layers) + 1 + len(data["drift_gate"])
    assert len(data["drift_gate"]) == len({(g["comparison"], g["layer"]) for g in data["drift_gate"]}) > 0
    header, want_rows = speedup_rows(RunResult.from_dict(data).speedup)  # the strategies' table first, then the costs'
    cells = [t for _, t in dom.find("td", section="speedup")]
    rows = [cells[i:i + len(header)] for i in range(0, len(header) * len(want_rows), len(header))]
    assert rows == [list(r) for r in want_rows]
    server = [r[0].removesuffix(" (best)") for r in rows if r[1] == "server-style loop"]
    assert server == ["chain", *(f"DDTree-{b}" for b in data["mean_ddtree"])]  # every strategy's row, named
    assert [r[0] for r in rows if r[1] == "recompute loop"] == ["chain"]  # the measured loop's row stays
    for section, name in (("drift", "drift_budget.png"), ("speedup", "speedup.png")):
        (plot,) = dom.find("img", "plot", section=section)
        assert plot[0]["src"] == name and int(plot[0]["data-width"]) > 100, plot  # the browser drew the plot
    lines = [t for _, t in dom.find("div", "line")]
    assert [x for x in lines if x.startswith("not checked: ")] == [
        f"not checked: {g['reason']} ({g['tests']} test{'s' if g['tests'] != 1 else ''})"
        for g in data["not_checked"]]

    switched = _Dom(browser.dump_dom(page, query="method=ddtree-8"))
    (body,) = [a for t, a, *_ in switched.elements if t == "body"]
    assert body.get("data-method") == "ddtree-8"
    (count,) = switched.find("span", id="marks-count")
    assert count[1] == f"{len(switched.find('span', 'rejected', method='ddtree-8'))} rejected drafts marked (DDTree-8)"

    png = browser.screenshot(page, tmp_path / "eval.png", width=1280, height=4800)  # down to the first prompts
    _check_screenshot(png, (1280, 4800))


def _check_screenshot(png: Path, size: tuple[int, int]) -> None:
    image_mod = pytest.importorskip("PIL.Image", reason="Pillow (matplotlib's) reads the screenshot")
    with image_mod.open(png) as im:
        assert im.size == size
        rgb = im.convert("RGB")
        colours = rgb.getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 50, "a blank page: fewer than 50 colours"

    def near(target: tuple[int, int, int]) -> int:
        return sum(n for n, c in colours if max(abs(a - b) for a, b in zip(c, target)) <= 6)

    assert near((0xC8, 0xEC, 0xC9)) > 100, "no accepted drafts drawn (their green)"
    assert near((0xFF, 0xB3, 0xB3)) > 20, "no rejected draft drawn (its red)"
    assert near((0x00, 0x72, 0xB2)) > 20, "no chart line drawn (the first series' blue)"
