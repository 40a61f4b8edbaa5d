"""The suite's session fixtures: thin wrappers over the stages of :class:`dflash_eval.session.eval_session.EvalSession`.

``eval_settings``, ``eval_session``, ``target``, ``drafter``, ``reference_completions``, ``sglang``,
``eval_features``, ``tau_results``. A :class:`~dflash_eval.errors.DFlashEvalError` fails the test with its
message only (no traceback), except a drafter refused by an architecture check
(:class:`~dflash_eval.errors.DrafterRefused`): one cause, one failure, so the test that needs the drafter is
skipped naming the check, whose own test (``test_architecture_check[<check>]``) is the one that fails. The
target-only fixtures (``target``, ``reference_completions``) never need the drafter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

from dflash_eval.errors import DFlashEvalError, DrafterRefused
from dflash_eval.pytest_plugin.state import SGLANG, get_session, get_settings

if TYPE_CHECKING:  # imported by the fixtures when they run: loading the plugin imports no torch
    from dflash_eval.drafter.model import DFlashDrafter
    from dflash_eval.features.feature_store import Features
    from dflash_eval.options.settings import EvalSettings
    from dflash_eval.session.eval_session import CompletionRecord, EvalSession, PromptTau
    from dflash_eval.target.loader import Target

__all__ = ["eval_settings", "eval_session", "target", "drafter", "reference_completions", "sglang", "eval_features",
           "tau_results", "guard", "refused_reason", "SUITE_FIXTURES", "uses_suite_fixtures"]

# The suite's fixtures: a test that uses any of them (directly or through another fixture) is an evaluation test,
# recorded in eval.json's "tests" block whether it is one of the suite's modules or a user's own test file.
SUITE_FIXTURES = frozenset({"eval_settings", "eval_session", "target", "drafter", "reference_completions", "sglang",
                            "eval_features", "tau_results"})


def uses_suite_fixtures(item: pytest.Item) -> bool:
    """Whether ``item`` uses one of this plugin's fixtures (a project's own fixture that happens to be called
    ``target`` or ``drafter`` does not count: the plugin is loaded in every pytest run where it is installed)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    for name in SUITE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        defs = info.name2fixturedefs.get(name)
        if defs and getattr(defs[-1].func, "__module__", None) == __name__:
            return True
    return False

T = TypeVar("T")


def refused_reason(exc: DrafterRefused) -> str:
    """The skip reason of a test that needs a drafter refused by architecture checks (naming them and their tests)."""
    names = [n for n, _ in exc.checks]
    return (f"the drafter was refused by architecture check{'s' if len(names) > 1 else ''} {', '.join(names)} (see "
            + ", ".join(f"test_architecture_check[{n}]" for n in names) + ")")


def guard(fn: Callable[[], T]) -> T:
    """Call ``fn``; a DFlashEvalError fails the test with its message only (no traceback, no chained context); a
    refused drafter skips it (:func:`refused_reason`)."""
    try:
        return fn()
    except DrafterRefused as exc:
        reason = refused_reason(exc)
    except DFlashEvalError as exc:
        pytest.fail(f"{type(exc).__name__}: {exc}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def eval_settings(pytestconfig: pytest.Config) -> EvalSettings:
    return guard(lambda: get_settings(pytestconfig))


@pytest.fixture(scope="session")
def eval_session(pytestconfig: pytest.Config, eval_settings: EvalSettings) -> EvalSession:
    """The process's EvalSession, after checking its inputs (all problems in one message; normally already done
    before collection, where a problem is a usage error)."""
    session = guard(lambda: get_session(pytestconfig))
    guard(session.check_inputs)
    return session


@pytest.fixture(scope="session")
def target(eval_session: EvalSession) -> Target:
    """The target model, loaded once per process (on the GPU when there is one)."""
    return guard(lambda: eval_session.inputs.target)


@pytest.fixture(scope="session")
def drafter(eval_session: EvalSession) -> DFlashDrafter:
    """The drafter, loaded and validated against the target once."""
    return guard(lambda: eval_session.evaluation.drafter)


@pytest.fixture(scope="session")
def reference_completions(eval_session: EvalSession, request: pytest.FixtureRequest) -> dict[str, CompletionRecord]:
    """{prompt id: CompletionRecord}, from the cache, else produced (SGLang or the target's greedy generation)."""
    s = eval_session.settings
    if s.completions == "sglang" and not s.cache_only and not guard(eval_session.references_cached):
        request.getfixturevalue("sglang")  # fetches them; no server: skip (--require-sglang: fail)
    return guard(eval_session.completions)


@pytest.fixture(scope="session")
def sglang(pytestconfig: pytest.Config, eval_session: EvalSession) -> Iterator[Any]:
    """The SGLang server (``--sglang-url``, or started by ``--sglang-launch``), used only when the reference
    completions (at ``--temperature`` > 0 also the sampled ones) are not cached: the service waits for readiness
    (``--sglang-timeout``) and checks ``/model_info``
    names the target, then hands its ready client to the completions stage, which fetches and caches every
    completion; at session end a launched server's whole process group is stopped.

    No server ready in time: every completion-dependent test is skipped with a reason naming the URL, or fails
    under ``--require-sglang``. A launch that fails, a wrong model or a bad answer always fails. Under xdist one
    worker fetches (file lock); the others then find the cache warm. Yields the
    :class:`dflash_eval.sglang.SGLangService` (``None`` when another worker already fetched).
    """
    from dflash_eval.sglang import SGLangService, SGLangUnavailable  # imports requests: only when a server is needed

    plugged = _plugin_reference_server(pytestconfig, eval_session)
    if plugged is not None:
        yield from plugged
        return
    svc = guard(lambda: SGLangService(eval_session.settings))
    pytestconfig.stash[SGLANG] = svc
    needed = False
    msg = None
    try:
        with eval_session.inputs.cache.locked("sglang-server"):
            if not eval_session.references_cached():
                needed = True
                eval_session.references.server.attach(svc.start(), svc.info())
                eval_session.fetch_references()  # fetched and cached while holding the lock
    except SGLangUnavailable as exc:
        svc.stop()
        if not eval_session.settings.require_sglang:
            pytest.skip(f"reference completions not cached and no SGLang server: {exc}")
        msg = f"--require-sglang: reference completions not cached and no SGLang server: {exc}"
    except DFlashEvalError as exc:
        svc.stop()
        msg = f"{type(exc).__name__}: {exc}"
    except KeyboardInterrupt:  # never leave a launched server behind; and drop the traceback below this frame
        svc.stop()  # (HTTP client internals) that pytest would otherwise parse and render while exiting
        raise KeyboardInterrupt(f"interrupted while the SGLang server at {svc.url} was being used; it was "
                                "stopped") from None
    except BaseException:  # SystemExit etc.: never leave a launched server behind
        svc.stop()
        raise
    if msg is not None:
        pytest.fail(msg, pytrace=False)
    try:
        yield svc if needed else None
    finally:
        eval_session.references.server.detach()
        svc.stop()


def _plugin_reference_server(config: pytest.Config, eval_session: EvalSession) -> Iterator[Any] | None:
    """The ``sglang`` fixture's body when a plugin's ``pytest_dflash_eval_reference_server`` answers with a client: the
    completions fetched through it (under the same lock as a server's), nothing launched or connected to; None
    when no plugin answers (asked only while the completions are not cached)."""
    if eval_session.references_cached():
        return None
    client = guard(lambda: config.hook.pytest_dflash_eval_reference_server(settings=eval_session.settings))
    if client is None:
        return None

    def body() -> Iterator[Any]:
        with eval_session.inputs.cache.locked("sglang-server"):
            if not eval_session.references_cached():
                eval_session.references.server.attach(client, {"url": getattr(client, "url", None),
                                                               "client": type(client).__name__})
                guard(eval_session.fetch_references)
        try:
            yield client
        finally:
            eval_session.references.server.detach()

    return body()


@pytest.fixture(scope="session")
def eval_features(eval_session: EvalSession, reference_completions: dict[str, CompletionRecord]) -> Features:
    """{prompt id: {layer id: [T, H]}} on the evaluation backend (cache, else one target forward per prompt)."""
    return guard(lambda: eval_session.evaluation.features(eval_session.inputs.eval_side))


@pytest.fixture(scope="session")
def tau_results(eval_session: EvalSession, drafter: DFlashDrafter,
                reference_completions: dict[str, CompletionRecord]) -> dict[str, PromptTau]:
    """{prompt id: PromptTau} for every prompt (one batched draft pass); ``drafter`` first, so that a refused
    drafter skips before any completion is produced for it."""
    return guard(lambda: eval_session.tau_results)
