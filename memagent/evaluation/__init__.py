"""Helpers of the evaluation entry points (evaluate.py, memagent.ask): the model or endpoint to evaluate, scoring, traces, tables.

Nothing here is needed for training; each module has one job and the scripts read top to bottom around them.
"""
