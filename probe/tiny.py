"""Tiny randomly initialised models of each family, with tokenizers made on the spot (the same every time).

Each family declares its tiny config, tokenizer kind and Auto class in `probe/families/`.

For tests and examples that must run in seconds with no download, as transformers' own tests do.
Weights are drawn wider than the usual init so that attention is far from uniform — a from-scratch
bug then shows up as a real mismatch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import torch

from .families import FAMILIES, SUPPORTED_TYPES, TOWERS, Family, TokenizerKind
from .model import LoadedModel, model_class

__all__ = ["tiny_model", "tiny_tokenizer", "save_tiny", "TINY_CORPUS", "TINY_TYPES", "tiny_types"]

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


def tiny_tokenizer(kind: TokenizerKind):
    """A fast tokenizer of the given kind, made in milliseconds from `TINY_CORPUS`: the same one on every call."""
    from tokenizers import ByteLevelBPETokenizer, SentencePieceBPETokenizer, processors
    from tokenizers.implementations import BertWordPieceTokenizer
    from transformers import PreTrainedTokenizerFast

    corpus = list(TINY_CORPUS) * 4
    if kind == "wordpiece":
        # Built, not trained: the WordPiece trainer breaks ties between equally frequent pairs in hash order,
        # so each training gave another vocabulary (and other token ids) — in every process and every call.
        raw = BertWordPieceTokenizer(_wordpiece_vocab(), lowercase=True)
        cls_id, sep_id = raw.token_to_id("[CLS]"), raw.token_to_id("[SEP]")
        raw.post_processor = processors.BertProcessing(("[SEP]", sep_id), ("[CLS]", cls_id))
        return PreTrainedTokenizerFast(tokenizer_object=raw._tokenizer, cls_token="[CLS]", sep_token="[SEP]",
                                       pad_token="[PAD]", unk_token="[UNK]", mask_token="[MASK]")
    if kind == "bytebpe":
        raw = ByteLevelBPETokenizer(trim_offsets=True)
        raw.train_from_iterator(corpus, vocab_size=400, show_progress=False, special_tokens=["<|endoftext|>"])
        return PreTrainedTokenizerFast(tokenizer_object=raw._tokenizer, eos_token="<|endoftext|>",
                                       bos_token="<|endoftext|>")
    if kind == "sentencepiece":
        raw = SentencePieceBPETokenizer()
        raw.train_from_iterator(corpus, vocab_size=400, show_progress=False, special_tokens=["<pad>", "<eos>", "<bos>", "<unk>"])
        bos = raw.token_to_id("<bos>")
        raw.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", bos)])
        return PreTrainedTokenizerFast(tokenizer_object=raw._tokenizer, bos_token="<bos>", eos_token="<eos>",
                                       pad_token="<pad>", unk_token="<unk>")
    raise ValueError(f"unknown tokenizer kind {kind!r}")


def _wordpiece_vocab() -> dict[str, int]:
    """A WordPiece vocabulary fixed by `TINY_CORPUS` alone: the special tokens, the corpus's characters and
    the ASCII letters and digits (alone and as `##` continuations), then the corpus's words of up to five
    characters, most frequent first (ties in alphabetical order). Longer words and words outside the
    corpus are split into pieces (`animal` -> `a ##n ##i ##m ##a ##l`), as a sub-word vocabulary does."""
    import string
    from collections import Counter

    from tokenizers.normalizers import BertNormalizer
    from tokenizers.pre_tokenizers import BertPreTokenizer

    normalizer, split = BertNormalizer(lowercase=True), BertPreTokenizer()
    words = Counter(w for text in TINY_CORPUS for w, _ in split.pre_tokenize_str(normalizer.normalize_str(text)))
    chars = sorted({c for w in words for c in w} | set(string.ascii_lowercase + string.digits))
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *(f"##{c}" for c in chars)]
    tokens += [w for w, _ in sorted(words.items(), key=lambda wc: (-wc[1], wc[0])) if len(w) <= 5 and w not in chars]
    return {t: i for i, t in enumerate(tokens)}


def _family(name: str, *, as_type: bool = False) -> Family:
    if as_type and name in SUPPORTED_TYPES:  # `tiny:gemma3` is the model type (Gemma 3 with vision), not the family
        return SUPPORTED_TYPES[name]
    if name in FAMILIES:
        return FAMILIES[name]
    if name in SUPPORTED_TYPES:
        return SUPPORTED_TYPES[name]
    raise ValueError(f"unknown family or model type {name!r}; choose a family ({', '.join(FAMILIES)}) "
                     f"or a model type ({', '.join(tiny_types())})")


def tiny_types() -> tuple[str, ...]:
    """Every model type a tiny model is made of: the verified ones and the two-tower composites of verified towers,
    as the family files declare them now (read when asked: importing this module reads no family file)."""
    return tuple(sorted({*SUPPORTED_TYPES, *TOWERS}))


def __getattr__(name: str):
    if name == "TINY_TYPES":  # the types as they stand when asked
        return tiny_types()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _tiny_towers(model_type: str, *, seed: int, **config_overrides) -> LoadedModel:
    """A two-tower model (`probe.families.TOWERS`) made of its towers' tiny configs, each tower's weights drawn
    with its own family's spread, with a tiny tokenizer and the image tower's tiny processor."""
    from transformers import AutoConfig, AutoModel

    spec, default = TOWERS[model_type], AutoConfig.for_model(model_type)
    image_type, text_type = default.vision_config.model_type, default.text_config.model_type
    image, text = SUPPORTED_TYPES[image_type], SUPPORTED_TYPES[text_type]
    tok = tiny_tokenizer(spec.tiny_tokenizer or text.tokenizer)
    text_cfg = text.tiny_config(len(tok), text_type)
    text_cfg.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    text_cfg.bos_token_id, text_cfg.eos_token_id = tok.bos_token_id, tok.eos_token_id
    image_cfg = image.tiny_config(0, image_type)
    cfg = AutoConfig.for_model(model_type, text_config=text_cfg.to_dict(), vision_config=image_cfg.to_dict(),
                               **({"projection_dim": 16} if model_type == "clip" else {}))
    for key, value in config_overrides.items():
        setattr(cfg, key, value)
    torch.manual_seed(seed)
    model = AutoModel.from_config(cfg, attn_implementation="eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, image.tiny_std if name.startswith(spec.image + ".") else text.tiny_std)
    model.eval()
    return LoadedModel(name=f"tiny-{model_type}", model=model, tokenizer=tok, source="random init",
                       dtype=torch.float32, device=torch.device("cpu"),
                       processor=image.tiny_processor(model.config.vision_config))


def tiny_model(name: str, *, seed: int = 0, std: float | None = None, as_type: bool = False,
               **config_overrides) -> LoadedModel:
    """A `LoadedModel` of a 2-3 layer random model of family (or model type) `name`, ready for extract() and verify().

    >>> lm = tiny_model("llama")
    >>> lm.config.num_hidden_layers, lm.is_causal
    (2, True)
    """

    if name in TOWERS:
        if std is not None:
            raise ValueError(f"{name} is a two-tower model: each tower's weights have its own family's spread")
        return _tiny_towers(name, seed=seed, **config_overrides)
    family = _family(name, as_type=as_type)  # as_type: `name` is a model type first (loading's `tiny:TYPE`)
    std = family.tiny_std if std is None else std
    tok = None if family.tokenizer is None else tiny_tokenizer(family.tokenizer)  # an image model has none
    model_type = name if SUPPORTED_TYPES.get(name) is family else family.model_types[0]
    reading = family.vision_language
    if reading is not None:  # a decoder that reads images: its image tokens are the tokenizer's last ones
        tok.add_special_tokens({"additional_special_tokens": list(reading.image_tokens(None))})
    cfg = family.tiny_config(0 if tok is None else len(tok), model_type)
    for key, value in config_overrides.items():
        setattr(cfg, key, value)
    if tok is not None:
        cfg.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else 0
        cfg.bos_token_id, cfg.eos_token_id = tok.bos_token_id, tok.eos_token_id
    torch.manual_seed(seed)
    cls = model_class(cfg, family.auto_class)
    build = cls.from_config if hasattr(cls, "from_config") else cls._from_config  # an Auto class | a model class
    model = build(cfg, attn_implementation="eager")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, std)
    model.eval()
    processor = None if family.tiny_processor is None else family.tiny_processor(cfg)
    if reading is not None:
        processor = reading.tiny_processor(cfg, tok)
    return LoadedModel(name=f"tiny-{family.name}", model=model, tokenizer=tok, source="random init",
                       dtype=torch.float32, device=torch.device("cpu"), processor=processor)


def save_tiny(lm: LoadedModel, folder, *, layout: Literal["hub", "nested"] = "hub") -> Path:
    """Save tiny model `lm` into `folder` with every file a hub download of its kind carries, to load by path.

    The weights, `config.json`, `generation_config.json` (a generating model), the tokenizer's files and the
    processor's. A vision–language model's processor is saved as its hub folders lay it out, under the processor
    class transformers maps its model type to (SmolVLM's own, where the tiny model reads with Idefics3's):
    `layout="hub"`: `preprocessor_config.json`, `video_preprocessor_config.json` where that class takes a video
    processor, `chat_template.json`, and `processor_config.json` for the processor's own settings;
    `layout="nested"`: one `processor_config.json` holding the image and video processors (what
    `save_pretrained` writes today) and `chat_template.jinja`.
    """
    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ValueError(f"{folder} is {'a file' if not folder.is_dir() else 'a folder with files in it'}; a tiny "
                         "model is saved into a new or empty folder (its config.json, weights and tokenizer would "
                         "replace files there)")
    lm.model.save_pretrained(folder)
    if lm.processor is not None:
        lm.processor.save_pretrained(folder)
    if lm.tokenizer is not None and not hasattr(lm.processor, "tokenizer"):  # a processor saves its own tokenizer
        lm.tokenizer.save_pretrained(folder)
    if lm.reads_images:
        _hub_processor_files(folder, lm.model_type, layout)
    return folder


def _hub_processor_files(folder: Path, model_type: str, layout: str) -> None:
    """Rewrite the processor's `processor_config.json` as `layout` lays out a hub folder of `model_type`."""
    import transformers
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    saved = folder / "processor_config.json"
    settings = json.loads(saved.read_text())
    image = settings.pop("image_processor")
    kind = PROCESSOR_MAPPING_NAMES.get(model_type) or settings["processor_class"]
    settings["processor_class"] = kind
    video = None
    if "video_processor" in getattr(transformers, kind).get_attributes():
        # the video processor's settings as hub folders hold them: the image processor's, under the video type
        named = {"Qwen2_5_VLProcessor": "Qwen2VLVideoProcessor"}.get(kind, kind.removesuffix("Processor") + "VideoProcessor")
        video = {**{k: v for k, v in image.items() if k != "image_processor_type"}, "video_processor_type": named}
    template = folder / "chat_template.jinja"
    if layout == "nested":
        saved.write_text(json.dumps({"image_processor": image, **({"video_processor": video} if video else {}),
                                     **settings}, indent=2))
        return
    (folder / "preprocessor_config.json").write_text(json.dumps({**image, "processor_class": kind}, indent=2))
    if video is not None:
        (folder / "video_preprocessor_config.json").write_text(json.dumps({**video, "processor_class": kind}, indent=2))
    if template.is_file():
        (folder / "chat_template.json").write_text(json.dumps({"chat_template": template.read_text()}, indent=2))
        template.unlink()
    saved.write_text(json.dumps(settings, indent=2))
