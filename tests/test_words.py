"""The word rule on Unicode text: grapheme clusters (combining accents, emoji sequences) stay whole."""

import unicodedata

import pytest

from headscope.probe import word_spans

from headscope.probe.extract import extract


def _words(text: str) -> list[str]:
    return [text[a:b] for a, b in word_spans(text)]


@pytest.mark.parametrize("nfc", ["café au lait", "naïve señor", "Ångström über Zoë"])
def test_decomposed_accents_split_like_composed_ones(nfc):
    nfd = unicodedata.normalize("NFD", nfc)
    assert nfd != nfc  # the test really has combining marks
    assert [unicodedata.normalize("NFC", w) for w in _words(nfd)] == _words(nfc) == nfc.split()


@pytest.mark.parametrize("text, expected", [
    ("I \U0001F468\u200D\U0001F469\u200D\U0001F467 you", ["I", "\U0001F468\u200D\U0001F469\u200D\U0001F467", "you"]),
    ("ok \U0001F44D\U0001F3FD!", ["ok", "\U0001F44D\U0001F3FD", "!"]),  # skin-tone modifier
    ("\U0001F1EB\U0001F1F7 flag", ["\U0001F1EB\U0001F1F7", "flag"]),  # two regional indicators, one flag
    ("हिन्दी भाषा", ["हिन्दी", "भाषा"]),  # Devanagari vowel signs are marks, not letters
])
def test_grapheme_clusters_are_one_unit(text, expected):
    assert _words(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("我爱北京", ["我", "爱", "北", "京"]),
    ("It didn't.\r\n", ["It", "didn't", "."]),
    ("John's (2019) e-mail", ["John's", "(", "2019", ")", "e", "-", "mail"]),
])
def test_plain_text_keeps_the_old_rule(text, expected):
    assert _words(text) == expected


def test_extracted_words_keep_decomposed_accents_whole(tiny):
    text = unicodedata.normalize("NFD", "The naïve cat sat at the café.")
    [w] = extract(tiny, text, level="word")
    words = [lab for lab, sp in zip(w.labels, w.special) if not sp]
    assert "naïve" in [unicodedata.normalize("NFC", x) for x in words]
    assert not any(unicodedata.combining(x[0]) for x in words)  # no word starts with a bare accent
