"""Builders of random tiny targets and drafters and the fixtures' training recipes, for tests, benchmarks and
``fixtures/build.py``. Not part of the installed wheel."""
