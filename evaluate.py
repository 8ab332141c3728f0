"""Evaluate MemAgent on long-context tasks: `python evaluate.py [flags]`, the same as the installed `memagent-evaluate`.

The evaluation reads top to bottom in memagent/evaluate.py; this file only runs it from a checkout.
"""

from memagent.evaluate import cli

if __name__ == "__main__":
    cli()
