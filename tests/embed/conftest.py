"""Run the Triton kernels in Triton's CPU interpreter unless told otherwise: triton.jit picks
compiled or interpreted kernels when a kernel module is imported, so this must precede imports."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
