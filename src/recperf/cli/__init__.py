"""The ``recperf`` command line: one module per command group, each thin over the library."""
