"""Wrong inputs at the extraction API (`extract`, `iter_extract`, `extract_ids`) get a message that says
what to pass, never silent garbage or a raw error from deep inside torch or the tokenizer."""

import numpy as np
import pytest
import torch

from headscope.probe import extract_ids

from headscope.probe.extract import extract
from headscope.probe.extract import iter_extract


@pytest.fixture(scope="module")
def lm():
    from headscope.probe.tiny import tiny_model

    return tiny_model("gpt2")  # 2 layers, 4 heads, 128 positions


TEXT = "The animal didn't cross the street."


@pytest.mark.parametrize("kwargs, err, match", [
    ({"store_dtype": torch.int8}, TypeError, "floating-point torch.dtype"),  # was: all-zero attention
    ({"store_dtype": torch.bool}, TypeError, "floating-point torch.dtype"),
    ({"store_dtype": "float16"}, TypeError, r"store_dtype must be .* got 'float16'"),  # was: raw TypeError in .to()
    ({"layers": [1.5]}, TypeError, "layer index must be a whole number such as 1, got 1.5 \\(a float\\)"),  # was: silently layer 1
    ({"layers": [True]}, TypeError, "layer index must be a whole number such as 1, got True \\(a bool\\)"),  # was: silently layer 1
    ({"layers": []}, ValueError, "layers is empty; pass None for all layers"),  # was: "[] out of range"
    ({"layers": 1}, TypeError, "layers must be a list of layer indices"),  # was: 'int' is not iterable
    ({"layers": "01"}, TypeError, "layers must be a list"),  # was: layers 0 and 1
    ({"heads": [0.0]}, TypeError, "head index must be a whole number such as 1, got 0.0 \\(a float\\)"),
    ({"heads": [4]}, ValueError, r"heads \[4\] out of range: the model has heads 0..3"),
    ({"batch_size": 2.5}, TypeError, "batch_size must be a whole number"),
    ({"batch_size": 0}, ValueError, "batch_size must be at least 1"),
])
def test_bad_options_are_refused(lm, kwargs, err, match):
    with pytest.raises(err, match=match):
        extract(lm, TEXT, **kwargs)


@pytest.mark.parametrize("texts, err, match", [
    (None, TypeError, "texts must be a str or an iterable of str .* got NoneType"),  # was: 'NoneType' not iterable
    (42, TypeError, "got int"),
    (b"some text", TypeError, "texts is bytes, not a str; decode it first"),  # was: "text 0 is a int"
    (bytearray(b"x"), TypeError, "texts is bytearray"),
    ("ok \ud800 text", ValueError, r"text 0 holds a lone surrogate '\\ud800' at character 3"),  # was: tokenizer TypeError
    (["fine", "bad \udcff"], ValueError, "text 1 holds a lone surrogate"),
])
def test_bad_texts_are_refused(lm, texts, err, match):
    with pytest.raises(err, match=match):
        extract(lm, texts)


def test_iter_extract_checks_options_before_the_first_text(lm):
    def never():
        raise AssertionError("the texts must not be read before the options are checked")
        yield  # pragma: no cover

    with pytest.raises(TypeError, match="layer index"):
        iter_extract(lm, never(), layers=[0.5])  # raised at the call, not at the first next()


def test_whole_number_types_that_are_not_int_still_work(lm):
    [ref] = extract(lm, TEXT, layers=[1], heads=[0, 2])
    [alt] = extract(lm, TEXT, layers=np.array([1]), heads=(torch.tensor(0), np.int64(2)))
    assert alt.layer_ids == (1,) and alt.head_ids == (0, 2) and torch.equal(alt.attention, ref.attention)
    [half] = extract(lm, TEXT, store_dtype=torch.float16)
    assert half.attention.dtype == torch.float16 and half.attention.max() > 0


def test_over_long_text_is_named_by_its_position(lm):
    texts = ["short one"] * 3 + ["word " * 300]
    with pytest.raises(ValueError, match=r"text 3 \(starting 'word word .*has \d+ tokens; .* takes at most 128"):
        extract(lm, texts, batch_size=1, window=2)  # text 3 sits in the second window: its position counts on


@pytest.mark.parametrize("sequences, err, match", [
    (None, TypeError, "sequences must be a list of token-id lists"),
    (42, TypeError, "sequences must be a list of token-id lists"),
    (b"\x05\x06", TypeError, "sequences must be a list"),  # was: "'int' object is not iterable"
    ([5, 6, 7], TypeError, r"sequence 0 is a int; each sequence is a list of token ids"),  # a flat list
    ([[5, 6.5]], TypeError, "sequence 0: token id must be a whole number such as 1, got 6.5 \\(a float\\)"),  # was: silently id 6
    ([[5, True]], TypeError, r"\(a bool\)"),
    ([["5", "6"]], TypeError, r"\(a str\)"),
    ([[]], ValueError, "sequence 0 is empty"),
])
def test_extract_ids_bad_sequences(lm, sequences, err, match):
    with pytest.raises(err, match=match):
        extract_ids(lm, sequences)


def test_extract_ids_bad_options_and_tensor_input(lm):
    with pytest.raises(TypeError, match="floating-point torch.dtype"):
        extract_ids(lm, [[5, 6, 7]], store_dtype=torch.int8)
    with pytest.raises(ValueError, match="layers is empty"):
        extract_ids(lm, [[5, 6, 7]], layers=[])
    [a] = extract_ids(lm, [[5, 6, 7]])
    [b] = extract_ids(lm, torch.tensor([[5, 6, 7]]))  # a batch tensor of ids is a list of lists too
    assert torch.equal(a.attention, b.attention)


@pytest.mark.parametrize("call", ["heads", "verify", "extract_file", "head_means", "next_token_loss", "sentence_cosine"])
@pytest.mark.parametrize("bad", [0, -1, 2.5, "4"])
def test_a_batch_size_that_is_no_count_is_one_clear_error_everywhere(lm, call, bad, tmp_path):
    """Every API that steps through texts by `batch_size` checks it first (was: 'range() arg 3 must not be
    zero', islice's 'Indices for islice() must be None or an integer', or -1 taken as a size)."""
    from headscope.probe.effects import next_token_loss, sentence_cosine
    from headscope.probe.interventions import head_means

    import headscope as hs

    run = {"heads": lambda: hs.heads(lm, ["a b"], batch_size=bad),
           "verify": lambda: hs.verify(lm, ["a b"], batch_size=bad),
           "extract_file": lambda: hs.extract_file(lm, ["a b"], tmp_path / "a.npz", batch_size=bad),
           "head_means": lambda: head_means(lm, ["a b"], batch_size=bad),
           "next_token_loss": lambda: next_token_loss(lm, ["a b c"], batch_size=bad),
           "sentence_cosine": lambda: sentence_cosine(lm, ["a b c"], batch_size=bad)}[call]
    with pytest.raises((TypeError, ValueError), match="batch_size must be"):
        run()
    assert not (tmp_path / "a.npz").exists()
