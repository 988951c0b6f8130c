"""headscope: the command line that wires probe -> analyses -> reports."""
__version__ = "0.1.0"
__all__ = ["__version__"]
