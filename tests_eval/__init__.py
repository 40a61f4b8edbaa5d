"""The eval suite's test modules (installed as the package ``dflash_eval.tests_eval``).

In this repository: ``pytest tests_eval``. Installed: ``pytest --pyargs dflash_eval.tests_eval --target-model DIR
--drafter CKPT`` or ``dflash-eval run --target-model DIR --drafter CKPT`` from any directory.
"""
