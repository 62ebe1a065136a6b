"""Run the Triton kernels in Triton's CPU interpreter unless told otherwise (TRITON_INTERPRET=0
for a GPU): triton.jit picks compiled or interpreted kernels when a kernel module is imported,
and any test module may import one (the report's sections do), so this precedes every import."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
