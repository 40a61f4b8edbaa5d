"""pytest plugin of the eval suite (tests_eval/): options, session fixtures, xdist result merging, reports.

Registered by the repository's root ``conftest.py`` (``pytest_plugins = ["dflash_eval.pytest_plugin"]``).

Every option of :mod:`dflash_eval.options` is available as ``--name`` on the command line, as the environment
variable ``DFLASH_EVAL_<NAME>`` and as the ini key ``dflash_<name>`` ([tool.pytest.ini_options]); precedence
CLI > env > ini > default. Relative paths from the CLI or the environment are taken from the directory pytest
was started in; from the ini file or the defaults, from the rootdir.

Hooks live in :mod:`.hooks`, fixtures in :mod:`.fixtures` (session scope, thin wrappers over
:class:`dflash_eval.session.EvalSession`), parametrization helpers for the suite's modules in :mod:`.params`.
"""

from dflash_eval.pytest_plugin.fixtures import (drafter, eval_features, eval_session, eval_settings,
                                                reference_completions, sglang, target, tau_results)
from dflash_eval.pytest_plugin.hooks import (pytest_addoption, pytest_configure,
                                             pytest_sessionfinish, pytest_sessionstart, pytest_terminal_summary,
                                             pytest_testnodedown)
from dflash_eval.pytest_plugin.params import SetupError, collect, safe_id, setup_error_param
from dflash_eval.pytest_plugin.state import get_session, get_settings, settings_from_config

__all__ = ["SetupError", "collect", "safe_id", "setup_error_param", "get_session", "get_settings", "settings_from_config",
           "drafter", "eval_features", "eval_session", "eval_settings", "reference_completions", "sglang", "target",
           "tau_results", "pytest_addoption", "pytest_configure", "pytest_sessionfinish",
           "pytest_sessionstart", "pytest_terminal_summary", "pytest_testnodedown"]
