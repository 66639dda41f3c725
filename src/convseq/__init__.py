"""convseq: convolutional sequence-to-sequence translation (fairseq's fconv) on Lightning + Hydra."""

__version__ = "0.1.0"
