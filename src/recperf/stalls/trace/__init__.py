"""Reading and checking traces, and figures from them: the torch.profiler (Kineto) reader
(``kineto``), per-iteration stall figures (``breakdown``), the one-run checks (``check``), and the
Chakra execution-trace export (``chakra``, ``chakra_schema``)."""
