"""How a count and a number are written in every line headscope prints: `counted(1, "text")` is "1 text",
`number(0.0009777)` is "0.000978" (significant digits, one notation)."""

from __future__ import annotations

__all__ = ["counted", "number", "numbers", "size"]

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


_PLAIN = (1e-6, 1e6)  # magnitudes written as plain decimals; outside, every number of the column in e-notation


def number(value: float | None, digits: int = 3, *, scientific: bool | None = None, sign: bool = False) -> str:
    """`value` to `digits` significant digits, the one way the report and the terminal write a measured number:
    a plain decimal (0.000978, 0.0297, 1.23, 1,230) while it is between 1e-6 and 1e6, else e-notation
    (1.23e-07); `scientific` forces one notation (a column's, `numbers`), `sign` writes + before a positive
    number. None and NaN are "n/a", 0 is "0".

    >>> number(0.0009777), number(0.00297), number(9.78e-4), number(1.2345), number(12345.6), number(3e-8)
    ('0.000978', '0.00297', '0.000978', '1.23', '12,346', '3.00e-08')
    >>> number(0.5, sign=True), number(float("nan")), number(0.0), number(0.01, scientific=True)
    ('+0.500', 'n/a', '0', '1.00e-02')
    """
    import math

    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    value = float(value)
    if math.isinf(value):
        return "∞" if value > 0 else "−∞"
    plus = "+" if sign and value > 0 else ""
    if value == 0:
        return f"{plus}0"
    magnitude = abs(value)
    if scientific if scientific is not None else not (_PLAIN[0] <= magnitude < _PLAIN[1]):
        return f"{value:+.{digits - 1}e}" if plus else f"{value:.{digits - 1}e}"
    exponent = math.floor(math.log10(magnitude))
    decimals = max(0, digits - 1 - exponent)
    rounded = round(value, decimals)
    if rounded and math.floor(math.log10(abs(rounded))) > exponent:  # 0.000999 rounded up to 0.00100
        decimals = max(0, decimals - 1)
    text = f"{value:,.{decimals}f}"
    return plus + text


def numbers(values, digits: int = 3) -> list[str]:
    """A column of numbers in one notation: plain decimals, or e-notation for all of them when any one
    (not 0, not NaN) lies outside 1e-6 .. 1e6 (`number`).

    >>> numbers([0.5, 0.000978, float("nan")]), numbers([0.5, 2e-9])
    (['0.500', '0.000978', 'n/a'], ['5.00e-01', '2.00e-09'])
    """
    import math

    finite = [abs(float(v)) for v in values if v is not None and not math.isnan(float(v)) and float(v) != 0
              and not math.isinf(float(v))]
    scientific = any(not (_PLAIN[0] <= m < _PLAIN[1]) for m in finite)
    return [number(v, digits, scientific=scientific) for v in values]


def size(n_bytes: float) -> str:
    """Bytes as a reader reads them, in decimal units to three significant digits (`number`).

    >>> size(2000), size(63648), size(6.3e9), size(12), size(999_999)
    ('2.00 kB', '63.6 kB', '6.30 GB', '12 B', '1.00 MB')
    """
    import math

    if math.isnan(n_bytes):
        return "n/a"
    # A unit from 0.9995 of it on: three significant digits round 999.5 .. 999.9 of the unit below up to 1,000.
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n_bytes) >= scale * 0.9995:
            return f"{number(n_bytes / scale)} {unit}"
    return f"{int(n_bytes)} B"
