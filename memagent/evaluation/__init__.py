"""Helpers of the evaluation entry points (evaluate.py, memagent.ask): backends, scoring, traces, tables.

Nothing here is needed for training; each module has one job and the scripts read top to bottom around them.
"""
