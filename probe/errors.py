"""What a model can be refused for: no family covers its type, or it uses an attention feature that
the from-scratch attention does not reproduce. Both are errors, never a silent pass."""

__all__ = ["UnsupportedArchitecture", "UnsupportedFeature", "PlacementError"]


class UnsupportedArchitecture(ValueError):
    """No family for this model type."""


class UnsupportedFeature(ValueError):
    """The model uses an attention feature its family does not reproduce."""


class PlacementError(ValueError):
    """A model cannot be placed as asked: a bad device or memory budget, a GPU this machine lacks, an offload
    folder that is a file or cannot be written."""
