"""from_hf / from_transformer_lens / long_frame: a user's own forward pass gives extract's maps."""

import copy

import pytest
import torch

from headscope.probe.extract import extract
from headscope.probe.forward import base_model
from headscope.probe.interop import from_hf, from_transformer_lens, long_frame
from headscope.probe.tiny import tiny_model
from headscope.probe.types import AttentionMap

TEXTS = ["The animal didn't cross the street because it was too tired.", "Is it 42?", "我爱北京天安门"]


def _padded_tokenizer(tok):
    tok = copy.deepcopy(tok)  # the fixture's tokenizer is shared: set a pad token on a copy only
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def _user_forward(lm, texts, **tok_kwargs):
    """What a user writes: tokenise with padding, run the whole model with output_attentions."""
    tok = _padded_tokenizer(lm.tokenizer)
    enc = tok(texts, padding=True, return_tensors="pt", **tok_kwargs)
    with torch.no_grad():
        out = lm.model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], output_attentions=True)
    return out, enc, tok


def _same_map(got: AttentionMap, want: AttentionMap, atol=1e-6):
    assert got.labels == want.labels and got.spans == want.spans and got.special == want.special
    assert got.word_index == want.word_index and got.causal == want.causal and got.text == want.text
    torch.testing.assert_close(got.attention, want.attention, atol=atol, rtol=0)


@pytest.mark.parametrize("level", ["token", "word"])
def test_from_hf_round_trips_extract(tiny, level):
    out, enc, tok = _user_forward(tiny, TEXTS, return_offsets_mapping=True, return_special_tokens_mask=True)
    got = from_hf(out, enc, tok, text=TEXTS, level=level)
    want = extract(tiny, TEXTS, level=level)
    assert len(got) == len(TEXTS)
    for g, w in zip(got, want):
        _same_map(g, w)
        if level == "token":
            assert g.token_ids == w.token_ids and g.word_spans == w.word_spans


def test_from_hf_without_offsets_tokenises_the_text_again(tiny):
    out, enc, tok = _user_forward(tiny, TEXTS)  # no offset_mapping, no special_tokens_mask
    for g, w in zip(from_hf(out, enc, tok, text=TEXTS), extract(tiny, TEXTS)):
        _same_map(g, w)


def test_from_hf_left_padding_removes_the_pad_columns():
    from headscope.probe.tiny import tiny_model

    lm = tiny_model("bert")
    tok = copy.deepcopy(lm.tokenizer)
    tok.padding_side = "left"
    enc = tok(TEXTS, padding=True, return_tensors="pt")
    positions = (enc["attention_mask"].cumsum(-1) - 1).clamp_min(0)  # each text's own positions start at 0
    with torch.no_grad():
        out = lm.model(**enc, position_ids=positions, output_attentions=True)
    for g, w in zip(from_hf(out, enc, tok, text=TEXTS), extract(lm, TEXTS)):
        _same_map(g, w, atol=1e-5)


def test_from_hf_without_text_gives_raw_tokens_and_infers_causality(tiny):
    out, enc, tok = _user_forward(tiny, TEXTS[:1])
    [m] = from_hf(out, enc, tok)
    assert m.text == "" and m.labels == tuple(tok.convert_ids_to_tokens(enc["input_ids"][0].tolist()))
    assert m.causal == tiny.is_causal  # read off the weights: no query sees a later key
    with pytest.raises(ValueError, match="needs the text"):
        from_hf(out, enc, tok, level="word")


def test_from_hf_refuses_outputs_without_attention(tiny):
    enc = tiny.tokenizer(TEXTS[:1], return_tensors="pt")
    with torch.no_grad():
        out = base_model(tiny)(**enc)
    with pytest.raises(ValueError, match="output_attentions=True"):
        from_hf(out, enc, tiny.tokenizer, text=TEXTS[:1])
    with pytest.raises(ValueError, match="one text per row"):
        from_hf(((torch.ones(1, 1, 2, 2) / 2),), {"input_ids": [[1, 2]]}, tiny.tokenizer, text=["a", "b"])


class FakeCache:
    """What from_transformer_lens reads of an ActivationCache: `cache["pattern", layer]`."""

    def __init__(self, patterns):
        self.patterns = patterns

    def __getitem__(self, key):
        name, layer = key
        assert name == "pattern"
        return self.patterns[layer]  # IndexError past the last layer, as a missing hook is a KeyError


def test_from_transformer_lens_round_trips_extract():
    from headscope.probe.tiny import tiny_model

    lm = tiny_model("gpt2")
    ids = [lm.tokenizer.bos_token_id] + lm.tokenizer(TEXTS[0])["input_ids"]  # TL's to_tokens prepends BOS
    tokens = torch.tensor([ids])
    with torch.no_grad():
        out = lm.model(input_ids=tokens, output_attentions=True)
    cache = FakeCache([a.clone() for a in out.attentions])  # [batch, head, query, key] per layer
    [m] = from_transformer_lens(cache, tokens, text=TEXTS[0], tokenizer=lm.tokenizer, level="word")
    [want] = extract(lm, TEXTS[0], level="word")
    assert m.labels[0] == lm.tokenizer.bos_token and m.special[0]  # the BOS is a unit of its own
    assert m.labels[1:] == want.labels  # gpt2's tokenizer adds no BOS, so extract's text starts at 0
    [tok_map] = from_transformer_lens(cache, tokens, tokenizer=lm.tokenizer)
    torch.testing.assert_close(tok_map.attention, torch.stack([a[0] for a in out.attentions]), atol=0, rtol=0)
    assert tok_map.n_layers == lm.config.num_hidden_layers and tok_map.causal
    with pytest.raises(ValueError, match="do not match the text"):
        from_transformer_lens(cache, tokens, text="something else entirely", tokenizer=lm.tokenizer)


def test_long_frame_has_one_row_per_cell_with_its_labels():
    a = torch.arange(2 * 3 * 2 * 2, dtype=torch.float32).reshape(2, 3, 2, 2)
    m = AttentionMap(text="x y", level="word", labels=("x", "y"), spans=((0, 1), (2, 3)), special=(False, False),
                     attention=a, causal=False, layers=(4, 7), heads=(0, 2, 5))
    f = long_frame([m, m])
    assert list(f.columns) == ["text", "layer", "head", "query", "query_token", "key", "key_token", "weight"]
    assert len(f) == 2 * 24
    for r in f.head(24).itertuples():  # the weight of every row is the tensor's entry at its indices
        li, hi = (4, 7).index(r.layer), (0, 2, 5).index(r.head)
        assert r.weight == a[li, hi, r.query, r.key].item()
        assert (r.query_token, r.key_token) == (m.labels[r.query], m.labels[r.key])


@pytest.mark.slow
def test_from_hf_round_trips_minilm(minilm):
    out, enc, tok = _user_forward(minilm, TEXTS, return_offsets_mapping=True, return_special_tokens_mask=True)
    for level in ("token", "word"):
        for g, w in zip(from_hf(out, enc, tok, text=TEXTS, level=level), extract(minilm, TEXTS, level=level)):
            _same_map(g, w)


def test_from_hf_unbatched_encoding():
    from headscope.probe.tiny import tiny_model

    lm = tiny_model("llama")
    enc = lm.tokenizer(TEXTS[0], return_offsets_mapping=True, return_special_tokens_mask=True)  # plain lists
    with torch.no_grad():
        out = lm.model(input_ids=torch.tensor([enc["input_ids"]]), output_attentions=True)
    [got] = from_hf(out, enc, lm.tokenizer, text=TEXTS[0])
    _same_map(got, extract(lm, TEXTS[0])[0])


def test_the_public_names_are_the_interop_functions():
    import headscope as hs
    from headscope.probe import interop

    assert hs.from_hf is interop.from_hf and hs.from_transformer_lens is interop.from_transformer_lens
    lm = tiny_model("llama")
    text = "The cat sat on the mat."
    enc = lm.tokenizer([text], return_tensors="pt", return_offsets_mapping=True)
    with torch.no_grad():
        out = lm.model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], output_attentions=True)
    [a] = hs.from_hf(out, enc, lm.tokenizer, text=[text])
    _same_map(a, extract(lm, text)[0])


# --- encoder–decoder outputs ---------------------------------------------------------------------

SOURCES = ["The cat sat on the mat, and the dog sat on the log!", "Is it 42?"]
TARGETS = ["Numbers: 1, 2, 3.", "He said no — she said yes, and then nobody knew."]


def _user_seq2seq_forward(lm):
    """What a user writes: sources and targets padded, the decoder's input = its start token + the target."""
    tok = _padded_tokenizer(lm.tokenizer)
    enc = dict(tok(SOURCES, padding=True, return_tensors="pt"))
    tgt = tok(TARGETS, padding=True, return_tensors="pt")
    start = torch.full((len(TARGETS), 1), lm.config.decoder_start_token_id)
    enc["decoder_input_ids"] = torch.cat([start, tgt["input_ids"]], dim=1)
    enc["decoder_attention_mask"] = torch.cat([torch.ones_like(start), tgt["attention_mask"]], dim=1)
    with torch.no_grad():
        out = lm.model(**enc, output_attentions=True, use_cache=False)
    return out, enc, tok


@pytest.mark.parametrize("level", ["token", "word"])
def test_from_hf_of_an_encoder_decoder_round_trips_extract(tiny_seq2seq, level):
    out, enc, tok = _user_seq2seq_forward(tiny_seq2seq)
    assert enc["attention_mask"].min() == 0 and enc["decoder_attention_mask"].min() == 0  # both sides padded
    got = from_hf(out, enc, tok, text=SOURCES, target=TARGETS, level=level)
    want = extract(tiny_seq2seq, SOURCES, target=TARGETS, level=level)
    assert len(got) == len(want) == len(SOURCES)
    for g, w in zip(got, want):
        _same_map(g.encoder, w.encoder)
        _same_map(g.decoder, w.decoder)
        assert g.cross.queries == w.cross.queries and g.cross.keys == w.cross.keys
        torch.testing.assert_close(g.cross.attention, w.cross.attention, atol=1e-6, rtol=0)


def test_from_hf_of_an_encoder_decoder_needs_the_decoder_input(tiny_seq2seq):
    out, enc, tok = _user_seq2seq_forward(tiny_seq2seq)
    with pytest.raises(ValueError, match="decoder_input_ids"):
        from_hf(out, {k: v for k, v in enc.items() if not k.startswith("decoder")}, tok, text=SOURCES)
    with pytest.raises(ValueError, match="target="):
        from_hf(out, enc, tok, text=SOURCES, level="word")
