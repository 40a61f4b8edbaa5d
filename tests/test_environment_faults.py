"""Hostile environments get one error naming the path and the cause, and the run fails for that reason:

- a cache, report or golden folder the run cannot write (a regular file in its place or on its way, a read-only file
  system, no write permission, too little free space) is one usage error before any work (exit 4 under pytest),
  from the operating system's own answer (a file created, written and removed there);
- a cache entry that cannot be written mid-run (no space left, a read-only file system) is one StorageError naming
  the entry's folder, nothing of the entry is left, and the run stops at the first test it fails;
- reports that cannot be written fail the run (non-zero exit), naming the file, and leave no earlier run's report
  beside them;
- drafter weights holding NaN or infinite values are refused by an architecture check naming each tensor;
- τ of about 1 on every prompt (a random drafter: one lucky token per completion) is one diagnosis;
- a pickled ``.pt`` is refused saying what to do, without PyTorch's advice to load it anyway.

Real faults where the machine allows them: a read-only or tiny tmpfs (``mount -t tmpfs``, as root; skipped with the
reason otherwise), a folder without write permission for an unprivileged user (a forked child that dropped root,
since root writes past permission bits). Faults no machine produces on demand (a disk filling between two writes)
are injected by patching the operating system's functions (``os.fdopen``, ``os.rename``, ``os.replace``,
``tempfile.mkdtemp``) as the project's modules call them.

Run: ``pytest tests/test_environment_faults.py -n 0 -p no:randomly``
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from dflash_eval.common.atomic import atomic_write_text
from dflash_eval.common.paths import folder_problem
from dflash_eval.errors import CheckpointError, DrafterRefused, StorageError
from dflash_eval.options.preflight import output_problems
from dflash_eval.options.settings import resolve

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
NOBODY = 65534


@contextmanager
def tmpfs(where: Path, *options: str) -> Iterator[Path]:
    """A tmpfs mounted at ``where`` with ``options`` (e.g. ``size=1m``, ``ro``); skips when it cannot be mounted."""
    where.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root and mount(8): a real full or read-only file system not tried")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(where)],
                          capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}): a real full or read-only file system not "
                    "tried")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30, check=False)


def fill(folder: Path) -> None:
    """Write into ``folder`` until its file system has no space left."""
    with open(folder / "filler", "wb", buffering=0) as fh:
        for chunk in (1 << 20, 4096, 1):
            try:
                while True:
                    fh.write(b"\0" * chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc


def as_nobody(fn: Callable[[], str | None]) -> str | None:
    """``fn()`` in a forked child that dropped root (uid and gid 65534): permission bits then hold."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no return, no pytest machinery
        code = 0
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os.write(w, json.dumps(fn()).encode())
        except BaseException:  # noqa: BLE001 - reported through the exit status
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    ready, _, _ = select.select([r], [], [], 60.0)
    if not ready:  # a child that hangs is killed: every wait has a timeout
        os.kill(pid, signal.SIGKILL)
    with os.fdopen(r, "rb") as fh:
        out = fh.read() if ready else b""
    _, status = os.waitpid(pid, 0)
    assert ready and os.waitstatus_to_exitcode(status) == 0, "the unprivileged child failed or hung"
    return json.loads(out)


def settings(tmp_path: Path, **given: Any) -> Any:
    """The run's settings (values parsed, torch checks skipped) with the bundled fixtures and ``given``."""
    values = {"target_model": FIXTURES / "target", "drafter": FIXTURES / "drafter",
              "prompts": FIXTURES / "prompts.jsonl", "cache_dir": tmp_path / "cache",
              "report_dir": tmp_path / "reports", **given}
    return resolve(values.get, environ={}, invocation_dir=tmp_path, root=ROOT, check=False)


# ------------------------------------------------------------------------------------------------ unusable folders
def test_a_regular_file_in_the_folders_place_or_on_its_way(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    assert folder_problem(tmp_path / "file") == "is a regular file, not a folder"
    assert folder_problem(tmp_path / "file" / "a" / "b") == (
        f"{tmp_path / 'file'} is a regular file, so no folder can be made under it")
    assert folder_problem(tmp_path / "new" / "deeper") is None  # made on first write
    assert not (tmp_path / "new").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # no trace


def test_a_read_only_file_system(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", "ro", "size=1m") as ro:
        assert folder_problem(ro) == "cannot be written: read-only file system (EROFS)"
        assert folder_problem(ro / "cache") == (f"cannot be written (in {ro}, where it would be made): read-only file "
                                                "system (EROFS)")


def test_a_full_file_system(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "size=1m") as small:
        why = folder_problem(small / "reports")
        assert why is not None and why.startswith("only 1.0 MiB free on its file system") and "64 MiB" in why
        fill(small)
        assert folder_problem(small, min_free=0) == "cannot be written: no space left on the device (ENOSPC)"


def test_a_folder_without_write_permission(tmp_path: Path) -> None:
    base = Path(tempfile.mkdtemp(prefix="dflash-eval-perm-"))  # /tmp: reachable by an unprivileged user
    try:
        locked = base / "locked"
        locked.mkdir()
        os.chmod(base, 0o755)
        os.chmod(locked, 0o555)
        if os.geteuid() == 0:
            why = as_nobody(lambda: folder_problem(locked / "cache"))
            assert folder_problem(locked) is None  # root writes past permission bits: so would the run
        else:
            why = folder_problem(locked / "cache")
        assert why == (f"cannot be written (in {locked}, where it would be made): permission denied (this user may "
                       "not write there) (EACCES)")
    finally:
        os.chmod(base / "locked", 0o755)
        shutil.rmtree(base)


def test_output_problems_name_the_option_the_folder_and_the_cause(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    s = settings(tmp_path, cache_dir=tmp_path / "file", report_dir=tmp_path / "file" / "reports")
    assert output_problems(s) == [
        f"--cache-dir {tmp_path / 'file'}: is a regular file, not a folder",
        f"--report-dir {tmp_path / 'file' / 'reports'}: {tmp_path / 'file'} is a regular file, so no folder can be "
        "made under it"]
    golden = settings(tmp_path, golden_dir=tmp_path / "file" / "golden", update_fingerprints=True)
    assert [p.split(":")[0] for p in output_problems(golden)] == [f"--golden-dir {tmp_path / 'file' / 'golden'}"]
    assert output_problems(settings(tmp_path, golden_dir=tmp_path / "file" / "golden")) == []  # only read
    assert output_problems(settings(tmp_path, golden_dir=tmp_path / "file" / "golden"), snapshot_update=True)
    floors = settings(tmp_path, floors_file=tmp_path / "file" / "tau_floors.json", update_tau_floors=True)
    assert output_problems(floors)[0].startswith(f"--floors-file {tmp_path / 'file'} (the folder of tau_floors.json)")


def test_a_read_only_cache_is_fine_under_cache_only(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", "ro", "size=1m") as ro:
        assert output_problems(settings(tmp_path, cache_dir=ro, cache_only=True)) == []
        assert output_problems(settings(tmp_path, cache_dir=ro))[0].startswith(f"--cache-dir {ro}: cannot be written")


def _pytest(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DFLASH_EVAL_", "PYTEST_XDIST_"))}
    return subprocess.run([sys.executable, "-m", "pytest", str(ROOT / "tests_eval"), "-p", "no:cacheprovider",
                           "-p", "no:randomly", "-n", "0", "--num-prompts", "2", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600, check=False)


def test_a_cache_dir_that_is_a_file_is_one_usage_error_before_any_work(tmp_path: Path) -> None:
    (tmp_path / "cache").write_text("not a folder")
    p = _pytest(["--cache-dir", str(tmp_path / "cache"), "--report-dir", str(tmp_path / "reports")], ROOT)
    assert p.returncode == 4, p.stdout + p.stderr
    assert p.stderr.count("ERROR:") == 1 and "collected" not in p.stdout, p.stdout + p.stderr
    assert f"--cache-dir {tmp_path / 'cache'}: is a regular file, not a folder" in p.stderr
    assert (p.stdout + p.stderr).count(str(tmp_path / "cache")) == 1
    assert not (tmp_path / "reports").exists()


# ------------------------------------------------------------------------------------------------ mid-run writes
def _cache(tmp_path: Path) -> Any:
    from dflash_eval.cache.store import Cache

    return Cache(tmp_path / "cache")


def _no_half_entry(cache: Any, kind: str, key: str) -> None:
    assert not cache.entry_dir(kind, key).exists()
    assert not cache.staging.exists() or not list(cache.staging.iterdir())
    assert cache.read(kind, key) is None and cache.productions() == []


def _fdopen_failing_at(n: int, real: Callable[..., Any]) -> Callable[..., Any]:
    """``os.fdopen`` whose ``n``-th file (1: the entry's data, 2: its manifest) writes half, then finds the disk
    full."""
    calls = [0]

    class Full:
        def __init__(self, fh: Any) -> None:
            self.fh = fh

        def __enter__(self) -> Full:
            return self

        def __exit__(self, *exc: object) -> None:
            self.fh.close()

        def write(self, data: bytes) -> int:
            self.fh.write(data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def fdopen(fd: int, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        fh = real(fd, *args, **kwargs)
        return Full(fh) if calls[0] == n else fh

    return fdopen


@pytest.mark.parametrize("where", ["data", "manifest", "folder", "rename"])
def test_a_disk_full_mid_entry_leaves_no_half_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    where: str) -> None:
    cache = _cache(tmp_path)
    kind, key = "features", "ab" * 32
    cache.write(kind, "cd" * 32, {"x": torch.zeros(2)}, fields={})  # the cache's folders exist: a later entry fails
    assert len(cache.productions()) == 1
    (cache.produce_log).unlink()
    if where in ("data", "manifest"):
        monkeypatch.setattr(os, "fdopen", _fdopen_failing_at(1 if where == "data" else 2, os.fdopen))
    elif where == "folder":
        def mkdtemp(*args: Any, **kwargs: Any) -> str:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    else:
        def rename(src: Any, dst: Any) -> None:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS))
        monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(StorageError) as info:
        cache.write(kind, key, {"x": torch.arange(1000.0)}, fields={"a": 1})
    monkeypatch.undo()
    d = cache.entry_dir(kind, key)
    cause = "read-only file system (EROFS)" if where == "rename" else "no space left on the device (ENOSPC)"
    assert str(info.value).startswith(f"cannot write cache entry {d}: {cause}")
    assert "--cache-dir" in str(info.value) and info.value.path == d and isinstance(info.value, OSError)
    _no_half_entry(cache, kind, key)
    assert cache.write(kind, key, {"x": torch.arange(3.0)}, fields={"a": 1}).produced  # space again: written
    assert torch.equal(cache.read(kind, key).tensors["x"], torch.arange(3.0))


def test_an_entry_replaces_what_a_corrupted_one_left(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    d = cache.entry_dir("features", "ef" * 32)
    d.mkdir(parents=True)
    (d / "data.safetensors").write_bytes(b"torn")  # no manifest: no entry
    assert cache.read("features", "ef" * 32) is None
    cache.write("features", "ef" * 32, {"x": torch.ones(2)}, fields={})
    assert torch.equal(cache.read("features", "ef" * 32).tensors["x"], torch.ones(2))
    assert sorted(p.name for p in d.iterdir()) == ["data.safetensors", "manifest.json"]
    assert not list(cache.staging.iterdir())


def test_an_atomic_write_that_fails_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def replace(src: Any, dst: Any) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(StorageError, match=f"^cannot write {tmp_path / 'eval.json'}: read-only file system"):
        atomic_write_text(tmp_path / "eval.json", "{}")
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(StorageError, match="a regular file is where a folder should be|a path component is a"):
        atomic_write_text(tmp_path / "file" / "eval.json", "{}")


def test_the_run_stops_at_the_first_refused_write() -> None:
    from dflash_eval.pytest_plugin.params import SetupError
    from dflash_eval.pytest_plugin.storage_stop import storage_failure

    full = StorageError("cannot write cache entry /c/v1/x: no space left on the device (ENOSPC)", "/c/v1/x",
                        errno.ENOSPC)
    try:
        try:
            raise full
        except StorageError:
            pytest.fail("StorageError: ...", pytrace=False)  # what the suite's fixtures do with it
    except BaseException as exc:  # noqa: BLE001
        failed = exc
    assert storage_failure(failed) == str(full)
    assert storage_failure(OSError(errno.EDQUOT, "Disk quota exceeded")) == "OSError: [Errno 122] Disk quota exceeded"
    assert storage_failure(OSError(errno.ENOENT, "No such file")) is None
    assert storage_failure(ValueError("x")) is None

    class Item:
        class callspec:  # pytest's attribute name
            params = {"prompt_id": SetupError(full)}

    assert storage_failure(ValueError("setup-error"), Item()) == str(full)  # type: ignore[arg-type]


SUITE_ARGS = ("--target-model", str(FIXTURES / "target"), "--drafter", str(FIXTURES / "drafter"), "--prompts",
              str(FIXTURES / "prompts.jsonl"), "--num-prompts", "2", "--max-new-tokens", "16")


class FillAtCollection:
    """A plugin of the run under test: after the preflight checks and collection, the disk fills (``how``: a real
    tmpfs filled up, or ``tempfile.mkdtemp`` finding no space, as a new cache entry's folder is made)."""

    def __init__(self, how: str, folder: Path) -> None:
        self.how, self.folder, self.patch = how, folder, pytest.MonkeyPatch()

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if self.how == "tmpfs":
            fill(self.folder)
            return
        real = tempfile.mkdtemp

        def mkdtemp(*args: Any, **kwargs: Any) -> str:
            if str(kwargs.get("dir", "")).startswith(str(self.folder)):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real(*args, **kwargs)

        self.patch.setattr(tempfile, "mkdtemp", mkdtemp)

    def pytest_sessionfinish(self) -> None:
        self.patch.undo()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["injected", "tmpfs"])
def test_a_disk_that_fills_mid_run_is_one_error(pytester: pytest.Pytester, suite_checkout: Callable[..., Path],
                                               tmp_path: Path, how: str) -> None:
    suite_checkout()
    pytester.makeconftest(MEASURE_CONFTEST)  # a measurement whose one cache entry is written after collection
    with (tmpfs(tmp_path / "disk", "size=80m") if how == "tmpfs" else _folder(tmp_path / "disk")) as disk:
        res = pytester.runpytest_inprocess("tests_eval", "-q", "-p", "no:randomly", "-k", "test_registered_measurement",
                                           *SUITE_ARGS, "--cache-dir", str(disk / "cache"), "--report-dir",
                                           str(tmp_path / "reports"), plugins=[FillAtCollection(how, disk)])
        out = res.stdout.str()
        stopped = [line for line in out.splitlines() if "stopped at the first write the file system refused" in line]
        assert res.ret == 1 and len(stopped) == 1, out
        assert "no space left on the device (ENOSPC)" in stopped[0] and str(disk / "cache" / "v1") in stopped[0]
        outcomes = res.parseoutcomes()  # two tests write an entry each: the first fails, the second never runs
        assert outcomes.get("errors", 0) + outcomes.get("failed", 0) == 1 and "passed" not in outcomes, outcomes
        entries = [p for p in (disk / "cache" / "v1").glob("*/*/*") if p.is_dir()]
        assert all((p / "manifest.json").is_file() for p in entries), entries  # written whole, or not at all
        assert not list((disk / "cache" / "v1" / ".tmp").iterdir())


@contextmanager
def _folder(path: Path) -> Iterator[Path]:
    path.mkdir()
    yield path


# ------------------------------------------------------------------------------------------------ reports
def test_reports_that_cannot_be_written_name_the_file_and_leave_no_earlier_report(tmp_path: Path) -> None:
    from result_rows import fragment

    from dflash_eval.report import merge
    from dflash_eval.report.write import write_reports

    run = merge([fragment(measurements={"one": {"value": 1.0}})], outcomes={}, wall_s=1.0)
    out = tmp_path / "reports"
    out.mkdir()
    (out / "eval.json").write_text('{"earlier": true}')
    (out / "eval.md").mkdir()  # a folder where eval.md goes
    with pytest.raises(StorageError) as info:
        write_reports(run, out)
    assert str(info.value).startswith(f"cannot write {out / 'eval.md'}: ")
    assert not (out / "eval.json").exists()  # no earlier run's eval.json left to be read as this one's


MEASURE_CONFTEST = '''
import torch
from dflash_eval.cache.requests import Batch, Produced, Request
from dflash_eval.measurements.registry import Measurement, MeasurementReport, Plan, register

pytest_plugins = ["dflash_eval.pytest_plugin"]


class One(Measurement):
    name = kind = "one_for_the_report"
    value = 1

    def applies(self, settings):
        return True

    def plan(self, subject, params):
        req = Request(self.kind, {"value": self.value}, what="a constant")
        return Plan([Batch([req], lambda todo: [Produced({"v": torch.ones(1) * self.value}, {})])], {"v": req})

    def decode(self, subject, entries, plan, params):
        return float(entries["v"].tensors["v"][0])

    def report(self, value):
        return MeasurementReport({"value": value}, [("value", str(value))])

    def check(self, value):
        return None


class Two(One):
    name = kind = "two_for_the_report"
    value = 2


register(One(), replace=True)  # a second in-process run imports this conftest again
register(Two(), replace=True)
'''


@pytest.mark.slow
@pytest.mark.parametrize("how", ["folder-in-the-way", "full"])
def test_a_run_whose_reports_cannot_be_written_fails(pytester: pytest.Pytester, suite_checkout: Callable[..., Path],
                                                     tmp_path: Path, how: str) -> None:
    suite_checkout()
    pytester.makeconftest(MEASURE_CONFTEST)
    args = ("tests_eval", "-q", "-p", "no:randomly", "-k", "test_registered_measurement", *SUITE_ARGS,
            "--cache-dir", str(tmp_path / "cache"))
    res = pytester.runpytest_inprocess(*args, "--report-dir", str(tmp_path / "ok"))
    assert res.ret == 0 and (tmp_path / "ok" / "eval.json").is_file(), res.stdout.str()  # the run measures, passes
    with (tmpfs(tmp_path / "disk", "size=80m") if how == "full" else _folder(tmp_path / "disk")) as disk:
        if how == "full":
            plugins: list[object] = [FillAtCollection("tmpfs", disk)]
        else:
            (disk / "eval.json").mkdir()
            plugins = []
        res = pytester.runpytest_inprocess(*args, "--report-dir", str(disk), plugins=plugins)
        out = res.stdout.str()
        assert res.ret == 1, out
        lines = [line for line in out.splitlines() if "could not write the reports" in line]
        assert len(lines) == 1 and str(disk / "eval.json") in lines[0], out
        cause = "no space left on the device (ENOSPC)" if how == "full" else "a folder is where a file should be"
        assert cause in lines[0] and lines[0].endswith("the run fails"), lines
        assert not (disk / "eval.md").exists()


def test_the_gate_fails_naming_a_file_it_cannot_write(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from dflash_eval.cli import main as cli

    def gate(ns: argparse.Namespace) -> int:
        raise StorageError("cannot write /r/gate.json: no space left on the device (ENOSPC)", "/r/gate.json",
                           errno.ENOSPC)

    monkeypatch.setattr(cli, "gate", gate)
    assert cli.main(["gate", "--drafter", "x"]) == 1
    assert capsys.readouterr().err == ("dflash-eval gate: cannot write /r/gate.json: no space left on the device "
                                       "(ENOSPC); the gate fails\n")


# ------------------------------------------------------------------------------------------------ named causes
def _drafter_copy(dst: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> Path:
    shutil.copytree(FIXTURES / "drafter", dst)
    sd = load_file(str(dst / "model.safetensors"))
    edit(sd)
    save_file(sd, str(dst / "model.safetensors"))
    return dst


def test_non_finite_weights_are_refused_naming_each_tensor(tmp_path: Path) -> None:
    from dflash_eval.drafter import CHECKS, read_checkpoint
    from dflash_eval.drafter.checkpoint import build_drafter

    def poison(sd: dict[str, torch.Tensor]) -> None:
        sd["fc.weight"] = torch.full_like(sd["fc.weight"], float("nan"))
        sd["norm.weight"][:3] = float("inf")

    ckpt = read_checkpoint(_drafter_copy(tmp_path / "nan", poison))
    n = ckpt.state_dict["fc.weight"].numel()
    c = CHECKS["finite_weights"](ckpt, None)
    assert c.status == "fail", c
    assert f"fc.weight: {n} of {n} values are NaN" in c.message and "norm.weight: 3 of 256 values are infinite" in \
        c.message and c.message.startswith(f"{tmp_path / 'nan'}: 2 of {len(ckpt.shapes)} tensors")
    with pytest.raises(DrafterRefused) as info:
        build_drafter(ckpt)
    assert [name for name, _ in info.value.checks] == ["finite_weights"]
    assert CHECKS["finite_weights"](read_checkpoint(FIXTURES / "drafter"), None).status == "pass"


@pytest.mark.parametrize(("taus", "rounds", "expected"), [
    ([128 / 127, 128 / 127], [127, 127], True),  # a random drafter: one lucky token per completion
    ([1.0, 129 / 127], [127, 127], False),  # two tokens in one completion: it drafts something
    ([1.1, 1.0], [10, 10], False),  # one token in 10 rounds is too little to tell
    ([1.004, 1.0], [None, None], True),  # rounds unknown: τ prints as 1.00
    ([1.008, 1.008], None, False),
])
def test_tau_of_about_one_is_one_accepted_token_per_completion(taus: list[float], rounds: list[int | None] | None,
                                                               expected: bool) -> None:
    from dflash_eval.metrics.verdict import no_acceptance

    assert no_acceptance(taus, rounds) is expected


def test_a_random_drafter_is_one_diagnosis() -> None:
    from dflash_eval.metrics.verdict import NO_ACCEPTANCE, diagnoses, gate_reasons, mean_thresholds

    rows = {p: {"tau": 128 / 127, "rounds": 127, "floor": 2.0, "ddtree_floor": {}, "passed": False}
            for p in ("humaneval-0", "humaneval-1")}
    typed = {p: SimpleNamespace(**r) for p, r in rows.items()}  # the judged rows, as the verdict reads them
    mean = SimpleNamespace(mean_tau=128 / 127, mean_floor=2.0, mean_ddtree={}, mean_ddtree_floor={})
    assert diagnoses(typed, mean, None) == [f"{NO_ACCEPTANCE} (2 prompts: 2 accepted draft tokens in 254 rounds)"]
    from dflash_eval.metrics.floors import Floors

    typed = {p: SimpleNamespace(**r) for p, r in rows.items()}  # a checkpoint's judged rows, as the gate reads them
    assert gate_reasons(typed, mean_thresholds(128 / 127, {}, Floors(mean_override=2.0)))[0] == NO_ACCEPTANCE


def test_a_pickled_checkpoint_is_refused_saying_what_to_do(tmp_path: Path) -> None:
    from dflash_eval.drafter import read_checkpoint

    pt = tmp_path / "train.pt"
    torch.save({"model": {"fc.weight": torch.zeros(2)}, "args": argparse.Namespace(lr=1e-4)}, pt)
    with pytest.raises(CheckpointError) as info:
        read_checkpoint(pt)
    msg = str(info.value)
    assert msg.startswith(f"{pt}: refused: it holds a pickled Python object (of class argparse.Namespace)")
    assert "If you trust the file, convert it once: ckpt = torch.load(PATH, weights_only=False)" in msg
    assert "model.safetensors" in msg and "will likely succeed" not in msg and "\x1b[" not in msg
    assert info.value.__cause__ is None and info.value.__suppress_context__
