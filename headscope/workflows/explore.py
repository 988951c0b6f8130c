"""The live explorer's questions, answered for loaded models: what `headscope serve` puts behind its JSON API.

`Explorer(models)` holds the models a user passed on the command line and, per model, one attention
source, one lock (requests to one model are queued, never run at once) and the last few texts
(`source.live`, a `probe.live.LiveText`, so that a zoom into a long text reuses the layer input it caught)
and generations (`probe.lru.LRU`). The source and its live texts check what a request asks of the model
(layer, head, query rows); the explorer keeps to HTTP: the limits of a request and the JSON it answers.
Each method takes plain JSON values and returns a JSON-ready dict:

    models()                                    names, families, verified type, sizes
    attention(model, text, layer, head, rows=[start, stop] | None, keys=None, top_k=5)
                                                the query rows asked for (all of a short text), each
                                                row's top keys, the labels, verified
    overview(model, text, layer, head, tiles)   the whole map pooled into tiles (max, mean)
    explain(model, text, layer, head, query)    the explain terms of one cell's row (`probe.explain`)
    heads(model, text)                          the text's head metrics, layer × head
    generate(model, prompt, max_new_tokens, layer, head, chat, temperature, top_p, seed)
                                                each generated token's row (chat: each token's turn)
    needle(model, layer, head, needle=None, question=None, key=None, length=256, depth=0.5, seed=0)
                                                a needle prompt answered greedily (`workflows.retrieval.needle_hits`):
                                                the head's top-attended key at each step, which steps copied a needle
                                                token and where it hit, its retrieval score on the prompt

A vision–language decoder (LLaVA, Gemma 3, PaliGemma) reads a text with images: the server is started with
`images` (`headscope serve --image FILE`, read once at start), and attention, overview, explain and generate
take `images`, a list of indices into that startup list (one per image slot of the text, or placed before a
text without a slot). A request never names a path: the server reads no file the user did not name at start.
Their answers carry `images` (`reports.payload.image_payload`: each unit's cell on its picture, the pictures),
so the page draws the picture under the image units.

Every request is bounded (`Limits`): text length, rows per request, cells per response, tiles, so one
request cannot exhaust memory. A bad request raises `ExplorerError` with its HTTP status and one line.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from headscope.analyses.pooled import Pooler, top_keys
from headscope.probe.lru import LRU
from headscope.probe.model import LoadedModel
from headscope.probe.names import DEFAULT_ATTENTION, Attention, Level, Weight
from headscope.reports.payload import image_payload

__all__ = ["Explorer", "ExplorerError", "Limits", "unserved", "reads_images", "no_image_reader"]


class ExplorerError(ValueError):
    """A request the explorer refuses: `status` (400 bad, 404 unknown model, 413 too large) and one line."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Limits:
    """What one request may ask for (the memory budget of a request)."""

    max_chars: int = 100_000  # characters of a text (about 25,000 tokens of English)
    max_rows: int = 256  # query rows per /api/attention request
    max_cells: int = 2**21  # rows × keys per response (2 M weights, about 20 MB of JSON)
    max_tiles: int = 256  # tiles per side of an overview
    exact_tokens: int = 512  # a map this short may be asked for whole (rows = null)
    explain_tokens: int = 2048  # explain and head metrics: texts up to this many tokens
    max_new_tokens: int = 64
    keep_texts: int = 2  # texts kept per model
    max_images: int = 16  # images picked by one request (each is encoded and read by the vision tower)
    max_needle_tokens: int = 4096  # a needle prompt's length (its prefill's attention is length² per head)


@dataclass
class _Model:
    lm: LoadedModel
    source: Any
    texts: LRU  # _key(text, level, weight, images) -> LiveText
    generations: LRU  # _key(prompt, max_new_tokens, chat, temperature, top_p, seed, images) -> GenerationAttention,
    #                   _key("needle", needle, question, key, length, depth, seed) -> NeedleHits
    lock: threading.Lock = field(default_factory=threading.Lock)


def _verified(lm: LoadedModel) -> tuple[bool, str]:
    from headscope.probe.families import family_for

    try:
        family = family_for(lm.config)
    except Exception as exc:  # UnsupportedArchitecture / UnsupportedFeature: shown, not fatal
        return False, str(exc).splitlines()[0]
    return True, f"model type {lm.config.model_type!r} (family {family.name}) is verified from scratch"


def unserved(name: str, model_type: str | None) -> str | None:
    """Why the explorer cannot serve `name`, a model of `model_type` (one line), or None. It reads texts: an image
    model or a two-tower model would refuse every request, and so would a decoder that reads its images through
    cross-attention layers (`probe.forward.refuse_cross_reader`). A type it does not know (None) is served.
    Asked of a model's type before it loads (`headscope serve`) and of the loaded model (`Explorer`)."""
    from headscope.probe.families import SUPPORTED_TYPES
    from headscope.probe.images import TOWERS

    family = SUPPORTED_TYPES.get(model_type)
    if model_type in TOWERS or (family is not None and family.modality == "image"):
        return (f"{name} is {'a two-tower image-text' if model_type in TOWERS else 'an image'} model ({model_type}); "
                "the explorer reads texts: serve a text model or a vision–language decoder (headscope run --image "
                "FILE reads images)")
    if family is not None and family.vision_language is not None and family.vision_language.cross is not None:
        return (f"{name} reads its images through cross-attention layers ({model_type}); the explorer does not serve "
                "it yet: serve a text model or a vision–language decoder such as tiny:llava (headscope verify takes it)")
    return None


def reads_images(model_type: str | None) -> bool | None:
    """Whether a model of `model_type` reads images with its text (a vision–language decoder); None: unknown."""
    from headscope.probe.families import SUPPORTED_TYPES

    family = SUPPORTED_TYPES.get(model_type)
    return None if family is None else family.vision_language is not None


def no_image_reader(names) -> str:
    """The refusal of images given to models none of which reads them."""
    return (f"images were given, but no model served here reads images ({', '.join(names)}); serve a vision–language "
            "decoder (e.g. tiny:llava) with them, or leave out --image")


def _key(*values: Any) -> str:
    """A cache key of a request's JSON values, whatever they are: a value the model's code will refuse (a list
    where a number belongs) must reach that refusal, not fail as a key ("unhashable type: 'list'")."""
    import json

    return json.dumps(values)


def _pictures(live) -> dict:
    """`images` for a live text read with images (its map's cells and pictures); {} otherwise."""
    amap = getattr(live, "map", None)
    return {"images": image_payload(amap)} if amap is not None and amap.patches else {}


class Explorer:
    """The loaded `models` (name → LoadedModel) behind the explorer, each with its `attention` source."""

    def __init__(self, models: Mapping[str, LoadedModel], *, attention: Attention = DEFAULT_ATTENTION,
                 budget: int | None = None, limits: Limits = Limits(), images: Sequence[Any] = ()) -> None:
        from headscope.probe.images import check_images, image_name, load_image

        from headscope.probe.sources import source_for

        if not models:
            raise ValueError("give at least one model")
        for name, lm in models.items():
            why = unserved(name, lm.model_type)
            if why is not None:
                raise ValueError(why)
        if len(images) and not any(reads_images(lm.model_type) is not False for lm in models.values()):
            raise ValueError(no_image_reader(models))
        # the user's images, read once here: a request picks them by index and never names a file
        images = check_images(list(images)) if len(images) else []
        self._images = tuple(load_image(k, item) for k, item in enumerate(images))
        self._image_names = tuple(image_name(k, item) for k, item in enumerate(images))
        self.limits, self.attention_name, self.budget = limits, attention, budget
        self._models = {name: _Model(lm, source_for(lm, attention, budget=budget), LRU(limits.keep_texts),
                                     LRU(limits.keep_texts)) for name, lm in models.items()}

    # -- requests ----------------------------------------------------------------------------------

    def models(self) -> dict:
        out = []
        for name, m in self._models.items():
            ok, why = _verified(m.lm)
            c = m.lm.config
            out.append({"name": name, "model": m.lm.name, "type": getattr(c, "model_type", None),
                        "layers": c.num_hidden_layers, "heads": c.num_attention_heads, "causal": bool(m.lm.is_causal),
                        "verified": ok, "verification": why, "max_tokens": m.lm.max_length})
        return {"models": out, "attention": self.attention_name, "limits": vars(self.limits),
                "images": list(self._image_names)}

    def attention(self, model: str, text: str, layer: int, head: int, *, level: Level = "token",
                  weight: Weight = "attention", rows: list | None = None, keys: list | None = None,
                  top_k: int = 5, images: list | None = None) -> dict:
        m = self._model(model)
        with m.lock:
            live = self._live(model, m, text, level, weight, images)
            n = len(live)
            # the live text checks the rows against the text; the keys are the explorer's to slice
            start, stop = self._range(rows, n, "rows", whole=n <= self.limits.exact_tokens, bounded=False)
            if stop - start > self.limits.max_rows and not (rows is None and n <= self.limits.exact_tokens):
                raise ExplorerError(f"rows asks for {stop - start} rows; at most {self.limits.max_rows} per request",
                                    413)
            k0, k1 = self._range(keys, n, "keys", whole=True)
            if (stop - start) * (k1 - k0) > self.limits.max_cells:
                raise ExplorerError(f"{stop - start} rows × {k1 - k0} keys is more than {self.limits.max_cells:,} "
                                    "weights; ask for fewer rows or a key range", 413)
            weights = self._call(live.rows, layer, head, start, stop)
            top = top_keys(weights, self._int(top_k, "top_k", 1, 100), query_start=start)
            return {"model": model, "labels": list(live.labels), "n_tokens": n, "rows": [start, stop],
                    "keys": [k0, k1], "weights": weights[:, k0:k1].tolist(), "top": top.to_dict(),
                    "verified": _verified(m.lm)[0], **self._how(live), **_pictures(live)}

    def overview(self, model: str, text: str, layer: int, head: int, *, tiles: int = 64, level: Level = "token",
                 weight: Weight = "attention", images: list | None = None) -> dict:
        m = self._model(model)
        tiles = self._int(tiles, "tiles", 1, self.limits.max_tiles)
        with m.lock:
            live = self._live(model, m, text, level, weight, images)
            n = len(live)
            pooler = Pooler(n_queries=n, n_keys=n, tiles=tiles, layer=layer, head=head)
            self._call(lambda: [pooler.consume(block) for block in live.blocks(layer, head)])
            return {"model": model, "labels": list(live.labels), "n_tokens": n, "tiles": pooler.result().to_dict(6),
                    "verified": _verified(m.lm)[0], **self._how(live), **_pictures(live)}

    def explain(self, model: str, text: str, layer: int, head: int, query: int, images: list | None = None) -> dict:
        from headscope.probe.explain import explain

        m = self._model(model)
        with m.lock:
            live = self._live(model, m, text, "token", "attention", images)
            self._short(live, "explain")
            q = self._int(query, "query", 0, len(live) - 1)
            pictures = {"images": list(self._picked(images))} if images else {}
            e = self._call(explain, m.lm, text, token=q, layer=layer, head=head, attention=self.attention_name,
                           budget=self.budget, **pictures)
            table = e.table.astype(object).where(e.table.notna(), None)
            return {"model": model, "query": e.query, "query_index": e.query_index, "layer": layer, "head": head,
                    "scale": e.scale, "summary": e.summary(), "keys": table.to_dict(orient="records")}

    def heads(self, model: str, text: str, *, level: Level = "token", images: list | None = None) -> dict:
        from headscope.workflows.heads import heads

        m = self._model(model)
        if self._picked(images):  # not the text alone's metrics under the pictures' name
            raise ExplorerError("head metrics here are a text's alone; for a text with images run "
                                "headscope heads --model M --image FILE --text TEXT, or untick the images")
        with m.lock:
            live = self._live(model, m, text, "token", "attention")
            self._short(live, "head metrics")
            scores = self._call(heads, m.lm, [text], level=level, induction_sequences=0,
                                attention=self.attention_name, budget=self.budget)
            table = scores.table.dropna(subset=["value"])
            grid = {metric: [[None] * scores.n_heads for _ in range(scores.n_layers)] for metric in scores.metrics}
            for r in table.itertuples(index=False):
                if r.layer < scores.n_layers:
                    grid[r.metric][r.layer][r.head] = float(r.value)
            return {"model": model, "layers": scores.n_layers, "heads": scores.n_heads, "metrics": grid}

    def generate(self, model: str, prompt: str, *, layer: int, head: int, max_new_tokens: int = 10,
                 chat: bool = False, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
                 images: list | None = None) -> dict:
        from headscope.probe.generate import chat_prompt, generate_attention

        m = self._model(model)
        self._text(prompt)
        n = self._int(max_new_tokens, "max_new_tokens", 1, self.limits.max_new_tokens)
        if not isinstance(chat, bool):
            raise ExplorerError(f"chat must be true or false, got {chat!r}")
        picked = self._picked(images)
        if picked and chat:
            raise ExplorerError("a prompt with images takes the processor's chat template already; leave chat off")
        with m.lock:
            def generated():
                text, turns = chat_prompt(m.lm, [{"role": "user", "content": prompt}]) if chat else (prompt, None)
                return generate_attention(m.lm, text, max_new_tokens=n, temperature=temperature, top_p=top_p,
                                          seed=seed, turns=turns, **({"images": list(picked)} if picked else {}))

            key = _key(prompt, n, chat, temperature, top_p, seed, images if picked else [])
            gen = self._call(m.generations.get, key, generated)
            rows = self._call(gen.head_rows, layer, head)
            return {"model": model, "prompt_labels": list(gen.prompt.labels), "tokens": list(gen.generated_tokens),
                    "turns": list(gen.prompt_turns), "sampling": gen.sampling, "stopped": gen.stopped,
                    "rows": [row.tolist() for row in rows],
                    **({"images": image_payload(gen.prompt)} if gen.prompt.patches else {})}

    def needle(self, model: str, layer: int, head: int, *, needle: str | None = None, question: str | None = None,
               key: str | None = None, length: int = 256, depth: float = 0.5, seed: int = 0) -> dict:
        from headscope.workflows.retrieval import needle_hits

        m = self._model(model)
        c = m.lm.config
        layer = self._int(layer, "layer", 0, c.num_hidden_layers - 1)
        head = self._int(head, "head", 0, c.num_attention_heads - 1)
        for name, value in (("needle", needle), ("question", question), ("key", key)):
            if value is not None and not isinstance(value, str):
                raise ExplorerError(f"{name} must be a string or null, got {value!r}")
            if value is not None and len(value) > self.limits.max_chars:
                raise ExplorerError(f"the {name} has {len(value):,} characters; at most {self.limits.max_chars:,}", 413)
        # past the model's context the workflow says so (400); within it, past this server's bound: 413
        if (isinstance(length, int) and not isinstance(length, bool)
                and self.limits.max_needle_tokens < length <= m.lm.max_length):
            raise ExplorerError(f"length asks for a needle prompt of {length:,} tokens; at most "
                                f"{self.limits.max_needle_tokens:,} here", 413)
        with m.lock:
            # an empty key is none; the question and key are a typed needle's (null: a generated needle)
            key = (key.strip() or None) if isinstance(key, str) else key
            key_ = _key("needle", needle, question, key, length, depth, seed)
            found = self._call(m.generations.get, key_, lambda: needle_hits(
                m.lm, statement=needle, question=question, key=key, length=length, depth=depth, seed=seed))
            n = found.needle
            return {"model": model, "labels": list(found.labels), "span": list(found.span),
                    "needle": {"sentence": n.statement, "question": n.question, "key": n.key or None,
                               "length": n.length, "depth": n.depth, "generated": n.phrasing >= 0},
                    "tokens": list(found.tokens), "answer": found.answer, "retrieved": found.retrieved,
                    **found.head(layer, head)}

    # -- helpers -----------------------------------------------------------------------------------

    def _model(self, name: Any) -> _Model:
        if not isinstance(name, str) or name not in self._models:
            raise ExplorerError(f"model {name!r} is not served; this server has {', '.join(self._models)}", 404)
        return self._models[name]

    def _text(self, text: Any) -> str:
        if not isinstance(text, str) or not text.strip():
            raise ExplorerError("text must be a non-empty string")
        if len(text) > self.limits.max_chars:
            raise ExplorerError(f"the text has {len(text):,} characters; at most {self.limits.max_chars:,}", 413)
        return text

    def _live(self, name: str, m: _Model, text: Any, level: Any, weight: Any, images: Any = None):
        text = self._text(text)
        picked = self._picked(images)
        if picked and (level, weight) != ("token", "attention"):
            raise ExplorerError("a text with images is read at level token, weight attention")
        # a text with images: its whole eager map, the image tokens carrying their cells
        return self._call(m.texts.get, _key(text, level, weight, images if picked else []),
                          lambda: m.source.live(text, level=level, weight=weight, images=picked))

    def _picked(self, images: Any) -> tuple:
        """The startup images a request picks by index (a list of whole numbers); () for none."""
        if images is None or images == []:
            return ()
        if not isinstance(images, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in images):
            raise ExplorerError("images must be a list of indices into the --image files the server was started "
                                f"with; a request never names a file, got {images!r}")
        if not self._images:
            raise ExplorerError("this server was started without images; start it with --image FILE (repeatable) "
                                "and pick them here by index")
        if len(images) > self.limits.max_images:
            raise ExplorerError(f"a request picks at most {self.limits.max_images} images, got {len(images):,}", 413)
        bad = [i for i in images if not 0 <= i < len(self._images)]
        if bad:
            raise ExplorerError(f"images {bad} are not among the {len(self._images)} image(s) the server was started "
                                f"with (indices 0..{len(self._images) - 1})")
        return tuple(self._images[i] for i in images)

    def _short(self, live, what: str) -> None:
        if len(live) > self.limits.explain_tokens:
            raise ExplorerError(f"{what} covers texts of up to {self.limits.explain_tokens:,} tokens; this one has "
                                f"{len(live):,}", 413)

    @staticmethod
    def _int(value: Any, name: str, low: int, high: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ExplorerError(f"{name} must be a whole number in {low}..{high}, got {value!r}")
        return value

    def _range(self, value: Any, n: int, name: str, *, whole: bool, bounded: bool = True) -> tuple[int, int]:
        """`value` as (start, stop): [start, stop] or null (the whole text where `whole`); `bounded`: checked
        against the text here (keys, which only the explorer slices; rows are the live text's to check)."""
        if value is None:
            if not whole:
                raise ExplorerError(f"the text has {n:,} tokens; give {name} as [start, stop] (at most "
                                    f"{self.limits.max_rows} rows), or ask /api/overview for the whole map", 413)
            return 0, n
        if (not isinstance(value, list) or len(value) != 2 or any(isinstance(v, bool) or not isinstance(v, int)
                                                                  for v in value)):
            raise ExplorerError(f"{name} must be [start, stop] (whole numbers) or null, got {value!r}")
        start, stop = value
        if bounded and not 0 <= start < stop <= n:
            raise ExplorerError(f"{name} [{start}, {stop}] is outside the text: 0 <= start < stop <= {n}")
        return start, stop

    @staticmethod
    def _call(fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ExplorerError:
            raise
        except (TypeError, ValueError) as exc:
            raise ExplorerError(" ".join(str(exc).split()) or type(exc).__name__) from None

    @staticmethod
    def _how(live) -> dict:
        return {"mode": live.mode, "check": live.check}
