"""pytest-neuron-support: does this Hugging Face Hub model run unmodified on AWS Trainium?"""

from __future__ import annotations

__version__ = "0.1.0"
