"""What a model can be refused for: no family covers its type, or it uses an attention feature that
the from-scratch attention does not reproduce. Both are errors, never a silent pass."""

__all__ = ["UnsupportedArchitecture", "UnsupportedFeature"]


class UnsupportedArchitecture(ValueError):
    """No family for this model type."""


class UnsupportedFeature(ValueError):
    """The model uses an attention feature its family does not reproduce."""
