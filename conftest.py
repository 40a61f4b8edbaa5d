"""Root conftest: loads the eval suite's pytest plugin in a checkout where the package is not installed.

Installed, pytest loads the plugin through its ``pytest11`` entry point, whose name is this module name, so the line
below then finds it registered and does nothing. All logic lives in :mod:`dflash_eval.pytest_plugin`; see
``pytest --help`` under "dflash-eval" for the options.
"""

pytest_plugins = ["dflash_eval.pytest_plugin"]
