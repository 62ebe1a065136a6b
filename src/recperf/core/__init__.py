"""Shared by every capability: registry, config loading, errors, result writers, progress."""
