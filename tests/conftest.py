"""Run the Triton kernels in Triton's CPU interpreter unless told otherwise (TRITON_INTERPRET=0
for a GPU): triton.jit picks compiled or interpreted kernels when a kernel module is imported,
and any test module may import one (the report's sections do), so this precedes every import."""

import os
import signal

os.environ.setdefault("TRITON_INTERPRET", "1")

# A suite started in the background by a script (``make test &``) has SIGINT ignored, and an
# ignored signal stays ignored through exec: every child the signal tests interrupt with SIGINT
# would then ignore it. A handled signal is reset to the default on exec, so handle it here.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
