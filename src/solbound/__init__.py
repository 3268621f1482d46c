"""solbound: speed-of-light bounds for PyTorch programs."""
__version__ = "0.1.0"
