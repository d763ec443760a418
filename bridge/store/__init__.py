"""Persistence: the only place that knows SQL."""
