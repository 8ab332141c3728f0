"""Train MemAgent with Multi-Conv DAPO: `python train.py [flags]`, the same as the installed `memagent-train`.

The trainer reads top to bottom in memagent/train.py; this file only runs it from a checkout.
"""

from memagent.train import cli

if __name__ == "__main__":
    cli()
