"""The ``dflash-eval`` command line: run, gate, record, sets."""
