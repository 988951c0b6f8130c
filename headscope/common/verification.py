"""The verification every analysis stands on: recompute the attention first, say the result, exit 1 on a mismatch."""

from __future__ import annotations

import sys

import click

__all__ = ["verify_step", "finish"]


def verify_step(lm, *, enabled: bool = True, keep: list | None = None, images: list | None = None) -> dict:
    """Verify `lm`'s attention before an analysis, so every result says what it stands on.

    Returns {"summary", "passed", "max_abs_err"} for the output. A mismatch is reported on stderr
    and makes the command exit 1 after its output (`finish`); an architecture without a
    family is stated, not hidden. `keep`: a list that receives the `Verification` (for a report).
    `images`: verified on these images (an image model, or a vision–language decoder reading them).
    """
    from headscope import verify
    from headscope.probe.families import UnsupportedArchitecture, UnsupportedFeature

    if not enabled:
        return {"summary": "attention not verified (--no-verify)", "passed": None, "max_abs_err": None}
    try:
        v = verify(lm) if images is None else verify(lm, images=images)
    except (UnsupportedArchitecture, UnsupportedFeature) as exc:
        from headscope.probe.forward import hybrid_note

        hybrid = hybrid_note(lm)  # which layers of a hybrid stack have attention: every command's output says so
        return {"summary": f"attention not verified: {exc}" + (f"\n{hybrid}" if hybrid else ""), "passed": None,
                "max_abs_err": None}
    if keep is not None:
        keep.append(v)
    if not v.passed:
        click.echo(f"headscope: {v.summary()} — run `headscope verify --model {lm.name}` for the per-layer table",
                   err=True)
    return {"summary": v.summary(), "passed": v.passed, "max_abs_err": v.max_abs_err}


def finish(verification: dict) -> None:
    """Exit 1 when the attention behind the output failed verification (the output is still printed)."""
    if verification.get("passed") is False:
        sys.exit(1)
