"""Tiny randomly initialised models of each family, with tokenizers trained on the spot.

For tests and examples that must run in seconds with no download, as transformers' own tests do.
Weights are drawn wider than the usual init so that attention is far from uniform — a from-scratch
bug then shows up as a real mismatch.
"""

from __future__ import annotations

from typing import Literal

import torch

from .loading import LoadedModel

__all__ = ["tiny_model", "tiny_tokenizer", "TINY_CORPUS"]

Family = Literal["bert", "gpt2", "llama", "gemma3"]

TINY_CORPUS = (
    "The animal didn't cross the street because it was too tired.",
    "The animal didn't cross the street because it was too wide.",
    "Mary told John that she would call him tomorrow.",
    "The cat sat on the mat, and the dog sat on the log!",
    "Is it 42 or 43? Nobody knows... yet.",
    "我爱北京天安门。北京是中国的首都。",
    "Numbers: 1, 2, 3; units: 5 km, 10 kg.",
    "He said \"no\" — she said yes.",
)


def tiny_tokenizer(kind: Literal["wordpiece", "bytebpe", "sentencepiece"]):
    """A fast tokenizer of the given kind, trained in milliseconds on `TINY_CORPUS`."""
    from tokenizers import ByteLevelBPETokenizer, SentencePieceBPETokenizer, processors
    from tokenizers.implementations import BertWordPieceTokenizer
    from transformers import PreTrainedTokenizerFast

    corpus = list(TINY_CORPUS) * 4
    if kind == "wordpiece":
        raw = BertWordPieceTokenizer(lowercase=True)
        raw.train_from_iterator(corpus, vocab_size=400, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
        cls_id, sep_id = raw.token_to_id("[CLS]"), raw.token_to_id("[SEP]")
        raw.post_processor = processors.BertProcessing(("[SEP]", sep_id), ("[CLS]", cls_id))
        return PreTrainedTokenizerFast(tokenizer_object=raw._tokenizer, cls_token="[CLS]", sep_token="[SEP]",
                                       pad_token="[PAD]", unk_token="[UNK]", mask_token="[MASK]")
    if kind == "bytebpe":
        raw = ByteLevelBPETokenizer(trim_offsets=True)
        raw.train_from_iterator(corpus, vocab_size=400, special_tokens=["<|endoftext|>"])
        return PreTrainedTokenizerFast(tokenizer_object=raw._tokenizer, eos_token="<|endoftext|>",
                                       bos_token="<|endoftext|>")
    if kind == "sentencepiece":
        raw = SentencePieceBPETokenizer()
        raw.train_from_iterator(corpus, vocab_size=400, special_tokens=["<pad>", "<eos>", "<bos>", "<unk>"])
        bos = raw.token_to_id("<bos>")
        raw.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", bos)])
        return PreTrainedTokenizerFast(tokenizer_object=raw._tokenizer, bos_token="<bos>", eos_token="<eos>",
                                       pad_token="<pad>", unk_token="<unk>")
    raise ValueError(f"unknown tokenizer kind {kind!r}")


def _config(family: Family, vocab: int, **overrides):
    from transformers import BertConfig, Gemma3TextConfig, GPT2Config, LlamaConfig

    if family == "bert":
        cfg = BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=128)
    elif family == "gpt2":
        cfg = GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=128, bos_token_id=0, eos_token_id=0)
    elif family == "llama":
        cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    elif family == "gemma3":
        cfg = Gemma3TextConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8,
                               sliding_window=4, layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                               max_position_embeddings=128)
    else:
        raise ValueError(f"unknown family {family!r}; choose bert, gpt2, llama or gemma3")
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg


def tiny_model(family: Family, *, seed: int = 0, std: float = 0.2, **config_overrides) -> LoadedModel:
    """A `LoadedModel` of a 2-3 layer random model of `family`, ready for extract() and verify().

    >>> lm = tiny_model("llama")
    >>> lm.config.num_hidden_layers, lm.is_causal
    (2, True)
    """
    from transformers import AutoModel, AutoModelForCausalLM

    kind = {"bert": "wordpiece", "gpt2": "bytebpe", "llama": "bytebpe", "gemma3": "sentencepiece"}[family]
    tok = tiny_tokenizer(kind)
    cfg = _config(family, len(tok), **config_overrides)
    cfg.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    cfg.bos_token_id, cfg.eos_token_id = tok.bos_token_id, tok.eos_token_id
    torch.manual_seed(seed)
    cls = AutoModel if family == "bert" else AutoModelForCausalLM
    model = cls.from_config(cfg, attn_implementation="eager")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, std)
    model.eval()
    return LoadedModel(name=f"tiny-{family}", model=model, tokenizer=tok, source="random init",
                       dtype=torch.float32, device=torch.device("cpu"))
