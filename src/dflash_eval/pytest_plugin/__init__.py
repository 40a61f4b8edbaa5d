"""pytest plugin of the eval suite: options, session fixtures, progress, xdist result merging, reports.

Installed with the package, pytest loads it through the ``pytest11`` entry point named
``dflash_eval.pytest_plugin`` (disable with ``-p no:dflash_eval.pytest_plugin``); this repository's root
``conftest.py`` also names it in ``pytest_plugins`` for checkouts where the package is not installed (the same
name: pytest registers it once). Loading it imports no torch.

Every option of :mod:`dflash_eval.options.settings` is available as ``--name`` on the command line, as the environment
variable ``DFLASH_EVAL_<NAME>`` and as the ini key ``dflash_<name>`` ([tool.pytest.ini_options]); precedence
CLI > env > ini > default. Relative paths from the CLI or the environment are taken from the directory pytest
was started in; from the ini file or the defaults, from the rootdir.

Hooks live in :mod:`.hooks`, fixtures in :mod:`.fixtures` (session scope, thin wrappers over
:class:`dflash_eval.session.eval_session.EvalSession`), parametrization helpers for test modules (the suite's and a
user's own) in :mod:`.params`, progress lines in :mod:`.progress_reporter`, junit properties (and the
``testcase_property`` fixture) in :mod:`.junit`.
"""

from dflash_eval.pytest_plugin.fixtures import (
                                                SUITE_FIXTURES,
                                                drafter,
                                                eval_features,
                                                eval_session,
                                                eval_settings,
                                                reference_completions,
                                                sglang,
                                                target,
                                                tau_results,
)
from dflash_eval.pytest_plugin.hooks import (
                                                pytest_addhooks,
                                                pytest_addoption,
                                                pytest_collection_modifyitems,
                                                pytest_configure,
                                                pytest_configure_node,
                                                pytest_load_initial_conftests,
                                                pytest_runtest_call,
                                                pytest_runtest_makereport,
                                                pytest_runtestloop,
                                                pytest_sessionfinish,
                                                pytest_sessionstart,
                                                pytest_terminal_summary,
                                                pytest_testnodedown,
                                                pytest_unconfigure,
)
from dflash_eval.pytest_plugin.junit import testcase_property
from dflash_eval.pytest_plugin.params import SetupError, collect, prompt_ids, safe_id, setup_error_param
from dflash_eval.pytest_plugin.state import get_session, get_settings, settings_from_config

__all__ = ["SetupError", "collect", "prompt_ids", "safe_id", "setup_error_param", "get_session", "get_settings",
           "settings_from_config", "SUITE_FIXTURES", "drafter", "eval_features", "eval_session", "eval_settings",
           "reference_completions", "sglang", "target", "tau_results", "testcase_property", "pytest_addhooks",
           "pytest_addoption", "pytest_collection_modifyitems", "pytest_configure", "pytest_configure_node",
           "pytest_load_initial_conftests", "pytest_runtest_call", "pytest_runtest_makereport", "pytest_runtestloop",
           "pytest_sessionfinish", "pytest_sessionstart", "pytest_terminal_summary", "pytest_testnodedown",
           "pytest_unconfigure"]
