"""pytest plugin of the eval suite (tests_eval/): options, session fixtures, xdist result merging, reports.

Registered by the repository's root ``conftest.py`` (``pytest_plugins = ["dflash_eval.pytest_plugin"]``).

Every option of :data:`dflash_eval.settings.OPTIONS` is available as ``--name`` on the command line, as the
environment variable ``DFLASH_EVAL_<NAME>`` and as the ini key ``dflash_<name>`` ([tool.pytest.ini_options]);
precedence CLI > env > ini > default. Relative paths from the CLI or the environment are taken from the
directory pytest was started in; from the ini file or the defaults, from the rootdir.

Fixtures (session scope, thin wrappers over :class:`dflash_eval.session.EvalSession`): ``eval_settings``,
``eval_session``, ``target``, ``drafter``, ``reference_completions``, ``sglang``, ``eval_features``, ``tau_results``.

Under pytest-xdist each worker has its own session (and loads the target once); workers share the cache
directory (file locks, see :mod:`dflash_eval.cache`) and send their measurements to the controller through
``workeroutput``; the controller merges them and writes ``reports/`` in ``pytest_sessionfinish``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from dflash_eval.errors import DFlashEvalError
from dflash_eval.session import EvalSession
from dflash_eval.settings import OPTIONS, EvalSettings, OptionSpec

__all__ = ["settings_from_config", "get_session", "setup_error_param", "safe_id"]

_SESSION = pytest.StashKey[EvalSession]()
_SETTINGS = pytest.StashKey["EvalSettings | Exception"]()
_FRAGMENTS = pytest.StashKey[list]()
_OUTCOMES = pytest.StashKey[dict]()
_START = pytest.StashKey[float]()
_SGLANG = pytest.StashKey[Any]()
WORKEROUTPUT_KEY = "dflash_eval_fragment"


# ---------------------------------------------------------------------------------------------------- options


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dflash-eval", "DFlash drafter evaluation (tests_eval/); each option also reads "
                            "env DFLASH_EVAL_<NAME> and ini dflash_<name>; precedence CLI > env > ini > default")
    for spec in OPTIONS:
        helptext = f"{spec.help} [env {spec.env}, ini {spec.ini}; default: {_show_default(spec)}]"
        if spec.kind == "bool":
            group.addoption(spec.flag, action="store_const", const=True, default=None, dest=spec.name, help=helptext)
        elif spec.kind == "ints":
            group.addoption(spec.flag, action="append", default=None, dest=spec.name, metavar="N[,N...]",
                            help=helptext)
        elif spec.kind == "choice":
            group.addoption(spec.flag, default=None, dest=spec.name, metavar="{" + ",".join(spec.choices) + "}",
                            help=helptext)
        else:
            group.addoption(spec.flag, default=None, dest=spec.name, help=helptext)
        parser.addini(spec.ini, help=f"{spec.help} (same as {spec.flag})", type="string", default="")


def _show_default(spec: OptionSpec) -> str:
    if spec.default is None:
        return "unset"
    if isinstance(spec.default, tuple):
        return ",".join(map(str, spec.default))
    return str(spec.default)


def settings_from_config(config: pytest.Config) -> EvalSettings:
    """Resolve every option (CLI > env > ini > default) into :class:`EvalSettings` (raises ConfigError)."""
    invocation = Path(config.invocation_params.dir)
    root = Path(config.rootpath)
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for spec in OPTIONS:
        cli = config.getoption(spec.name, default=None)
        env = os.environ.get(spec.env)
        ini = config.getini(spec.ini)
        if cli is not None:
            raw, base, origin = cli, invocation, "cli"
        elif env is not None and env != "":
            raw, base, origin = env, invocation, "env"
        elif ini not in (None, "", []):
            raw, base, origin = ini, Path(config.inipath).parent if config.inipath else root, "ini"
        else:
            raw, base, origin = spec.default, root, "default"
        if spec.kind == "path" and raw is not None:
            p = Path(str(raw)).expanduser()
            raw = p if p.is_absolute() else base / p
        elif spec.kind == "spec" and raw is not None:  # --prompts: file items resolved like paths
            from dflash_eval.session import resolve_prompt_spec

            raw = resolve_prompt_spec(raw, base)
        values[spec.name] = raw
        origins[spec.name] = origin
    return EvalSettings.from_mapping(values, origins=origins)


def get_settings(config: pytest.Config) -> EvalSettings:
    if _SETTINGS not in config.stash:
        try:
            config.stash[_SETTINGS] = settings_from_config(config)
        except DFlashEvalError as exc:
            config.stash[_SETTINGS] = exc
    s = config.stash[_SETTINGS]
    if isinstance(s, Exception):
        raise s
    return s


def get_session(config: pytest.Config) -> EvalSession:
    """The process's EvalSession (created on first use)."""
    if _SESSION not in config.stash:
        config.stash[_SESSION] = EvalSession(get_settings(config))
    return config.stash[_SESSION]


# ---------------------------------------------------------------------------------------------------- collection


class SetupError:
    """Parametrize value standing for an error met while collecting (the test fails with it)."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def fail(self) -> None:
        pytest.fail(f"{type(self.exc).__name__}: {self.exc}", pytrace=False)


def setup_error_param(exc: BaseException) -> Any:
    return pytest.param(SetupError(exc), id="setup-error")


def safe_id(text: str) -> str:
    """A test-id part that never contains 'tau' (so ``-k tau`` selects only the τ tests)."""
    low = text.lower()
    out, i = [], 0
    while i < len(text):
        if low.startswith("tau", i):
            out.append(text[i:i + 2] + "_" + text[i + 2])
            i += 3
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def collect(config: pytest.Config, fn: Any) -> tuple[Any, BaseException | None]:
    """Run ``fn(session)`` at collection; return (value, None) or (None, error)."""
    try:
        return fn(get_session(config)), None
    except (DFlashEvalError, OSError, ValueError) as exc:
        return None, exc


# ---------------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def eval_settings(pytestconfig: pytest.Config) -> EvalSettings:
    return _guard(lambda: get_settings(pytestconfig))


def _guard(fn: Any) -> Any:
    """Call ``fn``; a DFlashEvalError fails the test with its message only (no traceback, no chained context)."""
    try:
        return fn()
    except DFlashEvalError as exc:
        msg = f"{type(exc).__name__}: {exc}"
    pytest.fail(msg, pytrace=False)


@pytest.fixture(scope="session")
def eval_session(pytestconfig: pytest.Config, eval_settings: EvalSettings) -> EvalSession:
    """The process's EvalSession, after checking that every input path exists (all problems in one message)."""
    session = _guard(lambda: get_session(pytestconfig))
    _guard(session.preflight)
    return session


@pytest.fixture(scope="session")
def target(eval_session: EvalSession) -> Any:
    """The target model, loaded once per process (on the GPU when there is one)."""
    return _guard(lambda: eval_session.target)


@pytest.fixture(scope="session")
def drafter(eval_session: EvalSession) -> Any:
    """The drafter, loaded and validated against the target once."""
    return _guard(lambda: eval_session.drafter)


@pytest.fixture(scope="session")
def reference_completions(eval_session: EvalSession, drafter: Any, request: pytest.FixtureRequest) -> Any:
    """{prompt id: CompletionRecord}, from the cache, else produced (SGLang or the target's greedy generation)."""
    s = eval_session.settings
    if s.completions == "sglang" and not s.cache_only and not _guard(eval_session.completions_cached):
        request.getfixturevalue("sglang")  # fetches them; no server: skip (--require-sglang: fail)
    return _guard(eval_session.completions)


@pytest.fixture(scope="session")
def sglang(pytestconfig: pytest.Config, eval_session: EvalSession) -> Any:
    """The SGLang server (``--sglang-url``, or started by ``--sglang-launch``), used only when the reference
    completions are not cached: waits for readiness (``--sglang-timeout``), checks ``/model_info`` names the target,
    fetches and caches every completion, and at session end stops a launched server's whole process group.

    No server ready in time: every completion-dependent test is skipped with a reason naming the URL, or fails
    under ``--require-sglang``. A launch that fails, a wrong model or a bad answer always fails. Under xdist one
    worker fetches (file lock); the others then find the cache warm. Yields the
    :class:`dflash_eval.sglang.SGLangService` (``None`` when another worker already fetched). Readiness and identity
    are checked once, by :meth:`~dflash_eval.sglang.SGLangService.start`, whose ready client is handed to the session
    (``eval_session.sglang_client``) for fetching the completions.
    """
    from dflash_eval.sglang import SGLangService, SGLangUnavailable

    svc = _guard(lambda: SGLangService(eval_session.settings))
    pytestconfig.stash[_SGLANG] = svc
    needed = False
    msg = None
    try:
        with eval_session.cache.locked("sglang-server"):
            if not eval_session.completions_cached():
                needed = True
                eval_session.sglang_client = svc.start()
                eval_session.sglang_info = svc.info()
                eval_session.completions()  # fetched and cached while holding the lock
    except SGLangUnavailable as exc:
        svc.stop()
        if not eval_session.settings.require_sglang:
            pytest.skip(f"reference completions not cached and no SGLang server: {exc}")
        msg = f"--require-sglang: reference completions not cached and no SGLang server: {exc}"
    except DFlashEvalError as exc:
        svc.stop()
        msg = f"{type(exc).__name__}: {exc}"
    except BaseException:  # KeyboardInterrupt etc.: never leave a launched server behind
        svc.stop()
        raise
    if msg is not None:
        pytest.fail(msg, pytrace=False)
    try:
        yield svc if needed else None
    finally:
        eval_session.sglang_client = None
        svc.stop()


@pytest.fixture(scope="session")
def eval_features(eval_session: EvalSession, reference_completions: Any) -> Any:
    """{prompt id: {layer id: [T, H]}} on the evaluation backend (cache, else one target forward per prompt)."""
    return _guard(lambda: eval_session.features(eval_session.eval_side))


@pytest.fixture(scope="session")
def tau_results(eval_session: EvalSession, reference_completions: Any) -> Any:
    """{prompt id: PromptTau} for every prompt (one batched draft pass)."""
    return _guard(lambda: eval_session.tau_results)


# ---------------------------------------------------------------------------------------------------- results


def _is_controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_FRAGMENTS] = []
    config.stash[_OUTCOMES] = {}
    config.stash[_START] = time.time()
    from dflash_eval import snapshots

    try:
        settings = get_settings(config)
        snapshots.GOLDEN_DIR = settings.golden_dir
        snapshots.TARGET_NAME = settings.target_model.name or "target"
    except DFlashEvalError:
        pass


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    out = getattr(node, "workeroutput", {}) or {}
    raw = out.get(WORKEROUTPUT_KEY)
    if raw:
        node.config.stash[_FRAGMENTS].append(json.loads(raw))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "tests_eval" not in report.nodeid.replace("\\", "/"):
        return
    cfg = _CONFIG.get("config")
    if cfg is None:
        return
    outcomes = cfg.stash[_OUTCOMES]
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        outcomes[report.nodeid] = report.outcome
    elif report.when == "teardown" and report.outcome == "failed":
        outcomes[report.nodeid] = "error"


_CONFIG: dict[str, pytest.Config] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    _CONFIG["config"] = session.config


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    svc = config.stash.get(_SGLANG, None)
    if svc is not None:  # also after failures and KeyboardInterrupt (the fixture's teardown normally did it)
        try:
            svc.stop()
        except Exception as exc:  # noqa: BLE001
            print(f"dflash-eval: could not stop the SGLang server: {exc}")
    try:
        _finish(config)
    except Exception as exc:  # noqa: BLE001 - reporting must never turn a test run into an internal error
        config.stash[_MESSAGES] = [f"dflash-eval: could not write the reports: {type(exc).__name__}: {exc}"]
        if _is_controller(config):
            config.stash.setdefault(_MERGED, {})


def _finish(config: pytest.Config) -> None:
    sess = config.stash.get(_SESSION, None)
    if sess is not None:
        frag = sess.fragment()
        if "fingerprint" in sess.__dict__:
            frag["fingerprint"] = sess.fingerprint
        if not _is_controller(config):
            config.workeroutput[WORKEROUTPUT_KEY] = json.dumps(frag)  # type: ignore[attr-defined]
            return
        config.stash[_FRAGMENTS].append(frag)
    if not _is_controller(config):
        return
    frags = config.stash[_FRAGMENTS]
    if not frags or not any(("prompts" in f or "drift" in f or "fingerprint" in f) for f in frags):
        return
    from dflash_eval import report

    try:
        settings = get_settings(config)
    except DFlashEvalError:
        return
    data = report.merge(frags, outcomes=config.stash[_OUTCOMES], wall_s=time.time() - config.stash[_START])
    config.stash[_MERGED] = data
    config.stash[_MESSAGES] = report.finish(data, settings)


_MERGED = pytest.StashKey[dict]()
_MESSAGES = pytest.StashKey[list]()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    data = config.stash.get(_MERGED, None)
    if data is None:
        return
    from dflash_eval import report

    terminalreporter.section("dflash-eval")
    if not data:
        for m in config.stash.get(_MESSAGES, []):
            terminalreporter.write_line(m)
        return
    width = getattr(terminalreporter, "_tw", None)
    terminalreporter.write(report.render_terminal(data, width=getattr(width, "fullwidth", 120)))
    for m in config.stash.get(_MESSAGES, []):
        terminalreporter.write_line(m)
