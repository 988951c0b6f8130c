"""What a family is: the `Family` a file of `probe/families/` declares, its stacks, its vision–language part and
the two-tower composites it reads, and the helpers every family's layer specs share.

A family is everything headscope knows about one kind of transformer attention, in one `Family` object: the model
types it covers, where its attention and output projection live (addressed by transformers' own module names), how
one layer's weights fill the from-scratch `LayerSpec`, the config features it refuses because it does not
reproduce them, and its tiny random test model. The registry that finds a family by name or model type, loading
only that family's file, is `probe.families`; this module imports no family.

An encoder–decoder family has three kinds of attention, each a `Stack` of layers in `stacks`:
"encoder" (bidirectional self-attention over the source), "decoder" (causal self-attention over
the target) and "cross" (target queries over the encoder's output). Its top-level `layer_spec`,
`attention` and `out_proj` are those of the encoder stack.

A vision–language decoder (LLaVA, Gemma 3, PaliGemma) is a text decoder that reads image tokens among its
text tokens; its `vision_language` (a `VisionLanguage`) holds its image encoder's layers as a "vision"
`Stack`, where each image token sits on its picture (`image_units`) and the decoder mask's bidirectional
blocks (`blocks`). Its top-level `layer_spec`, `attention` and `out_proj` are those of the decoder.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Literal

import torch

from .errors import UnsupportedArchitecture, UnsupportedFeature
from .placement import onloading
from .scratch import LayerSpec

if TYPE_CHECKING:
    from .mrope import MRope

__all__ = [
    "Family", "Refusal", "Kind", "Modality", "Stack", "StackKind", "VisionLanguage", "Towers", "TokenizerKind",
    "AutoClass", "UnsupportedArchitecture", "UnsupportedFeature", "NO_SOFTMAX_LAYER_TYPES", "softmax_layers",
    "linear_weights", "norm_eps",
]

Kind = Literal["encoder", "decoder", "encoder-decoder"]
TokenizerKind = Literal["wordpiece", "bytebpe", "sentencepiece"]
AutoClass = Literal["AutoModel", "AutoModelForCausalLM", "AutoModelForSeq2SeqLM", "AutoModelForImageTextToText"]
Modality = Literal["text", "image", "vision-language"]
StackKind = Literal["encoder", "decoder", "cross", "vision"]


# Layer types of hybrid stacks (transformers' `config.layer_types`) whose layers have no softmax attention:
# gated delta-net / Mamba / recurrent blocks ("linear_attention": Qwen3.5, Qwen3-Next, Jamba, Bamba, Falcon-H1,
# Granite hybrid, Zamba 2, RecurrentGemma) and short convolutions ("conv": LFM2). They return no attention weights.
NO_SOFTMAX_LAYER_TYPES = frozenset({"linear_attention", "conv", "mamba", "recurrent"})


def softmax_layers(config) -> tuple[int, ...]:
    """The model's own numbers of its layers with softmax attention: all of them, but in a hybrid stack only
    those whose `layer_types` entry is not one of `NO_SOFTMAX_LAYER_TYPES` (L3 stays L3, never renumbered).

    >>> from types import SimpleNamespace
    >>> softmax_layers(SimpleNamespace(num_hidden_layers=4, layer_types=["conv", "full_attention"] * 2))
    (1, 3)
    """
    n = config.num_hidden_layers
    kinds = getattr(config, "layer_types", None)
    if not kinds or len(kinds) < n:
        return tuple(range(n))
    return tuple(i for i in range(n) if kinds[i] not in NO_SOFTMAX_LAYER_TYPES)


@dataclass(frozen=True)
class Refusal:
    """A config feature the family does not reproduce: `reason(config)` says why it is refused, or None."""

    feature: str
    reason: Callable[[Any], str | None]


@dataclass(frozen=True)
class Stack:
    """One kind of attention of an encoder–decoder model, addressed as a family addresses its layers."""

    kind: StackKind
    layer_spec: Callable[[torch.nn.Module, int, Any], LayerSpec]  # (base_model, i, config) -> LayerSpec
    attention: Callable[[torch.nn.Module, int], torch.nn.Module]  # (base_model, i) -> module whose first input is x
    out_proj: Callable[[torch.nn.Module, int], torch.nn.Module]  # (base_model, i) -> W_O
    n_layers: Callable[[Any], int]  # config -> number of layers of this stack
    keys: Literal["self", "encoder"] = "self"  # keys and values from the layer's own input, or the encoder's output
    # The model's own numbers of this stack's layers where they are not 0 .. n_layers-1 (Mllama's decoder: its
    # self-attention layers skip the cross-attention ones, which are a stack of their own).
    layers: Callable[[Any], tuple[int, ...]] | None = None
    # Which keys each query sees where that depends on the input: (config, inputs, T, S) -> (B, T, S) bool, from
    # the processor's outputs `inputs` (`LayerSpec.visible`); None: the stack's own mask only.
    visible: Callable[[Any, dict, int, int], torch.Tensor] | None = None
    # Each position's rotary angles where they depend on the input: (config, inputs) -> (T, rotary_dim/2), from the
    # processor's outputs (Pixtral's 2-D (row, column) angles of each picture's patches, `LayerSpec.rotary_angles`);
    # None: the layer spec's own.
    angles: Callable[[Any, dict], torch.Tensor] | None = None
    # A cross stack hooked inside a one-pass forward: the keys' source out of the attention module's call,
    # (args, kwargs) -> (B, S, D) (Mllama's `cross_attention_states`).
    memory: Callable[[tuple, dict], torch.Tensor] | None = None

    def layer_numbers(self, config) -> tuple[int, ...]:
        """This stack's layers by the model's own numbers."""
        return tuple(self.layers(config)) if self.layers is not None else tuple(range(self.n_layers(config)))

    def for_input(self, spec: LayerSpec, config, inputs: dict | None, n_queries: int, n_keys: int) -> LayerSpec:
        """Layer `spec` of this stack for one input: the keys each query sees (`visible`) and each position's rotary
        angles (`angles`) where the stack declares them from the processor's outputs `inputs`."""
        if self.visible is not None:
            spec = replace(spec, visible=self.visible(config, inputs, n_queries, n_keys))
        if self.angles is not None:
            turned = self.angles(config, inputs)
            spec = replace(spec, rotary_angles=lambda T: turned[:T])
        return spec

    def __post_init__(self) -> None:  # a layer's weights read in memory where accelerate offloaded them
        object.__setattr__(self, "layer_spec", onloading(self.layer_spec, self.attention, self.out_proj))


@dataclass(frozen=True)
class VisionLanguage:
    """What a decoder that reads images adds to its text decoder: the image encoder and the image tokens' places.

    `vision` addresses the image encoder's layers on the base model (kind "vision"); `vision_family` names the
    image-encoder family that verifies them. `image_units(config, inputs, image)` gives image `image`'s units in
    token order, from the processor's outputs `inputs` for one text (with `inputs["picture_sizes"]`: each
    picture's (height, width) before the processor): an `ImagePatch` for a token on the picture,
    a label string for one that is not (`<image_newline>`, a CLS token). `blocks(config, token_type_ids, ids,
    layer)` gives the decoder mask's bidirectional blocks of one layer, (B, T) ids where a query and a key of one
    block >= 0 see each other both ways (Gemma 3's images, PaliGemma's prefix), or None (causal only).
    `tiny_processor(config, tokenizer)` builds the tiny model's processor (image processor, tokenizer, chat
    template); `text_config(config)` is the decoder's own config; `picture` the pixels of one picture where the
    processor's `pixel_values` are not one entry per picture (Idefics3's frames of a whole text,
    Qwen-VL's flattened patches).
    `decoder_at(model, config, ids, inputs)` gives a function that puts a decoder layer's `LayerSpec` at this
    input's own positions (Qwen-VL's 3-D rotary), or None (the spec's own positions are right).
    `vision_outputs(vision, base, config, inputs)`: a vision encoder whose attention returns no weights (Qwen-VL)
    is verified by this instead of hooks, on its block outputs recomputed with `vision`'s layers: each layer's
    relative |Δ| of the output after W_O.
    `load_processor(path, at)` loads the processor from a folder where AutoProcessor cannot build it (Qwen-VL's,
    LLaVA-OneVision's and SmolVLM's want a video processor, which needs torchvision: `_reading.load_images_only`).
    `as_reader(processor)` gives a loaded processor as one whose call encodes the text it is given, where the
    checkpoint's own call does not (ShieldGemma 2's builds its own policy prompts); None: the processor as loaded."""

    vision: Stack
    vision_family: str
    image_units: Callable[[Any, dict, int], list]
    tiny_processor: Callable[[Any, Any], Any]
    image_tokens: Callable[[Any], tuple[str, ...]]  # config -> the special tokens the tiny tokenizer must hold
    blocks: Callable[[Any, Any, Any, int], torch.Tensor | None] = lambda cfg, types, ids, layer: None
    text_config: Callable[[Any], Any] = lambda cfg: cfg.text_config
    # (config, inputs, image) -> image `image`'s pixels (3, H, W) as the model saw the whole picture; None: its
    # own `pixel_values[image]`, the first tile of a tiled one (LLaVA-NeXT's thumbnail)
    picture: Callable[[Any, dict, int], torch.Tensor] | None = None
    # A decoder whose layers are not all its text family's self-attention (Mllama): its own "decoder" stack and
    # the "cross" stack of text queries over the image's vision tokens; None: the family's layers, no cross.
    decoder: Stack | None = None
    cross: Stack | None = None
    # A cross reader: each cross-attention key's ImagePatch (or None) from (config, inputs), and the tanh of its
    # gates by layer from (base_model, config) — what scales each block's output before the residual stream.
    key_patches: Callable[[Any, dict], tuple] | None = None
    gates: Callable[[torch.nn.Module, Any], dict] | None = None
    decoder_at: Callable[[Any, Any, Any, Any], Callable[[LayerSpec], LayerSpec]] | None = None
    vision_outputs: Callable[[Stack, Any, Any, dict], list[float]] | None = None
    load_processor: Callable[[str, dict], Any] | None = None
    as_reader: Callable[[Any], Any] | None = None
    # Whether the bidirectional blocks see themselves whole past a sliding layer's window (PaliGemma's prefix:
    # transformers ORs the block into the windowed causal mask) or only within it (Gemma 3's images).
    block_past_window: bool = False

    def decoder_stack(self, family: Family) -> Stack:
        """The decoder's self-attention layers: the family's own `decoder` stack (Mllama), else the text family's
        layers, only those with softmax attention in a hybrid decoder."""
        return self.decoder or Stack(kind="decoder", layer_spec=family.layer_spec, attention=family.attention,
                                     out_proj=family.out_proj, n_layers=family.n_layers, layers=family.attention_layers)

    def hooked_stacks(self, family: Family) -> tuple[Stack, ...]:
        """The stacks one forward pass catches by hooks, in order: the vision tower (unless it returns no weights and
        is checked on its outputs, `vision_outputs`), the decoder, and the cross stack where there is one."""
        hooked = () if self.vision_outputs is not None else (self.vision,)
        return (*hooked, self.decoder_stack(family), *((self.cross,) if self.cross is not None else ()))

    def at_input(self, base, config, ids, inputs) -> Callable[[LayerSpec], LayerSpec]:
        """What puts a decoder layer's spec at this input's own positions (`decoder_at`: Qwen-VL's 3-D rotary), or
        the spec unchanged."""
        return (lambda spec: spec) if self.decoder_at is None else self.decoder_at(base, config, ids, inputs)

    def decoder_mask(self, spec: LayerSpec, cfg, token_type_ids, ids, layer: int) -> LayerSpec:
        """Decoder layer `layer`'s spec with this input's mask: its bidirectional blocks and how they meet the
        sliding window."""
        return replace(spec, blocks=self.blocks(cfg, token_type_ids, ids, layer),
                       block_past_window=self.block_past_window)


@dataclass(frozen=True)
class Towers:
    """Where a two-tower (image, text) composite keeps its towers: the composite model's attributes. What each tower
    is comes from its own config (`vision_config.model_type`, `text_config.model_type`), verified by its family."""

    image: str = "vision_model"  # the composite model's attribute holding the image tower
    text: str = "text_model"
    tiny_tokenizer: str | None = None  # the tiny model's tokenizer kind, where not the text family's


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # transformers' `config.model_type` values this family covers
    kind: Kind
    features: tuple[str, ...]  # what the from-scratch attention reproduces, for the docs and the CLI
    layer_spec: Callable[[torch.nn.Module, int, Any], LayerSpec]  # (base_model, i, config) -> LayerSpec
    attention: Callable[[torch.nn.Module, int], torch.nn.Module]  # (base_model, i) -> module whose first input is x
    out_proj: Callable[[torch.nn.Module, int], torch.nn.Module]  # (base_model, i) -> W_O; its input is the heads' concat
    refuses: tuple[Refusal, ...]  # checked in order; the first that applies is raised
    tiny_config: Callable[[int, str], Any]  # (vocab size, model type) -> config of that type's tiny random test model
    tokenizer: TokenizerKind | None  # the tiny tokenizer kind the tiny model is built with (None: an image model)
    auto_class: AutoClass  # the transformers Auto class that builds the tiny model
    position_embedding: Callable[[torch.nn.Module], torch.nn.Module] | None = None  # absolute positions, if any
    stacks: tuple[Stack, ...] = ()  # encoder-decoder only: the encoder, decoder and cross stacks, in that order
    # Vision transformers: the input is an image, cut into patches by the model's own embedding.
    modality: Modality = "text"
    # image models: the labels of the tokens before the patches (CLS, DeiT's distillation token, registers)
    prefix_tokens: Callable[[Any], tuple[str, ...]] = lambda cfg: ()
    tiny_processor: Callable[[Any], Any] | None = None  # image models: config -> the tiny model's image processor
    tiny_std: float = 0.2  # the spread of the tiny model's random weights (wider: attention far from uniform)
    vision_language: VisionLanguage | None = None  # a decoder that reads images too (LLaVA, Gemma 3, PaliGemma)
    # Two-tower composites (CLIP, SigLIP) whose image tower this family verifies: composite model type -> where its
    # towers live. Image and text towers never attend to each other (probe.towers); the registry finds a composite
    # by these keys (`probe.families.TOWERS`).
    towers: dict[str, Towers] = field(default_factory=dict, compare=False)
    # A decoder whose rotary reads multimodal 3-D positions (Qwen-VL's text decoders): its scheme, handed to
    # `probe.mrope` by the composite that runs it (None: 1-D rotary only).
    mrope: MRope | None = None

    def __post_init__(self) -> None:  # a layer's weights read in memory where accelerate offloaded them
        object.__setattr__(self, "layer_spec", onloading(self.layer_spec, self.attention, self.out_proj))

    def n_layers(self, config) -> int:
        return config.num_hidden_layers

    def attention_layers(self, config) -> tuple[int, ...]:
        """The layers with softmax attention, by the model's own numbers: every layer, except in a hybrid stack
        (`softmax_layers`), and in a decoder with cross-attention layers (Mllama) only its self-attention ones
        (`VisionLanguage.decoder`); only these have a LayerSpec, an attention module and an out-projection."""
        reading = self.vision_language
        if reading is not None and reading.decoder is not None:
            return reading.decoder.layer_numbers(config)
        return softmax_layers(config)

    def stack(self, kind: StackKind) -> Stack:
        """The stack of attention `kind` of an encoder–decoder family."""
        for s in self.stacks:
            if s.kind == kind:
                return s
        raise KeyError(f"family {self.name!r} has no {kind!r} stack (it is a {self.kind})")

    def require_attention_everywhere(self, config, what: str) -> None:
        """`UnsupportedFeature` naming `what` when some layers have no softmax attention (a hybrid stack): a
        decomposition over every layer's attention would miss what the other layers (Mamba, recurrent, ...) add."""
        have = self.attention_layers(config)
        if len(have) < self.n_layers(config):
            missing = ", ".join(str(i) for i in range(self.n_layers(config)) if i not in have)
            if self.vision_language is not None and self.vision_language.cross is not None:
                raise UnsupportedFeature(f"{what} needs self-attention heads in every layer; layers {missing} are "
                                         "cross-attention layers reading the image (their contribution is not decomposed "
                                         "into heads); verify, importance and ablate take this model")
            raise UnsupportedFeature(f"{what} needs softmax attention in every layer; layers {missing} of this hybrid "
                                     f"stack have none (their contribution is not decomposed into heads)")

    def shares_modules(self, base, config) -> bool:
        """True when several layers run one attention module object (ALBERT's shared layer)."""
        modules = [id(self.attention(base, i)) for i in self.attention_layers(config)]
        return len(set(modules)) < len(modules)

    def require_own_modules(self, base, config, what: str) -> None:
        """`UnsupportedFeature` naming `what` when layers share one module (ALBERT): `what` hooks each layer's
        block by its module, which cannot tell the repeats apart."""
        if self.shares_modules(base, config):
            raise UnsupportedFeature(f"{what} needs one module per layer; this model runs one shared layer module "
                                     f"{self.n_layers(config)} times (ALBERT)")

    def check(self, config) -> None:
        """Raise `UnsupportedFeature` when `config` uses a feature this family does not reproduce."""
        for refusal in self.refuses:
            reason = refusal.reason(config)
            if reason is not None:
                raise UnsupportedFeature(reason)


def linear_weights(m: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight, bias) of an nn.Linear, detached; bias None where the layer has none."""
    return m.weight.detach(), None if m.bias is None else m.bias.detach()


def norm_eps(norm: torch.nn.Module) -> float:
    """The epsilon of a transformers RMS norm module, under either of its names: `variance_epsilon` (Llama's
    norms; Gemma 3n / Gemma 4 / Llama 4 from transformers 5.25) or `eps` (those three up to 5.24, Gemma 3,
    Qwen3-Next); `UnsupportedArchitecture` naming the module when it has neither.

    >>> from types import SimpleNamespace
    >>> norm_eps(SimpleNamespace(variance_epsilon=1e-6)), norm_eps(SimpleNamespace(eps=1e-5))
    (1e-06, 1e-05)
    """
    for name in ("variance_epsilon", "eps"):
        value = getattr(norm, name, None)
        if isinstance(value, (int, float)):
            return float(value)
    raise UnsupportedArchitecture(f"{type(norm).__name__} has no epsilon under the names headscope knows "
                                  f"(variance_epsilon, eps): this transformers version renamed it; "
                                  f"install a transformers version headscope supports (see pyproject.toml)")


