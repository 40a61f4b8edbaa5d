"""``python -m dflash_eval``: the ``dflash-eval`` command line (see :mod:`dflash_eval.cli.main`)."""

import sys

from dflash_eval.cli.main import main

sys.exit(main())
