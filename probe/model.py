"""The loaded model: a transformers model with eager attention, its tokenizer, and what its config says.

`LoadedModel` is what every part of `probe` takes: where the weights came from, the dtype and device
they live on, and the few facts read off the config that extraction needs (causal or not, the
context limit). It is built by `probe.loading` (packaged names, folders, hub ids, `tiny:`) and by
`probe.tiny` (seeded random models), and knows nothing of either.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .families import SUPPORTED_TYPES

__all__ = ["LoadedModel", "encoder_only", "model_class", "DecoderConfig"]


class DecoderConfig:
    """A vision–language model's config as its decoder's: what the composite config (LlavaConfig, Gemma3Config)
    holds is read there (`model_type` "llava", the image token), everything else from its text config (layers,
    heads, positions), so the code that reads a text decoder's config reads this one unchanged.

    >>> from types import SimpleNamespace
    >>> cfg = DecoderConfig(SimpleNamespace(model_type="llava", text_config=SimpleNamespace(num_hidden_layers=2)))
    >>> cfg.model_type, cfg.num_hidden_layers
    ('llava', 2)
    """

    def __init__(self, composite, text=None) -> None:
        object.__setattr__(self, "composite", composite)
        object.__setattr__(self, "text", composite.text_config if text is None else text)

    def __getattr__(self, name: str):
        try:
            return getattr(object.__getattribute__(self, "composite"), name)
        except AttributeError:
            return getattr(object.__getattribute__(self, "text"), name)

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError("a DecoderConfig is read-only; change the model's own config")


@dataclass(frozen=True, eq=False)
class LoadedModel:
    """A transformers model loaded with eager attention, its tokenizer and where it came from."""

    name: str
    model: torch.nn.Module
    tokenizer: object
    source: str  # human-readable origin of the weights
    dtype: torch.dtype
    device: torch.device
    timings: dict = field(default_factory=dict)  # seconds: {"load": .., "converted": bool}
    processor: object = None  # an image model's image processor (resize, rescale, normalise); None for text

    @property
    def is_image(self) -> bool:
        """True for a vision transformer, whose input is an image (`extract(lm, images=[...])`), not a text."""
        family = SUPPORTED_TYPES.get(self.model_type)
        if family is not None:
            return family.modality == "image"
        return getattr(self.model, "main_input_name", "input_ids") == "pixel_values"

    @property
    def config(self):
        """The model's config; a vision–language model's as its decoder's (`DecoderConfig`)."""
        family = SUPPORTED_TYPES.get(getattr(self.model.config, "model_type", None))
        if family is not None and family.vision_language is not None:
            return DecoderConfig(self.model.config, family.vision_language.text_config(self.model.config))
        return self.model.config

    @property
    def reads_images(self) -> bool:
        """True for a decoder that reads images among its text tokens (`extract(lm, texts, images=[...])`)."""
        family = SUPPORTED_TYPES.get(getattr(self.model.config, "model_type", None))
        return family is not None and family.vision_language is not None

    @property
    def model_type(self) -> str:
        return getattr(self.model.config, "model_type", "unknown")

    @property
    def is_causal(self) -> bool:
        """Whether the attention of one text is causal. An encoder–decoder's is its encoder's (bidirectional):
        its decoder attends causally only over a target, next to a source (`extract(..., target=...)`)."""
        if getattr(self.config, "is_encoder_decoder", False):
            return False
        return bool(getattr(self.model.config, "is_decoder", False)) or not encoder_only(self.config)

    @property
    def max_length(self) -> int:
        cfg = self.config
        limit = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None) or 2048
        base = getattr(self.model, getattr(self.model, "base_model_prefix", ""), self.model)
        padding_idx = getattr(getattr(base, "embeddings", None), "padding_idx", None)
        if isinstance(padding_idx, int) and getattr(cfg, "max_position_embeddings", None):
            limit -= padding_idx + 1  # RoBERTa-style positions start after the padding index (MPNet: 514 -> 512)
        if self.tokenizer is None:
            return int(limit)
        tok_limit = getattr(self.tokenizer, "model_max_length", None)
        if isinstance(tok_limit, int) and 0 < tok_limit < limit:
            limit = tok_limit
        return int(limit)


def encoder_only(config) -> bool:
    """True for a bidirectional encoder (built with `AutoModel`, never asked for a next word)."""
    model_type = getattr(config, "model_type", None)
    family = SUPPORTED_TYPES.get(model_type)
    if family is not None:
        return family.kind == "encoder"
    # A type no family covers (extractable, not verifiable): an encoder is what transformers can
    # build with a masked-LM head and no causal-LM head.
    from transformers.models.auto import modeling_auto

    return (model_type in modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES
            and model_type not in modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def model_class(config, auto_class: str = "AutoModel"):
    """The transformers class that builds `config`: `auto_class` where it maps the config, else the config's own
    model class (no Auto class maps SigLIP's text towers: SiglipTextConfig -> SiglipTextModel)."""
    import transformers

    auto = getattr(transformers, auto_class)
    if auto_class != "AutoModel" or type(config) in auto._model_mapping:
        return auto  # (a task head's Auto class keeps its own error for a config it does not map)
    own = getattr(transformers, type(config).__name__.removesuffix("Config") + "Model", None)
    if own is None:
        raise ValueError(f"no transformers class builds a {config.model_type!r} model from its config")
    return own
