"""The fairseq side of bench/bench_lightconv_layers_vs_fairseq.py (runs in bench/fairseq-venv).

Standalone: it imports fairseq and torch only, never convseq. For each case it builds fairseq
0.12's LightConvDecoderLayer (weight softmax, GLU, dropout 0), loads the driver's state_dict with
strict=True and writes the full forward in train and in eval mode and the output fed one
position at a time through its incremental state (fp32).

    bench/fairseq-venv/bin/python bench/lightconv_layers_fairseq_side.py --cases IN.pt --out OUT.pt
"""

from __future__ import annotations

import argparse

from fairseq_cases_side import serve  # bench/, beside this script


def run_case(case: dict) -> dict:
    import torch
    from fairseq.models.lightconv import LightConvDecoderLayer

    args = argparse.Namespace(
        decoder_embed_dim=case["E"],
        decoder_conv_dim=case["CONV"],
        decoder_ffn_embed_dim=case["FFN"],
        decoder_attention_heads=case["H"],
        decoder_conv_type=case["conv_type"],
        decoder_glu=True,
        weight_softmax=True,
        decoder_normalize_before=False,
        weight_dropout=0.0,
        dropout=0.0,
        relu_dropout=0.0,
        input_dropout=0.0,
        attention_dropout=0.0,
    )
    layer = LightConvDecoderLayer(args, kernel_size=case["K"])
    layer.load_state_dict(case["state"], strict=True)
    x, enc, mask = case["x"], case["encoder_out"], case["mask"]
    out: dict = {}
    with torch.no_grad():
        out["train"] = layer.train()(x, enc, mask, None)[0]  # (T, B, E)
        out["eval"] = layer.eval()(x, enc, mask, None)[0]
        state: dict = {}
        steps = [layer(x[t : t + 1], enc, mask, state)[0] for t in range(x.size(0))]
        out["steps"] = torch.cat(steps)
    return out


if __name__ == "__main__":
    serve(run_case, __doc__.split("\n")[0])
