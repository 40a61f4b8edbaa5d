"""Which golden records a run needs and does not have: τ floors for the prompts its τ tests (or ``dflash-eval gate``)
judge, snapshots of the reference completions its ``test_reference_completion`` tests compare, and the one message
that names what is missing and the command that records it.

A first run on a new model has nothing to gate against. The suite's plugin
(:mod:`dflash_eval.pytest_plugin.golden_check`) and ``dflash-eval gate`` ask :func:`missing_records` /
:func:`missing_floors` before any test or evaluation, and report a shortfall once (:func:`missing_message`).
Nothing is needed where the run records (``--update-tau-floors``, ``--snapshot-update``) or gates on explicit
thresholds (``--tau-floor``, ``--tau-floor-prompt``); the floors are the ones the run would judge with (its floors
file after the file's recorded settings were checked against the run). The golden feature fingerprint is not
required: its test skips naming the command that records it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from dflash_eval.golden.node_ids import safe_id

if TYPE_CHECKING:
    from dflash_eval.metrics.floors import Floors
    from dflash_eval.session.eval_session import EvalSession

__all__ = ["Missing", "missing_records", "missing_floors", "snapshot_path", "missing_message", "gate_floors_message"]

FLOOR_TESTS = ("test_tau", "test_ddtree_tau", "test_mean_tau", "test_category_mean_tau")
SNAPSHOT_TEST, SNAPSHOT_MODULE = "test_reference_completion", "test_reference_completions"
_DDTREE_ID = re.compile(r"^(?P<prompt>.*)-ddtree(?P<budget>\d+)$")


@dataclass
class Missing:
    """What the selected tests need and the golden folder lacks."""

    floors_file: Path | None = None
    floors_exists: bool = False
    floors: dict[str, list[str]] = field(default_factory=dict)  # "chain" / "DDTree-N" -> prompt ids without a floor
    snapshot_dir: Path | None = None
    snapshots: list[str] = field(default_factory=list)  # prompt ids without a snapshot
    prompts: int = 0
    profile: str = ""  # the run's records profile (EvalSettings.records_profile): "" for float32 / torch

    def __bool__(self) -> bool:
        return bool(self.floors or self.snapshots)


def snapshot_path(golden_dir: Path, target_name: str, test_name: str) -> Path:
    """The file syrupy reads for ``test_reference_completion[...]`` (the suite's snapshot extension)."""
    from dflash_eval.golden.writer import golden_extension  # imports torch: kept out of pytest --help

    ext = golden_extension(Path(golden_dir), target_name)
    folder = Path(golden_dir) / "snapshots" / (target_name or "target") / SNAPSHOT_MODULE
    try:  # syrupy's own file name (it cleans characters a file name cannot hold)
        location = SimpleNamespace(snapshot_name=test_name)  # a PyTestLocation needs a collected pytest item
        stem = ext.get_snapshot_name(test_location=location, index=0)  # type: ignore[arg-type]  # reads snapshot_name
    except Exception:  # noqa: BLE001 - another syrupy: the test name as it is
        stem = test_name
    return folder / f"{stem}.{ext.file_extension}"


def _split(nodeid: str) -> tuple[str, str, str | None]:
    """(module file name, test function, parameter id or None) of a node id."""
    path, _, name = nodeid.partition("::")
    func, bracket, param = name.rpartition("::")[-1].partition("[")
    return Path(path).name, func, param[:-1] if bracket else None


def _lacking(floors: Floors, pids: Iterable[str], budgets: Iterable[int | None], into: dict[str, set[str]]) -> None:
    """Add to ``into`` ("chain" / "DDTree-N" -> ids) the prompts of ``pids`` without a floor for each budget."""
    for budget in budgets:
        label = "chain" if budget is None else f"DDTree-{budget}"
        for pid in pids:
            if floors.for_prompt(pid, budget) is None:
                into.setdefault(label, set()).add(pid)


def _missing(session: EvalSession) -> tuple[Missing, bool]:
    """An empty :class:`Missing` for this run, and whether the run judges τ against per-prompt floors at all."""
    s, prompts = session.settings, session.inputs.prompts
    out = Missing(floors_file=Path(s.floors_file), floors_exists=Path(s.floors_file).is_file(),
                  snapshot_dir=snapshot_path(s.golden_dir, s.snapshot_folder, "x").parent, prompts=len(prompts),
                  profile=s.records_profile)
    return out, not s.update_tau_floors and not session.floors.explicit


def _sorted(session: EvalSession, lacking: dict[str, set[str]]) -> dict[str, list[str]]:
    order = {p.id: i for i, p in enumerate(session.inputs.prompts)}
    return {k: sorted(v, key=lambda x: order.get(x, len(order))) for k, v in sorted(lacking.items())}


def missing_floors(session: EvalSession) -> Missing:
    """The floors a judgement of every prompt (chain and each DDTree budget, as ``dflash-eval gate`` makes) lacks."""
    out, want = _missing(session)
    lacking: dict[str, set[str]] = {}
    if want:
        _lacking(session.floors, [p.id for p in session.inputs.prompts], [None, *session.settings.ddtree_budget],
                 lacking)
    out.floors = _sorted(session, lacking)
    return out


def missing_records(session: EvalSession, nodeids: Iterable[str], *, updates_snapshots: bool) -> Missing:
    """What the suite's tests ``nodeids`` need (floors for the τ tests, snapshots for the completion tests) and is
    absent; ``updates_snapshots``: the run writes the snapshots (``--snapshot-update``)."""
    s, floors, prompts = session.settings, session.floors, session.inputs.prompts
    every = [None, *s.ddtree_budget]
    by_category: dict[str, list[str]] = {}
    for p in prompts:
        by_category.setdefault(safe_id(p.category), []).append(p.id)
    out, want_floors = _missing(session)
    lacking: dict[str, set[str]] = {}
    for nodeid in nodeids:
        module, func, param = _split(nodeid)
        if param == "setup-error":
            continue
        if want_floors and module == "test_tau.py" and func in FLOOR_TESTS:
            if func == "test_tau" and param is not None:
                _lacking(floors, [param], [None], lacking)
            elif func == "test_ddtree_tau" and param is not None and (m := _DDTREE_ID.match(param)):
                _lacking(floors, [m["prompt"]], [int(m["budget"])], lacking)
            elif func == "test_mean_tau":
                _lacking(floors, [p.id for p in prompts], every, lacking)
            elif func == "test_category_mean_tau":
                _lacking(floors, by_category.get(param or "", []), every, lacking)
        elif not updates_snapshots and module == f"{SNAPSHOT_MODULE}.py" and func == SNAPSHOT_TEST and param:
            if not snapshot_path(s.golden_dir, s.snapshot_folder, f"{func}[{param}]").is_file():
                out.snapshots.append(param)
    out.floors = _sorted(session, lacking)
    return out


def _ids(ids: list[str]) -> str:
    return ", ".join(ids[:4]) + (f", ... ({len(ids)} in all)" if len(ids) > 4 else "")


def missing_message(missing: Missing, target_name: str, command: str) -> str:
    """The one message of a run that lacks golden records: what is missing, and the command that records it."""
    lines = [f"nothing recorded to gate this run against (target {target_name!r}, {missing.prompts} prompts):"]
    if missing.floors and not missing.floors_exists:
        lines.append(f"  τ floors: {missing.floors_file} does not exist")
    elif missing.floors:
        lines += [f"  τ floors: {missing.floors_file} has no {label} floor for {len(ids)} of {missing.prompts} "
                  f"prompts ({_ids(ids)})" for label, ids in missing.floors.items()]
    if missing.snapshots:
        lines.append(f"  reference completions: no snapshot in {missing.snapshot_dir} for {len(missing.snapshots)} "
                     f"of {missing.prompts} prompts ({_ids(missing.snapshots)})")
    if missing.profile:
        lines.append(f"  (golden records are kept per dtype and backend; this run's are {missing.profile}: the "
                     "float32 / torch ones at the golden folder's top apply to --dtype fp32 "
                     "--hidden-state-backend torch)")
    lines += ["record them once (τ minus --tau-margin as floors, the completions as snapshots, the feature "
              "fingerprint) with:", f"  {command}",
              "then run this again; or gate on explicit thresholds instead: --tau-floor VALUE (the mean τ) / "
              "--tau-floor-prompt VALUE (every prompt)"]
    return "\n".join(lines)


def gate_floors_message(missing: Missing, command: str) -> str:
    """``dflash-eval gate`` without floors for its prompts: the floors file it looked for, and how to record it."""
    where = (f"{missing.floors_file} does not exist" if not missing.floors_exists else
             "; ".join(f"{missing.floors_file} has no {label} floor for {len(ids)} of {missing.prompts} prompts "
                       f"({_ids(ids)})" for label, ids in missing.floors.items()))
    return (f"no τ floors to gate against: {where} (--floors-file; default golden/tau_floors.json in the current "
            f"folder)\nrecord them once from the checkpoint whose τ sets the bar:\n  {command}\nor give explicit "
            "thresholds: --tau-floor VALUE (the mean τ) / --tau-floor-prompt VALUE (every prompt)")
