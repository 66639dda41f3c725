"""tests/ddp_script.py with a tiny LightConv (DynamicConv) in place of its tiny fconv.

Run by tests/training/test_lightconv_training.py in a subprocess, with ddp_script's command line
(Lightning's DDP launcher starts rank 1 by re-running this one):

    python tests/training/lightconv_ddp_script.py CORPUS_DIR CACHE_DIR OUTPUT_DIR RECORD_DIR [KEY=VALUE ...]

ddp_script's model overrides are fconv's keys, which a LightConv config refuses; everything
else (recording, sigterm_at_step=K, the gloo launch) is ddp_script's own.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# model=lightconv_toy shrunk: 2 + 2 layers, width 16, kernels 3 and 5, 2 heads
TINY_LIGHTCONV = [
    "model=lightconv_toy",
    "model.encoder_embed_dim=16",
    "model.encoder_ffn_embed_dim=24",
    "model.encoder_attention_heads=2",
    "model.encoder_layers=2",
    "model.encoder_kernel_size_list=[3,5]",
    "model.decoder_embed_dim=16",
    "model.decoder_ffn_embed_dim=24",
    "model.decoder_attention_heads=2",
    "model.decoder_layers=2",
    "model.decoder_kernel_size_list=[3,5]",
    "model.dropout=0.0",
]

if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    import tests.ddp_script as script

    script.TINY = TINY_LIGHTCONV
    script.main()
