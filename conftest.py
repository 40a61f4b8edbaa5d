"""Root conftest: registers the eval suite's pytest plugin (options, session fixtures, reports).

All logic lives in :mod:`dflash_eval.pytest_plugin`; see ``pytest --help`` under "dflash-eval" for the options.
"""

pytest_plugins = ["dflash_eval.pytest_plugin"]
