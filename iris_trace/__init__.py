"""Trace collection, clock alignment and analysis for Iris runs.

Filled by the ``tracing:`` and ``exports:`` issues; nothing here yet.
"""
