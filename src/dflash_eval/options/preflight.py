"""The checks of a run's option values and input files that need neither torch nor transformers.

Bad input (a path that does not exist, an invalid option value, a prompt file with a bad line, ``humaneval:0``, a
malformed floors file, a cache, report or golden folder the run cannot write: :func:`output_problems`) is answered by
these checks in about a second, before the heavy imports: torch and transformers take 5-60 s on a loaded 2-core machine
(``python benchmarks/bench_bad_input.py`` measures both paths). The pytest plugin runs :func:`preflight` at session
start (before collection, and before pytest-xdist starts its workers); ``dflash-eval gate`` and ``dflash-eval record``
run it before anything else. The checks that need torch follow
(:meth:`dflash_eval.options.settings.EvalSettings.validate`: the device and backends on this machine;
:meth:`dflash_eval.session.eval_session.EvalSession.check_inputs`: tokenizer files, the drafter's config, floors and
baseline against the run's settings).

Example (the options resolved without the torch checks, as the plugin does)::

    from pathlib import Path
    from dflash_eval.options.settings import resolve
    from dflash_eval.options.preflight import preflight
    given = {"target_model": "models/x", "drafter": "ckpt/step_5000"}
    preflight(resolve(given.get, environ={}, invocation_dir=Path.cwd(), root=Path.cwd(), check=False))
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dflash_eval.common.paths import MIN_FREE_BYTES, folder_problem
from dflash_eval.errors import ConfigError
from dflash_eval.metrics.floors import load_floors
from dflash_eval.prompts import load_prompt_spec

if TYPE_CHECKING:
    from dflash_eval.options.settings import EvalSettings
    from dflash_eval.prompts import Prompt

__all__ = ["preflight", "input_problems", "output_problems", "target_config_problem"]


def target_config_problem(settings: EvalSettings) -> str | None:
    """What is wrong with ``--target-model``'s config.json (absent, unreadable, not a JSON object), or None."""
    d = settings.target_model
    cfg = d / "config.json"
    if not cfg.is_file():
        return f"--target-model {d}: " + ("no config.json (not a transformers model directory)" if d.is_dir()
                                          else "not found")
    if not os.access(cfg, os.R_OK):
        return f"--target-model {cfg}: not readable"
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        return f"--target-model {cfg}: not valid JSON ({exc})"
    except (OSError, UnicodeDecodeError) as exc:
        return f"--target-model {cfg}: cannot read ({exc})"
    if not isinstance(data, dict):
        return f"--target-model {cfg}: not a JSON object"
    return None


def output_problems(settings: EvalSettings, *, snapshot_update: bool = False) -> list[str]:
    """Every folder the run will write that it cannot, one line each naming the option, the folder and the cause
    (:func:`dflash_eval.common.paths.folder_problem`: a regular file in its place or on its way, not writable, less
    than :data:`~dflash_eval.common.paths.MIN_FREE_BYTES` free): ``--cache-dir`` (under ``--cache-only`` it is only
    read: then only a file in its place is a problem), ``--report-dir``, and the golden records the run rewrites
    (``--update-tau-floors``: the floors file's folder; ``--update-fingerprints`` or ``snapshot_update``, syrupy's
    ``--snapshot-update``: ``--golden-dir``)."""
    s = settings
    problems: list[str] = []
    folders: list[tuple[str, Path, str]] = []
    if not s.cache_only:
        folders.append(("--cache-dir", s.cache_dir, ""))
    elif s.cache_dir.exists() and not s.cache_dir.is_dir():
        problems.append(f"--cache-dir {s.cache_dir}: is a regular file, not a folder")
    folders.append(("--report-dir", s.report_dir, ""))
    if s.update_tau_floors:
        folders.append(("--floors-file", s.floors_file.parent, f" (the folder of {s.floors_file.name})"))
    if s.update_fingerprints or snapshot_update:
        folders.append(("--golden-dir", s.golden_dir, ""))
    for option, folder, which in folders:
        why = folder_problem(folder, min_free=MIN_FREE_BYTES)
        if why is not None:
            problems.append(f"{option} {folder}{which}: {why}")
    return problems


def _load_prompts(settings: EvalSettings) -> list[Prompt]:
    return load_prompt_spec(settings.prompts, limit=settings.num_prompts, data_dir=settings.prompt_data_dir,
                            humaneval_wrapper=settings.humaneval_wrapper)


def input_problems(settings: EvalSettings, *, target_check: Callable[[EvalSettings], str | None] | None = None,
                   load_prompts: Callable[[], Any] | None = None,
                   baseline_check: Callable[[Path], str | None] | None = None) -> list[str]:
    """Every problem of the input paths and files, one line each naming the option and the file: the target's
    config.json (``target_check``, default :func:`target_config_problem`), the drafter paths, ``--baseline``
    (``baseline_check``: what is wrong with the file, naming ``--baseline``, the file and the key, as
    :func:`dflash_eval.session.baseline_file.baseline_problem` reads it through the run's typed result; this layer
    cannot: without it only whether the file exists), the floors file's JSON and the prompt spec (``load_prompts``,
    default: read it; JSONL errors name the line)."""
    s = settings
    problems = []
    target = (target_check or target_config_problem)(s)
    if target:
        problems.append(target)
    if not s.drafter.exists():
        problems.append(f"--drafter {s.drafter}: not found (a drafter directory or a .pt file)")
    for name in ("drafter_config", "reference_drafter"):
        v = getattr(s, name)
        if v is not None and not v.exists():
            problems.append(f"--{name.replace('_', '-')} {v}: not found")
    if s.baseline is not None:
        bad = (baseline_check or _baseline_exists)(Path(s.baseline))  # its messages name --baseline and the file
        if bad:
            problems.append(bad)
    try:
        load_floors(s.floors_file)  # an absent file is no error here; a malformed one names the file
    except ConfigError as exc:
        problems.append(f"--floors-file {exc}")
    try:
        (load_prompts or (lambda: _load_prompts(s)))()
    except ConfigError as exc:  # a message that names its file already is not prefixed with it a second time
        named = any(str(exc).startswith(part.strip()) for part in str(s.prompts).split(",") if part.strip())
        problems.append(f"--prompts: {exc}" if named else f"--prompts {s.prompts}: {exc}")
    return problems


def _baseline_exists(path: Path) -> str | None:
    return None if path.is_file() else f"--baseline {path}: not found (an earlier reports/eval.json)"


def preflight(settings: EvalSettings, *, snapshot_update: bool = False,
              baseline_check: Callable[[Path], str | None] | None = None) -> None:
    """The option values (:meth:`~dflash_eval.options.settings.EvalSettings.validate_values`), then every input problem
    (:func:`input_problems`, ``baseline_check`` its check of ``--baseline``) and every folder the run cannot write
    (:func:`output_problems`; ``snapshot_update``: the run rewrites the golden snapshots) at once; ConfigError,
    without importing torch. Run once at the start of a run (the plugin's controller, ``dflash-eval gate``): a folder
    that fills up later is the write's own error."""
    settings.validate_values()
    problems = (input_problems(settings, baseline_check=baseline_check)
                + output_problems(settings, snapshot_update=snapshot_update))
    if problems:
        raise ConfigError("unusable inputs:\n  " + "\n  ".join(problems))
