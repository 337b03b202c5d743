"""Seeded chaos runs of the real observer, planner and executor over the in-memory fakes.

``python -m tests.chaos [--runs 1000] [--seed S] [--steps N] [-v]``; see ``sim.py``.
"""
