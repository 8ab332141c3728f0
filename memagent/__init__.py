"""memagent: a from-scratch PyTorch reference implementation of MemAgent (arXiv 2507.02259)."""

__version__ = "0.1.0"
