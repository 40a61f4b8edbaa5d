"""Compiled GPU kernels as part of the run's cache (:mod:`dflash_eval.target.kernel_cache`): Triton's cache folder
under ``--cache-dir`` unless ``TRITON_CACHE_DIR`` is set, and the compilation timed apart from the work in eval.json.

The CPU tests drive Triton's compilation listener through a stand-in of its public knob (``triton.knobs.compilation.
listener``, called with the compiled source and a ``CompileTimes`` whose ``total`` is in microseconds), since no
Triton kernel compiles on a CPU; ``tests/test_gpu_kernels.py`` checks real compilations on a CUDA machine. Triton's
installation key, hashed in a thread of its own, is a stand-in ``triton.runtime.cache.triton_key`` hashing a real file
as Triton hashes its shared library.

Run: ``pytest tests/test_kernel_cache.py -p no:cacheprovider -n 0``
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
from result_rows import fragment

from dflash_eval.common.progress import Compilation, Meter
from dflash_eval.report.render import compile_text
from dflash_eval.session.eval_result import EvalResult
from dflash_eval.session.merge import merge
from dflash_eval.session.run_result import RunResult
from dflash_eval.target import kernel_cache
from dflash_eval.target.kernel_cache import ENV, add_sink, use_kernel_cache, watch_compilation


@pytest.fixture
def triton_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No TRITON_CACHE_DIR of the calling environment, and none set by an earlier run of this process."""
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setattr(kernel_cache, "_set_by_us", None)
    yield


def test_unset_the_kernel_cache_lives_under_the_cache_dir(triton_env: None, tmp_path: Path) -> None:
    got = use_kernel_cache(tmp_path / "cache")
    assert got.path == tmp_path / "cache" / "triton" and got.source == "--cache-dir"
    assert os.environ[ENV] == str(tmp_path / "cache" / "triton")
    moved = use_kernel_cache(tmp_path / "other")  # a later run of the process with another cache moves it
    assert moved.path == tmp_path / "other" / "triton" and os.environ[ENV] == str(moved.path)


def test_set_the_users_triton_cache_dir_is_kept(triton_env: None, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, str(tmp_path / "mine"))
    got = use_kernel_cache(tmp_path / "cache")
    assert got.path == tmp_path / "mine" and got.source == "TRITON_CACHE_DIR" and got.to_dict()["source"] == ENV
    assert os.environ[ENV] == str(tmp_path / "mine")


def test_an_unwritable_cache_leaves_tritons_default(triton_env: None, tmp_path: Path) -> None:
    use_kernel_cache(tmp_path / "first")  # an earlier run of this process set it
    got = use_kernel_cache(tmp_path / "ro", lambda p: "cannot be written: read-only file system")
    assert got.path is None and got.source == "triton default" and "read-only" in got.why and str(tmp_path) in got.why
    assert ENV not in os.environ  # not left pointing at the earlier run's folder


def test_compilation_is_attributed_to_the_stage_it_ran_in() -> None:
    meter = Meter()
    add_sink(meter.note_compile)
    kernel_cache.compilation_event(0.5, False)  # outside every stage
    with meter.timed("kernel_probe"):
        kernel_cache.compilation_event(2.0, False)
        with meter.timed("generation"):
            kernel_cache.compilation_event(1.25, False)
            kernel_cache.compilation_event(0.01, True)  # loaded from the cache: counted, not compile time
    block = meter.compilation.to_dict()
    assert block == {"seconds": 3.75, "by_stage": {"generation": 1.25, "kernel_probe": 2.0, "outside stages": 0.5},
                     "kernels_compiled": 3, "kernels_loaded": 1}
    del meter  # a finished run's meter stops receiving (held weakly)
    kernel_cache.compilation_event(1.0, False)


def _fake_triton(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """A stand-in ``triton`` whose ``knobs.compilation.listener`` is Triton's public slot, holding a listener
    someone else set."""
    seen: list[bool] = []
    compilation = SimpleNamespace(listener=lambda **kw: seen.append(kw["cache_hit"]))
    mod = ModuleType("triton")
    mod.knobs = SimpleNamespace(compilation=compilation)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "triton", mod)
    monkeypatch.setattr(kernel_cache, "_watching", False)
    return SimpleNamespace(compilation=compilation, seen=seen)


def test_the_listener_chains_and_reports_microseconds(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_triton(monkeypatch)
    meter = Meter()
    add_sink(meter.note_compile)
    assert watch_compilation() and watch_compilation()  # once: the second call adds no second listener
    with meter.timed("features"):
        fake.compilation.listener(src=None, metadata={}, metadata_group={}, times=SimpleNamespace(total=1_500_000),
                                  cache_hit=False)
        fake.compilation.listener(src=None, metadata={}, metadata_group={}, times=SimpleNamespace(total=3_000),
                                  cache_hit=True)
    assert fake.seen == [False, True]  # the listener that was there still hears every compilation
    assert meter.compilation.by_stage == {"features": 1.5} and meter.compilation.loaded == 1


def test_no_triton_no_listener(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton raises ImportError
    monkeypatch.setattr(kernel_cache, "_watching", False)
    assert watch_compilation() is False


def _fake_key_module(monkeypatch: pytest.MonkeyPatch, key: Callable[[], str]) -> None:
    """A stand-in ``triton.runtime.cache`` holding ``key`` as its ``triton_key``, and no key thread started yet."""
    mod = ModuleType("triton.runtime.cache")
    mod.triton_key = key  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "triton.runtime.cache", mod)
    monkeypatch.setattr(kernel_cache, "_key_thread", None)


def test_the_installation_key_is_hashed_once_in_a_thread(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Triton's key (here a stand-in hashing a real file in 1 MiB chunks, as Triton hashes its shared library) is
    computed in the ``triton-key`` thread, once per process, while the caller goes on; after joining it a lookup reads
    the memo."""
    lib = tmp_path / "libtriton.so"
    lib.write_bytes(os.urandom(1 << 20) * 8)
    release, calls = threading.Event(), []

    @functools.lru_cache
    def triton_key() -> str:
        calls.append(threading.current_thread().name)
        assert release.wait(60), "the test never released the key"
        digest = hashlib.sha256()
        with lib.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        return digest.hexdigest()

    _fake_key_module(monkeypatch, triton_key)
    default = sys.getswitchinterval()
    thread = kernel_cache.hash_installation()
    assert thread is not None and thread.name == "triton-key" and thread.daemon
    assert kernel_cache.hash_installation() is None  # once per process
    assert thread.is_alive()  # the caller goes on while it hashes (it waits for the release here)
    assert sys.getswitchinterval() == pytest.approx(kernel_cache.SWITCH_INTERVAL_S, abs=1e-6)  # while it runs
    assert kernel_cache.SWITCH_INTERVAL_S < default
    release.set()
    thread.join(60)
    assert not thread.is_alive() and calls == ["triton-key"] and triton_key.cache_info().currsize == 1
    assert triton_key() == hashlib.sha256(lib.read_bytes()).hexdigest() and calls == ["triton-key"]
    assert sys.getswitchinterval() == default  # put back as the thread ended


@pytest.mark.parametrize("meanwhile", [None, 1e-3], ids=["left-alone", "changed-meanwhile"])
def test_the_key_thread_keeps_a_shorter_or_later_switch_interval(monkeypatch: pytest.MonkeyPatch,
                                                                 meanwhile: float | None) -> None:
    """An interval already shorter than the thread's is kept; one set by someone else while the thread ran is not
    undone when it ends."""
    default = sys.getswitchinterval()
    release = threading.Event()

    @functools.lru_cache
    def triton_key() -> str:
        assert release.wait(60), "the test never released the key"
        return "key"

    _fake_key_module(monkeypatch, triton_key)
    sys.setswitchinterval(kernel_cache.SWITCH_INTERVAL_S / 2)
    short = sys.getswitchinterval()  # as the interpreter keeps it (whole microseconds)
    try:
        thread = kernel_cache.hash_installation()
        assert thread is not None and sys.getswitchinterval() == short
        if meanwhile is not None:
            sys.setswitchinterval(meanwhile)
        release.set()
        thread.join(60)
        assert sys.getswitchinterval() == (short if meanwhile is None else pytest.approx(meanwhile, abs=1e-6))
    finally:
        sys.setswitchinterval(default)


def test_no_thread_without_an_imported_memoised_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing is imported to start it, and a key Triton does not memoise would be computed twice: no thread."""
    monkeypatch.delitem(sys.modules, "triton.runtime.cache", raising=False)
    monkeypatch.setattr(kernel_cache, "_key_thread", None)
    assert kernel_cache.hash_installation() is None and "triton.runtime.cache" not in sys.modules
    _fake_key_module(monkeypatch, lambda: "not memoised")
    assert kernel_cache.hash_installation() is None and kernel_cache._key_thread is None


def test_triton_is_imported_first_by_the_caller(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``import_triton``: the calling thread imports Triton's cache module (here an installed stand-in package that
    records who imported it) with the collector paused, then the thread only hashes; without Triton installed nothing
    starts."""
    pkg = tmp_path / "site" / "triton" / "runtime"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "cache.py").write_text(
        "import functools, gc, threading\n"
        "IMPORTED_BY = threading.current_thread().name\n"
        "COLLECTOR_ON = gc.isenabled()\n"
        "@functools.lru_cache\n"
        "def triton_key():\n"
        "    return 'key of ' + threading.current_thread().name\n")
    names = ("triton", "triton.runtime", "triton.runtime.cache")
    saved = {name: sys.modules.pop(name) for name in names if name in sys.modules}
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(kernel_cache, "_key_thread", None)
    try:
        assert kernel_cache.hash_installation() is None and "triton.runtime.cache" not in sys.modules  # not asked
        thread = kernel_cache.hash_installation(import_triton=True)
        assert thread is not None
        thread.join(60)
        cache = sys.modules["triton.runtime.cache"]
        assert cache.IMPORTED_BY == threading.current_thread().name and cache.COLLECTOR_ON is False
        assert cache.triton_key() == "key of triton-key"

        monkeypatch.setattr(kernel_cache, "_key_thread", None)
        sys.modules.update(dict.fromkeys(names))  # not installed: importing it raises ImportError
        assert kernel_cache.hash_installation(import_triton=True) is None and kernel_cache._key_thread is None
    finally:  # no stand-in left behind: transformers looks for Triton in sys.modules
        for name in names:
            sys.modules.pop(name, None)
        sys.modules.update(saved)


def test_a_failing_key_is_left_to_the_first_kernel_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    """An error while hashing in the thread is not raised there (nor memoised): the lookup that needs the key
    computes it and raises it where Triton would."""
    attempts: list[str] = []

    @functools.lru_cache
    def triton_key() -> str:
        attempts.append(threading.current_thread().name)
        raise OSError("libtriton.so: Input/output error")

    _fake_key_module(monkeypatch, triton_key)
    thread = kernel_cache.hash_installation()
    assert thread is not None
    thread.join(60)
    assert attempts == ["triton-key"]
    with pytest.raises(OSError, match="Input/output error"):
        triton_key()
    assert attempts == ["triton-key", threading.current_thread().name]


def test_merged_timings_sum_compilation_and_render_it() -> None:
    def frag(worker: str, compiled: int, stage_s: float) -> EvalResult:
        return fragment(worker=worker, timings={"kernel_probe": stage_s + 1},
                        compile={"seconds": stage_s, "by_stage": {"kernel_probe": stage_s},
                                 "kernels_compiled": compiled, "kernels_loaded": 2,
                                 "kernel_cache": {"path": "/c/triton", "source": "--cache-dir"}})
    data = merge([frag("gw0", 10, 20.0), frag("gw1", 5, 10.0)]).to_dict()
    c = data["timings"]["compile"]
    assert c["seconds"] == 30.0 and c["by_stage"] == {"kernel_probe": 30.0}
    assert c["kernels_compiled"] == 15 and c["kernels_loaded"] == 4 and c["kernel_cache"]["path"] == "/c/triton"
    text = compile_text(RunResult.from_dict(data).timings)
    assert "GPU kernel compilation 30.00 s of those (kernel_probe 30.00): 15 kernels compiled, 4 loaded" in text
    assert "/c/triton (--cache-dir)" in text
    cpu = merge([fragment(compile={**Compilation().to_dict(), "kernel_cache": None})])
    # nothing compiled on a CPU: the terminal says nothing
    assert compile_text(cpu.timings, terse=True) == ""


@pytest.mark.slow
def test_the_suites_eval_json_names_the_kernel_cache(bundled_suite: Callable[..., pytest.RunResult], tmp_path: Path,
                                                     triton_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset, the kernel cache is ``<--cache-dir>/triton``; set (the second, warm run), the user's folder."""
    for name, want in (("unset", (tmp_path / "cache" / "triton", "--cache-dir")),
                       ("set", (tmp_path / "mine", "TRITON_CACHE_DIR"))):
        if name == "set":
            monkeypatch.setenv(ENV, str(tmp_path / "mine"))
        res = bundled_suite("-k", "tau", "--tau-floor", "1.0", report=name, cache=tmp_path / "cache")
        assert res.ret == 0, res.stdout.str()
        c = json.loads((tmp_path / name / "eval.json").read_text())["timings"]["compile"]
        assert (Path(c["kernel_cache"]["path"]), c["kernel_cache"]["source"]) == want
        assert c["seconds"] == 0 and c["kernels_compiled"] == 0  # a CPU run compiles no GPU kernel
        assert "GPU kernel compilation 0.00 s" in (tmp_path / name / "eval.md").read_text()
