"""Per-position acceptance rates and histograms (dflash_eval.metrics.acceptance_rates), their tables in the reports, and
the multi-turn tables rebuilt when merging."""

from __future__ import annotations

import json
import math
import random

import pytest
from result_rows import fragment, prompt_row

from dflash_eval import report
from dflash_eval.metrics.acceptance_rates import acceptance_table, histogram, pool, position_rates
from dflash_eval.metrics.stats import category_table
from dflash_eval.metrics.tau_result import TauResult
from dflash_eval.report.table_rows import acceptance_rows, conversation_rows
from dflash_eval.session.rows import PromptRow, rows_from_dict
from dflash_eval.session.run_result import RunResult


def test_rates_by_hand() -> None:
    # lengths 1, 3, 4, 4 with B = 4: slot 1 accepted in 3 of 4 rounds, slot 2 in 3, slot 3 in 2
    h = histogram([1, 3, 4, 4], 4)
    assert h == [1, 0, 1, 2] and h == TauResult([1, 3, 4, 4], 4).histogram
    assert position_rates(h) == [0.75, 0.75, 0.5]
    assert all(math.isnan(r) for r in position_rates([0, 0, 0]))
    assert pool([[1, 2], [0, 1, 5]]) == [1, 3, 5]


def test_rates_sum_to_tau_and_never_increase() -> None:
    rng = random.Random(0)
    for _ in range(50):
        b = rng.choice([4, 8, 16])
        lens = [rng.randint(1, b) for _ in range(rng.randint(1, 40))]
        rates = position_rates(histogram(lens, b))
        assert 1 + sum(rates) == pytest.approx(sum(lens) / len(lens))
        assert all(x >= y for x, y in zip(rates, rates[1:]))


def rows() -> dict[str, dict]:
    return {
        "a": {"category": "code", "tau": 2.0, "histogram": [1, 1, 1], "rounds": 3},
        "b": {"category": "chat", "tau": 2.5, "histogram": [0, 1, 1], "rounds": 2, "conversation": "c", "turn": 1,
              "server_histogram": [0, 2, 0], "online": {"histogram": [0, 1, 1]}},
        "c2": {"category": "chat", "tau": 1.0, "histogram": [4, 0, 0], "rounds": 4, "conversation": "c", "turn": 2},
    }


def test_acceptance_table_pools_rounds_per_category_and_source() -> None:
    t = acceptance_table(typed_rows())
    assert t["all"]["chain"]["histogram"] == [5, 2, 2] and t["all"]["chain"]["rounds"] == 9
    assert t["all"]["chain"]["position_rates"] == pytest.approx([4 / 9, 2 / 9])
    assert t["all"]["chain"]["tau"] == pytest.approx((5 + 4 + 6) / 9)
    assert list(t["chat"]) == ["chain", "online", "server"] and list(t["code"]) == ["chain"]
    assert t["chat"]["server"]["position_rates"] == [1.0, 0.0]
    assert category_table(typed_rows())["chat"]["acceptance"] == t["chat"]


def whole_rows() -> dict[str, dict]:
    """:func:`rows` as whole prompt rows (the reports read them as typed rows)."""
    out = {p: prompt_row(**r) for p, r in rows().items()}
    out["b"]["online"] = {"rounds": 2, "tau": 2.5, "histogram": [0, 1, 1], "position_rates": [1.0, 0.5],
                          "accept_lengths": [2, 3], "tokens": 5, "matches_reference": True, "first_divergence": None}
    return out


def typed_rows() -> dict[str, PromptRow]:
    """:func:`whole_rows` as the typed rows the statistics read."""
    return rows_from_dict(PromptRow, whole_rows())


def test_report_tables_side_by_side_and_merge_rebuilds_conversations(tmp_path) -> None:
    data = report.merge([fragment(prompts=whole_rows(), mean_tau=2.0, mean_floor=None, mean_ddtree={},
                                  mean_ddtree_floor={})]).to_dict()
    assert data["conversations"]["c"]["turns"] == ["b", "c2"] and data["conversations"]["c"]["rounds"] == 6
    assert data["conversations"]["c"]["turn_tau"] == [2.5, 1.0] and data["turns"]["2"]["chain"]["n"] == 1
    header, arows = acceptance_rows(RunResult.from_dict(data))
    assert header[4].startswith("slot k accepted")
    assert ["b", "server", "2", "2.000", "100 0", "0 100 0"] in arows
    assert ["all prompts", "chain", "9", "1.667", "44 22", "56 22 22"] in arows
    assert [r[:2] for r in arows if r[0] == "category chat"] == [["category chat", s] for s in
                                                                 ("chain", "online", "server")]
    _, crows = conversation_rows(RunResult.from_dict(data))
    assert crows[0][:2] == ["c", "chat"] and crows[0][2] == "2.500 / 1.000"
    md = report.render_markdown(RunResult.from_dict(data))
    assert "### Acceptance per draft position" in md and "### Multi-turn conversations" in md
    assert "acceptance per draft position" in report.render_terminal(RunResult.from_dict(data))
    paths = report.write_reports(RunResult.from_dict(data), tmp_path)
    assert json.loads(paths["json"].read_text())["categories"]["all"]["acceptance"]["server"]["rounds"] == 2
    assert paths["png"].stat().st_size > 0
