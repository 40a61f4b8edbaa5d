"""Rebuild ``saved/``: each mini set of ``rows/`` written by Hugging Face ``datasets`` itself with ``save_to_disk``,
so the loader is tested on the real on-disk layout (Arrow stream files, state.json, dataset_info.json).

gsm8k and mbpp are saved as a ``DatasetDict`` (splits ``train`` = the first row, ``test`` = all rows, as the real
sets have several splits); the others as a single ``Dataset``. Needs ``pip install datasets`` (not a dependency of
dflash-eval; the suite reads these folders with pyarrow only)::

    python tests/data/prompt_sets/make_saved.py
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
from datasets import Dataset, DatasetDict
from datasets.table import InMemoryTable

HERE = Path(__file__).resolve().parent
DICTS = ("gsm8k", "mbpp")


def _dataset(rows: list[dict], name: str) -> Dataset:
    # an explicit fingerprint: datasets 5.2 cannot hash a table under pyarrow 26 (MonthDayNano pickling error)
    return Dataset(InMemoryTable(pa.Table.from_pylist(rows)), fingerprint=f"mini-{name}")


def main() -> None:
    out = HERE / "saved"
    shutil.rmtree(out, ignore_errors=True)
    for src in sorted((HERE / "rows").glob("*.jsonl")):
        rows = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
        ds = _dataset(rows, src.stem)
        if src.stem in DICTS:
            DatasetDict({"train": _dataset(rows[:1], src.stem + "-train"), "test": ds}).save_to_disk(
                str(out / src.stem))
        else:
            ds.save_to_disk(str(out / src.stem))
        print(src.stem, len(rows))


if __name__ == "__main__":
    main()
