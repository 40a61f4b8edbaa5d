"""Golden completions judged by the target, not by bits (:mod:`dflash_eval.golden.completions`): the suite, in-process
on two bundled prompts in bfloat16 (where the bundled target has near ties to spare), records its golden completions,
then each record is edited at one position to the target's second-best token there (the target's own teacher-forced
logits over the recorded completion say which positions are near ties and which are confident), and the suite runs
again against them.

- a record that leaves the run's completion at a near tie (margin within the bf16 band 0.25) passes, is named in
  eval.json's ``near_ties``, eval.md, the verdict block and the junit properties, and is kept as it is by a
  re-recording run;
- a record that leaves it where the target is confident (margin > 1) fails, the message naming the position, both
  tokens and the margin; a re-recording run replaces it.

Run: ``pytest tests/test_golden_near_ties.py -p no:cacheprovider -n 0``
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from dflash_eval.golden.completions import GoldenComparison, read_golden
from dflash_eval.metrics.near_tie import NEAR_TIE_BAND, TopTokens, first_divergence, judge, near_tie_band
from dflash_eval.session.run_result import RunResult
from dflash_eval.target.loader import load_target

ROOT = Path(__file__).resolve().parents[1]
SELECT = "reference_completion or teacher_forced"


def _margins(golden: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """The bf16 target's top-2 ids and margins at every completion position of a recorded completion."""
    target = load_target(ROOT / "fixtures" / "target", device="cpu", dtype="bf16")
    seq = golden["prompt_ids"] + golden["output_ids"]
    with torch.no_grad():
        logits = target.model(input_ids=torch.tensor([seq])).logits[0].float()
    p = len(golden["prompt_ids"])
    top = logits[p - 1:p - 1 + len(golden["output_ids"])].topk(2, dim=-1)
    return top.indices, top.values[:, 0] - top.values[:, 1]


def _edit(path: Path, position: int, token: int) -> dict[str, Any]:
    """Replace the recorded completion's token at ``position`` (the tokens after it stay: never compared)."""
    data = json.loads(path.read_text())
    data["output_ids"][position] = token
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return data


@pytest.mark.slow
def test_near_tie_passes_named_and_a_confident_change_fails(bundled_suite: Callable[..., pytest.RunResult],
                                                            tmp_path: Path) -> None:
    golden_dir, cache = tmp_path / "golden", tmp_path / "cache"
    common = ("--dtype", "bf16", "--golden-dir", str(golden_dir), "-k", SELECT)
    rec = bundled_suite(*common, "--snapshot-update", report="record", cache=cache)
    assert rec.ret == 0, rec.stdout.str()
    files = sorted((golden_dir / "snapshots").glob("*/test_reference_completions/*.json"))
    assert len(files) == 2 and files[0].parent.parent.name == "target.bfloat16-torch", files
    tie_file, conf_file = files
    tie_golden, conf_golden = read_golden(tie_file), read_golden(conf_file)
    assert tie_golden is not None and conf_golden is not None

    ids, margin = _margins(tie_golden)
    agree = ids[:, 0] == torch.tensor(tie_golden["output_ids"])
    ties = [k for k in range(len(margin)) if margin[k] < NEAR_TIE_BAND["bfloat16"] / 2 and agree[:k + 1].all()]
    assert ties, "the bf16 target has no near tie on this completion before its first teacher-forced difference"
    k_tie = ties[0]
    tie_edit = _edit(tie_file, k_tie, int(ids[k_tie, 1]))

    ids, margin = _margins(conf_golden)
    agree = ids[:, 0] == torch.tensor(conf_golden["output_ids"])
    confident = [k for k in range(len(margin)) if margin[k] > 1.0 and agree[:k + 1].all()]
    k_conf = confident[len(confident) // 2]
    _edit(conf_file, k_conf, int(ids[k_conf, 1]))

    junit = tmp_path / "junit.xml"
    res = bundled_suite(*common, "--junitxml", str(junit), report="judged", cache=cache)
    out = res.stdout.str()
    assert res.ret == 1, out
    outcomes = res.parseoutcomes()
    assert outcomes.get("failed") == 1, out
    conf_pid, tie_pid = conf_golden["prompt_id"], tie_golden["prompt_id"]
    assert f"test_reference_completion[{tie_pid}]" not in "\n".join(
        line for line in out.splitlines() if line.startswith("FAILED")), out
    # the confident change: position, both tokens, the margin and the band in the failure
    assert (f"prompt {conf_pid!r}: the completion leaves the golden completion at completion token {k_conf}"
            in out), out
    assert f"golden {int(ids[k_conf, 1])} " in out and f"this run {conf_golden['output_ids'][k_conf]} " in out, out
    assert "outside the bfloat16 near-tie band 0.25" in out, out
    # the near tie: named in eval.json, eval.md, the verdict block and junit; the record kept
    data = json.loads((tmp_path / "judged" / "eval.json").read_text())
    golden_ties = [d for d in data.get("near_ties", []) if d["against"] == "golden"]
    assert [(d["prompt_id"], d["position"], d["expected"], d["got"]) for d in golden_ties] == [
        (tie_pid, k_tie, tie_edit["output_ids"][k_tie], tie_golden["output_ids"][k_tie])], data.get("near_ties")
    assert 0 <= golden_ties[0]["margin"] < 0.25 and golden_ties[0]["band"] == 0.25
    assert "### Near ties" in (tmp_path / "judged" / "eval.md").read_text()
    assert f"notice: near tie: prompt {tie_pid!r}: the completion leaves the golden completion at completion token " \
           f"{k_tie}" in out and f"(completion tokens after {k_tie} not compared)" in out, out
    props = {p.get("name"): p.get("value") for p in ET.parse(junit).getroot().iter("property")}
    assert int(props["dflash_eval.near_ties"]) == len(data["near_ties"]) >= 1, props
    assert json.loads(tie_file.read_text()) == tie_edit

    again = bundled_suite(*common, "--snapshot-update", report="rerecord", cache=cache)
    assert again.ret == 0, again.stdout.str()
    assert json.loads(tie_file.read_text()) == tie_edit  # a near tie does not rewrite the golden record
    assert json.loads(conf_file.read_text()) == conf_golden  # a confident change does


def _top(ids: list[int], logits: list[float]) -> TopTokens:
    return TopTokens(tuple(ids), tuple(logits))


def test_the_rule_by_margin_band_and_rank() -> None:
    """The judgement of one parting: the margin is how far the less favoured of the two tokens lies below the
    target's best; a token outside the kept best ones is never a near tie."""
    top = _top([7, 9, 3, 4], [10.0, 9.97, 9.5, 2.0])
    d = judge("p", "golden", 5, 20, 9, 7, top, torch.bfloat16)
    assert d.near_tie and d.margin == pytest.approx(0.03) and d.band == near_tie_band("bfloat16") == 0.25
    assert not judge("p", "golden", 5, 20, 9, 7, top, torch.float32).near_tie  # 0.03 > the fp32 band 1e-3
    far = judge("p", "golden", 5, 20, 3, 9, top, "bfloat16")  # both below the best: the lower one counts
    assert not far.near_tie and far.margin == pytest.approx(0.5)
    out = judge("p", "golden", 5, 20, 11, 7, top, "bfloat16")  # 11 is not among the best four
    assert not out.near_tie and out.margin is None and "outside the target's 8 best" in out.margin_text
    flat = _top([1, 2, 3, 4], [1.0, 1.0, 1.0, 1.0])  # even within a flat top, an unseen token is not judged a tie
    assert not judge("p", "golden", 0, 1, 9, 1, flat, "bfloat16").near_tie
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None and first_divergence([1, 2], [1, 5]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def test_a_comparison_pins_the_golden_record_only_at_a_near_tie() -> None:
    run = {"prompt_id": "p", "prompt_ids": [1], "output_ids": [2, 3], "text": "x"}
    golden = {**run, "output_ids": [2, 4]}
    tie = judge("p", "golden", 1, 2, 4, 3, _top([3, 4], [5.0, 4.99]), "bfloat16")
    assert GoldenComparison("p", "near_tie", golden, run, divergence=tie).pinned == golden
    conf = judge("p", "golden", 1, 2, 4, 3, _top([3, 4], [5.0, 2.0]), "bfloat16")
    changed = GoldenComparison("p", "changed", golden, run, divergence=conf)
    assert changed.pinned == run and not changed.passed and "margin there 3" in changed.message


@pytest.mark.parametrize(("content", "says"), [("{", "not valid JSON"), ('{"prompt_id": "p"}', "not a golden "
                                                                                                "completion record"),
                                               ('{"prompt_id": "p", "prompt_ids": [1], "output_ids": ["a"], '
                                                '"text": ""}', "token ids")])
def test_a_broken_golden_record_is_named(tmp_path: Path, content: str, says: str) -> None:
    from dflash_eval.errors import ConfigError

    path = tmp_path / "test_reference_completion[p].json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=says) as err:
        read_golden(path)
    assert str(path) in str(err.value)
    assert read_golden(tmp_path / "absent.json") is None


def test_the_verdict_names_golden_near_ties_first_and_groups_the_teacher_forced_ones() -> None:
    """Near ties are a part of the run's verdict that only notices: named in every writer's verdict, never a
    failure."""
    from result_rows import fragment

    from dflash_eval.metrics.verdict import NEAR_TIES, run_verdict
    from dflash_eval.report import merge
    from dflash_eval.report.summary import verdict_lines

    def tie(pid: str, against: str, k: int) -> dict[str, Any]:
        return judge(pid, against, k, k + 10, 1, 2, _top([2, 1], [9.0, 9.0]), "bfloat16").to_dict()

    ties = [tie(f"p{i}", "teacher-forced", i) for i in range(6)] + [tie("z", "golden", 7)]
    merged = merge([fragment(near_ties=ties)]).to_dict()
    verdict = run_verdict(RunResult.from_dict(merged))
    part = verdict.part(NEAR_TIES)
    assert part is not None and part.passed is None and not verdict.reasons
    lines = verdict_lines(RunResult.from_dict({**merged, "verdict": verdict.to_dict()}), report_dir=None)
    assert "1 golden completion at a near tie, 6 teacher-forced near ties of the target, not failures" in lines[0]
    notices = [line for line in lines if line.startswith("notice: near tie: ")]
    assert notices[0].startswith("notice: near tie: prompt 'z': the completion leaves the golden completion at "
                                 "completion token 7")
    assert notices[1].startswith("notice: near tie: 6 completions leave their teacher-forced argmax")
    assert "p0 token 0" in notices[1] and "and 2 more (eval.md lists them)" in notices[1] and len(notices) == 2
