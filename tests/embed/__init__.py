"""Tests of recperf.embed (a package so its module names do not clash with other groups)."""
