"""Ray Data as an engine of the ingestion pipeline: a fused segment is one ``map_batches``
operator, a cut is an operator boundary, and recperf's tuners set each operator's pool size
(``target.RayTarget``). Ray is optional (``pip install 'recperf[ray]'``); only ``runtime``
imports it, when the engine is asked for."""
