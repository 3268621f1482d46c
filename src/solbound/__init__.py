"""solbound: speed-of-light bounds for PyTorch programs."""
__version__ = "0.1.0"
from .api import analyze, analyze_source  # noqa: E402,F401
