"""Criteo-format data: the generator and readers (``criteo``), the splits and per-stage work
(``stages``) and the decode kernels (``decode``)."""
