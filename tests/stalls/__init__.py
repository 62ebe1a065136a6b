"""Tests of recperf.stalls (a package so its module names do not clash with other groups)."""
