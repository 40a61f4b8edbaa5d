"""What a process's first uses of CUDA cost after the import floor: the driver and context, the first cuBLAS matmul,
the first attention call on each scaled-dot-product backend, and cuDNN attention's set-up for each new shape.

A warm run re-checks its kernels on the card, so it pays for these where the import floor
(``bench_suite.FLOOR_IMPORT``) does not. Each step is synchronised and timed in a fresh process::

    python benchmarks/first_cuda_use.py            # on a CUDA machine; run it twice for a second sample

cuDNN attention builds an execution plan for every new shape (torch keeps the plans per thread and per process);
flash attention has none to build.
"""

from __future__ import annotations

import time

T0 = time.perf_counter()
import torch  # noqa: E402 - timed: the floor's imports
import transformers.models.qwen3_5.modeling_qwen3_5  # noqa: E402,F401 - timed: the floor's imports
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.nn.functional import scaled_dot_product_attention as sdpa  # noqa: E402

#: head_dim and heads of the calls, and the extra key lengths that each get a plan of their own
HEADS, HEAD_DIM, LENGTHS = 4, 64, (17, 18, 19, 20)


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("first_cuda_use.py: needs a CUDA device (none here)")
    marks = [("import torch and the modeling code", time.perf_counter())]

    def mark(name: str) -> None:
        torch.cuda.synchronize()
        marks.append((name, time.perf_counter()))

    torch.cuda.init()
    mark("CUDA initialised")
    a = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    mark("first allocation")
    (a @ a).sum().item()
    mark("first matmul (cuBLAS)")
    q = torch.randn(1, HEADS, 16, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        sdpa(q, q, q, is_causal=True)
        mark("first flash attention")
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        sdpa(q, q, q, is_causal=True)
        mark("first cuDNN attention")
        for n in LENGTHS:
            k = torch.randn(1, HEADS, n, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
            sdpa(k, k, k, is_causal=True)
        mark(f"cuDNN attention, {len(LENGTHS)} more shapes")
    prev = T0
    for name, t in marks:
        print(f"{name:38s} {t - prev:6.3f} s")
        prev = t


if __name__ == "__main__":
    main()
