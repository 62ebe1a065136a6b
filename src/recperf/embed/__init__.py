"""DLRM inference embedding stage: access traces, their locality, kernels and benchmarks."""
