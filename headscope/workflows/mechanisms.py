"""What a head writes and why it attends there: the decompositions and patching, composed for one question each.

    dla(lm, prompt, answer, wrong=None)      -> probe.attribution.DLAResult: the next-token logit
                                                (difference) split into embeddings, heads, MLPs, biases
    qk(lm, text, layer=, head=, query=, key=) -> probe.attribution.QKAttribution: one head's score for
                                                one query and key split over (query part, key part) pairs
    patch(lm, pairs, what=..., direction=...) -> analyses.patching.PatchResult: activation patching of
                                                every head (or layer) on clean/corrupt pairs, with its
                                                statistics

Each decomposition is an identity that sums back to the model's own number; each result carries the
error of that identity.
"""

from __future__ import annotations

from headscope.probe.attribution import DLAResult, direct_logit_attribution
from headscope.probe.model import LoadedModel

__all__ = ["dla"]


def dla(lm: LoadedModel, prompt: str, answer: str | int, wrong: str | int | None = None) -> DLAResult:
    """Direct logit attribution (decoders): the logit of `answer` after `prompt`, minus that of `wrong`
    if given, split into the residual stream's parts with the final norm's scale frozen at this run's
    value (`probe.attribution.direct_logit_attribution`). `.summary()` states the identity's error.

    >>> from headscope.probe.tiny import tiny_model
    >>> r = dla(tiny_model("gpt2"), "The cat sat on the", " mat")
    >>> r.identity_abs_err < 1e-5, r.grid().shape
    (True, (2, 4))
    """
    return direct_logit_attribution(lm, prompt, answer, wrong)
