"""fairseq interoperability: load fairseq fconv checkpoints, write convseq models as them."""

from convseq.interop.fairseq import load_fairseq, save_fairseq
from convseq.interop.safe_load import ALLOWED_GLOBALS, read_checkpoint

__all__ = ["ALLOWED_GLOBALS", "load_fairseq", "read_checkpoint", "save_fairseq"]
