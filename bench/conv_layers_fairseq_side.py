"""The fairseq side of bench/bench_conv_layers_vs_fairseq.py (runs in bench/fairseq-venv).

Standalone: it imports fairseq and torch only, never convseq, because it runs with the
benchmark-only fairseq environment's Python. It reads the cases the driver wrote (each layer's
constructor arguments, its state_dict, the input and the chunk sizes of the several-steps run),
builds fairseq 0.12's LightweightConv1dTBC or DynamicConv1dTBC, loads the state_dict with
strict=True and writes every form's output (fp32, eval mode), or the error a form raised; and
the full forward of the convolution fairseq's LightConv model builds (`model_conv`).

    bench/fairseq-venv/bin/python bench/conv_layers_fairseq_side.py --cases IN.pt --out OUT.pt
"""

from __future__ import annotations

from fairseq_cases_side import serve  # bench/, beside this script


def incremental(layer, x, sizes: list[int]):
    """fairseq's layer fed `sizes` positions at a time through one incremental state."""
    import torch

    state: dict = {}
    outs, start = [], 0
    for n in sizes:
        outs.append(layer(x[start : start + n], incremental_state=state))  # (n, B, C)
        start += n
    return torch.cat(outs)  # (T, B, C)


def model_conv(case: dict):
    """The convolution fairseq's LightConv layers build (models/lightconv.py:21-26, 726-743):
    the LightweightConv factory (LightweightConv1dTBC on CPU, its forward's default band form)
    or DynamicConv_scripatable (always its unfold form), the same state_dict loaded strictly."""
    from fairseq.modules import DynamicConv_scripatable, LightweightConv

    if case["layer"] == "lightweight":
        layer = LightweightConv(**case["kwargs"]).eval()
        state = case["state"]
    else:
        layer = DynamicConv_scripatable(**case["kwargs"]).eval()
        state = dict(case["state"])
        state["conv_bias"] = state["conv_bias"].view(1, 1, -1)  # its (1, 1, C) shape
    layer.load_state_dict(state, strict=True)
    return layer


def run_case(case: dict) -> dict:
    """Every form's output of one case: full unfold and band, and with causal padding one step
    at a time and several at once (the error fairseq raises, if it does)."""
    import torch
    from fairseq.modules.dynamic_convolution import DynamicConv1dTBC
    from fairseq.modules.lightweight_convolution import LightweightConv1dTBC

    cls = LightweightConv1dTBC if case["layer"] == "lightweight" else DynamicConv1dTBC
    layer = cls(**case["kwargs"]).eval()
    layer.load_state_dict(case["state"], strict=True)
    x = case["x"]  # (T, B, C)
    out: dict = {}
    with torch.no_grad():
        out["unfold"] = layer(x, unfold=True)
        out["band"] = layer(x, unfold=False)
        out["model"] = model_conv(case)(x)  # what fairseq's LightConv layers compute
        if case["causal"]:
            out["steps"] = incremental(layer, x, [1] * x.size(0))
            try:
                out["chunked"] = incremental(layer, x, case["chunks"])
            except Exception as e:  # fairseq issue 3908: several steps at once
                out["chunked_error"] = f"{type(e).__name__}: {e}"
    return out


if __name__ == "__main__":
    serve(run_case, __doc__.split("\n")[0])
