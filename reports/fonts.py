"""Fonts for figure labels in any script: Latin, Chinese (我爱北京天安门), Japanese, Arabic, emoji.

matplotlib (>= 3.6) falls back glyph by glyph through the families listed in `font.family`, so
one list that names an installed font per script is enough. The list is applied through
`font_context()` (an `rc_context`), never by changing the caller's global rcParams.

The fonts come from the system (Debian: fonts-noto-cjk, fonts-noto-core, fonts-symbola; installed
by scripts/setup.sh). A font installed after matplotlib built its font cache is found too: the
cache is refreshed once when a wanted family is missing from it.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Iterator

__all__ = ["FALLBACKS", "font_families", "families_for", "font_context", "font_for", "missing_glyphs"]

# Per script, the families to try, best first. The first installed one of each group is used.
FALLBACKS: dict[str, tuple[str, ...]] = {
    "latin": ("DejaVu Sans",),
    "cjk": ("Noto Sans CJK SC", "Noto Sans CJK JP", "Noto Sans CJK TC", "Noto Sans CJK KR", "Noto Sans SC",
            "Source Han Sans SC", "WenQuanYi Zen Hei", "WenQuanYi Micro Hei", "AR PL UMing CN", "Droid Sans Fallback"),
    "arabic": ("Noto Sans Arabic", "Noto Naskh Arabic", "Amiri", "Noto Sans"),
    "hebrew": ("Noto Sans Hebrew",),
    "devanagari": ("Noto Sans Devanagari",),
    "thai": ("Noto Sans Thai",),
    "emoji": ("Symbola", "Noto Emoji", "OpenMoji", "Noto Sans Symbols2"),
}


def _installed() -> set[str]:
    from matplotlib import font_manager

    return {f.name for f in font_manager.fontManager.ttflist}


@functools.lru_cache(maxsize=1)
def font_families() -> tuple[str, ...]:
    """The installed families, one per script, in fallback order (DejaVu Sans first).

    >>> font_families()[0]
    'DejaVu Sans'
    """
    names = _installed()
    if not any(f in names for f in FALLBACKS["cjk"]):
        names = _refresh_font_cache() or names
    chosen = [next((f for f in group if f in names), None) for group in FALLBACKS.values()]
    fams = [f for f in chosen if f]
    return tuple(dict.fromkeys(fams or ["DejaVu Sans"]))


def _refresh_font_cache() -> set[str]:
    """Add system fonts that matplotlib's cached font list does not know yet (installed later)."""
    from matplotlib import font_manager

    known = {f.fname for f in font_manager.fontManager.ttflist}
    for path in font_manager.findSystemFonts():
        if path not in known:
            with contextlib.suppress(Exception):  # a font file FreeType cannot read is skipped
                font_manager.fontManager.addfont(path)
    return _installed()


@contextlib.contextmanager
def font_context(text: str | None = None, **extra) -> Iterator[None]:
    """Figures drawn inside use matplotlib's default style with fonts that cover every script.

    With `text` (all the labels a figure will draw) only the fallback fonts those characters need
    are listed: each extra family costs a font lookup per text item, so a grid of numbers stays
    fast. Without it every installed fallback is listed. `extra` adds rcParams.
    """
    import matplotlib as mpl
    import matplotlib.style

    families = font_families() if text is None else families_for(text)
    # parse_math off: a token such as "$5" must show as typed, not start a formula.
    params = {"font.family": list(families), "axes.unicode_minus": False, "text.parse_math": False, **extra}
    # From matplotlib's defaults, not the caller's style: a figure is the same from the CLI and from
    # a notebook that changed its rcParams. Both contexts restore everything on exit.
    with matplotlib.style.context("default"), mpl.rc_context(params):
        yield


def families_for(text: str) -> tuple[str, ...]:
    """The primary family plus the fallbacks that `text`'s characters need, in `font_families()` order.

    >>> families_for("0.25 layer"), families_for("我")[1:]
    (('DejaVu Sans',), ('Noto Sans CJK SC',))
    """
    fams = font_families()
    needed = {_family_for(c) for c in set(text) if _drawn(c)}
    return (fams[0],) + tuple(f for f in fams[1:] if f in needed)


@functools.lru_cache(maxsize=8192)
def _family_for(char: str) -> str | None:
    from matplotlib import font_manager

    for fam in font_families():
        path = font_manager.findfont(font_manager.FontProperties(family=fam), fallback_to_default=False)
        if _has_glyph(path, char):
            return fam
    return None


def font_for(char: str) -> str | None:
    """Path of the first family of `font_families()` that has a glyph for `char`, else None."""
    from matplotlib import font_manager

    fam = _family_for(char)
    return None if fam is None else font_manager.findfont(font_manager.FontProperties(family=fam),
                                                          fallback_to_default=False)


@functools.lru_cache(maxsize=4096)
def _has_glyph(path: str, char: str) -> bool:
    from matplotlib.ft2font import FT2Font

    return FT2Font(path).get_char_index(ord(char)) != 0


def missing_glyphs(text: str) -> list[str]:
    """Characters of `text` that no installed fallback font can draw (they would show as boxes).

    >>> missing_glyphs("attention")
    []
    """
    return [c for c in dict.fromkeys(text) if _drawn(c) and font_for(c) is None]


def _drawn(char: str) -> bool:
    """Whether `char` needs a glyph of its own (not space, control, joiner or variation selector)."""
    import unicodedata

    return not char.isspace() and unicodedata.category(char) not in ("Cc", "Cf") and not 0xFE00 <= ord(char) <= 0xFE0F
