"""Execution modes: orchestration of the pure parts, no maths."""
