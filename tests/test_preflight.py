"""Bad input answers before the heavy imports: option values, paths and prompt files are checked without torch or
transformers (:mod:`dflash_eval.options.preflight`), by ``dflash-eval run``, plain ``pytest --pyargs
dflash_eval.tests_eval`` and ``dflash-eval gate``, with the usual exit codes (4 under pytest, 2 for the gate) and one
message naming the option and the file. Each case runs in a fresh interpreter from a folder that is not a checkout, and
asserts that neither torch nor transformers was imported when the message came (``benchmarks/bench_bad_input.py`` times
it).

Run: ``pytest tests/test_preflight.py -p no:cacheprovider -n 0``
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_eval.common.dtypes import check_dtype_name
from dflash_eval.errors import ConfigError
from dflash_eval.options.preflight import preflight
from dflash_eval.options.settings import resolve

ROOT = Path(__file__).resolve().parents[1]
TARGET, DRAFTER = ROOT / "fixtures" / "target", ROOT / "fixtures" / "drafter"
# The command runs in this interpreter; the last line says which heavy modules it had imported by then.
PROBE = ("import sys\nfrom dflash_eval.cli.main import main\nrc = main(sys.argv[1:])\n"
         "print('HEAVY', sorted(m for m in ('torch', 'transformers') if m in sys.modules))\nsys.exit(rc)\n")
PYTEST_PROBE = ("import sys, pytest\nrc = pytest.main(sys.argv[1:])\n"
                "print('HEAVY', sorted(m for m in ('torch', 'transformers') if m in sys.modules))\nsys.exit(rc)\n")


def _run(code: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DFLASH_EVAL_")}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "bad.jsonl").write_text('{"id": "a", "category": "c", "text": "x"}\n{"id": "b", "text": \n')
    (tmp_path / "floors.json").write_text('{"chain": [1, 2')
    return tmp_path


RUN_CASES = [  # (extra arguments, what the one message says)
    (["--dtype", "fp33"], "--dtype: unknown dtype 'fp33'; choose one of auto, bf16, fp16, fp32"),
    (["--target-model", "models/missing"], "--target-model {work}/models/missing: not found"),
    # the file named once, json's position words not doubled
    (["--prompts", "bad.jsonl"], "--prompts: {work}/bad.jsonl:2: not valid JSON (Expecting value at column 20)"),
    (["--prompts", "humaneval:0"], "prompt set 'humaneval:0': the count must be >= 1"),
    (["--floors-file", "floors.json"], "--floors-file {work}/floors.json: malformed τ floors file"),
    (["--chat-template", "maybe"], "--chat-template: unknown value 'maybe'; choose one of auto, on, off"),
    (["--device", "cuda:x"], "--device: invalid device 'cuda:x'"),
]


@pytest.mark.parametrize("extra,message", RUN_CASES, ids=[c[0][0] + "=" + c[0][1] for c in RUN_CASES])
def test_dflash_eval_run_answers_before_torch(work, extra, message):
    args = ["run", "-p", "no:cacheprovider", "--target-model", str(TARGET), "--drafter", str(DRAFTER), *extra]
    p = _run(PROBE, args, work)
    assert p.returncode == 4, p.stdout + p.stderr
    assert message.format(work=work) in p.stderr, p.stderr
    assert p.stderr.count("ERROR:") == 1 and "collected" not in p.stdout and " at at " not in p.stderr
    assert p.stderr.count(f"{work}/bad.jsonl") <= 1
    assert p.stdout.strip().splitlines()[-1] == "HEAVY []", p.stdout


def test_plain_pytest_with_a_missing_target_answers_before_torch(work):
    p = _run(PYTEST_PROBE, ["--pyargs", "dflash_eval.tests_eval", "-p", "no:cacheprovider", "--target-model=missing",
                            f"--drafter={DRAFTER}"], work)
    assert p.returncode == 4, p.stdout + p.stderr
    assert f"--target-model {work}/missing: not found" in p.stderr
    assert p.stdout.strip().splitlines()[-1] == "HEAVY []", p.stdout


def test_xdist_run_answers_before_its_workers_start(work):
    p = _run(PROBE, ["run", "-p", "no:cacheprovider", "-n", "2", "--target-model", "missing", "--drafter",
                     str(DRAFTER)], work)
    assert p.returncode == 4 and f"--target-model {work}/missing: not found" in p.stderr, p.stdout + p.stderr
    assert "created: 2/2 workers" not in p.stdout and p.stdout.strip().splitlines()[-1] == "HEAVY []"


def test_gate_answers_before_torch(work):
    p = _run(PROBE, ["gate", "--drafter", str(DRAFTER), "--target-model", str(TARGET), "--prompts", "bad.jsonl",
                     "--dtype", "fp16"], work)
    assert p.returncode == 2 and "bad.jsonl:2: not valid JSON" in p.stderr, p.stdout + p.stderr
    assert p.stdout.strip().splitlines()[-1] == "HEAVY []", p.stdout
    p = _run(PROBE, ["gate", "--drafter", str(DRAFTER), "--target-model", str(TARGET), "--dtype", "fp33"], work)
    assert p.returncode == 2 and "choose one of auto, bf16, fp16, fp32" in p.stderr, p.stdout + p.stderr
    assert p.stdout.strip().splitlines()[-1] == "HEAVY []", p.stdout


def test_every_problem_of_the_inputs_in_one_message(tmp_path):
    given = {"target_model": "nowhere", "drafter": "nothing", "prompts": "humaneval:0", "baseline": "old.json"}
    s = resolve(given.get, environ={}, invocation_dir=tmp_path, root=tmp_path, check=False)
    with pytest.raises(ConfigError) as err:
        preflight(s)
    msg = str(err.value)
    assert msg.startswith("unusable inputs:") and msg.count("\n  ") == 4, msg
    for part in (f"--target-model {tmp_path}/nowhere: not found", f"--drafter {tmp_path}/nothing: not found",
                 f"--baseline {tmp_path}/old.json: not found", "--prompts humaneval:0"):
        assert part in msg
    s = resolve({"target_model": str(TARGET), "drafter": str(DRAFTER), "prompts": str(ROOT / "fixtures" /
                 "prompts.jsonl")}.get, environ={}, invocation_dir=tmp_path, root=tmp_path, check=False)
    preflight(s)  # good inputs pass


def test_target_config_that_is_not_json_is_named(tmp_path):
    target = tmp_path / "t"
    target.mkdir()
    (target / "config.json").write_text(json.dumps([1, 2]))
    s = resolve({"target_model": str(target), "drafter": str(DRAFTER)}.get, environ={}, invocation_dir=tmp_path,
                root=tmp_path, check=False)
    with pytest.raises(ConfigError, match=rf"--target-model {target}/config.json: not a JSON object"):
        preflight(s)


def test_dtype_names_list_every_choice():
    check_dtype_name("auto")
    check_dtype_name("bfloat16")
    with pytest.raises(ConfigError, match=r"^--dtype: unknown dtype 'fp8'; choose one of auto, bf16, fp16, fp32 "
                                          r"\(also accepted: bfloat16, float, float16, float32, half\)$"):
        check_dtype_name("fp8", flag="--dtype")
    with pytest.raises(ConfigError, match="choose one of bf16, fp16, fp32 "):
        check_dtype_name("auto", allow_auto=False)
