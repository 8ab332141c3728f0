"""Argument checks shared by the verifiers: clear errors that name the bad argument.

The verifiers are pure string functions called on model output, so a wrong type (bytes, None, a nested
list) is a caller bug that should fail loudly here rather than score 0.0 silently.
"""

from collections.abc import Sequence


def require_str(value: object, name: str) -> str:
    """Return `value` unchanged if it is a str, else raise TypeError naming `name`."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    return value


def as_str_list(values: str | Sequence[str], name: str) -> list[str]:
    """Turn one string or a non-empty sequence of strings into a list of strings.

    A bare str counts as one item (not as a sequence of characters). An empty sequence raises ValueError,
    because "max over no golds" has no sensible value; a non-str item raises TypeError.
    """
    if isinstance(values, str):
        return [values]
    if not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a str or a sequence of str, got {type(values).__name__}")
    if len(values) == 0:
        raise ValueError(f"{name} must not be empty")
    for i, item in enumerate(values):
        if not isinstance(item, str):
            raise TypeError(f"{name}[{i}] must be a str, got {type(item).__name__}")
    return list(values)
