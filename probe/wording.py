"""How a count is written in every line headscope prints: `counted(1, "text")` is "1 text", not "1 texts"."""

from __future__ import annotations

__all__ = ["counted"]

_IRREGULAR = {"index": "indices", "matrix": "matrices", "is": "are", "was": "were", "has": "have"}


def counted(n: int | float, noun: str, plural: str | None = None, *, sep: str = " ") -> str:
    """`n` and `noun`, the noun plural unless `n` is 1 (`plural` where adding "s" is wrong); whole numbers are
    written with thousands separators.

    >>> counted(1, "text"), counted(2, "text"), counted(0, "image"), counted(12000, "token"), counted(3, "index")
    ('1 text', '2 texts', '0 images', '12,000 tokens', '3 indices')
    """
    word = noun if n == 1 else (plural or _IRREGULAR.get(noun) or (noun + "es" if noun.endswith(("s", "x", "ch", "sh"))
                                                                   else noun + "s"))
    number = f"{int(n):,}" if float(n).is_integer() else f"{n:g}"
    return f"{number}{sep}{word}"
