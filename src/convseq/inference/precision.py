"""Reduced-precision generation: an opt-in copy of a model in bf16, or with int8 weights.

`for_generation(model, precision)` returns a new model for translating only; the model given
is left as it was (its weights, weight norm and dtype), so a training run or a caller keeps its
fp32 weights. Weight norm is folded into plain weights first (it is constant at inference; fconv
has it, LightConv has none, so there the folding finds nothing). Both model families take every
mode.

- ``fp32``: the model itself (the default; the hypotheses the reference search is judged on).
- ``bf16``: every weight and activation in bfloat16; log-probabilities, beam scores and the
  attention output stay float32 (the decoder casts its logits before the softmax). Why: on CPUs
  with AVX-512 BF16 a bf16 GEMM runs about twice as fast as fp32 and halves the weights' memory
  traffic.
- ``int8``: dynamic quantisation (as `torch.ao.quantization.quantize_dynamic`): every linear
  layer, and fconv's decoder convolutions' one-step products, multiply int8 weights (per output
  channel scales) with activations quantised per call; everything else stays fp32. Why: with
  AVX-512 VNNI an int8 GEMM is about 3x an fp32 one at generation's shapes; fconv's encoder
  convolutions (once per sentence) stay fp32. In a LightConv model the linear layers are nearly
  all its weights (input and output projections, feed-forward, encoder attention, the dynamic
  convolutions' kernel predictors, the vocabulary projection): all int8; the lightweight
  convolutions' kernels (K numbers per head) and the layer norms stay fp32.

Each mode needs its CPU instructions (bf16: AVX-512 BF16 or a CUDA device with bf16; int8: a CPU
with AVX-512 VNNI, and no CUDA); `check_precision` refuses clearly where they are missing.
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn
from torch.nn.utils import parametrize

from convseq.errors import ConvseqError
from convseq.modules.linearized_conv import LinearizedConvolution

PRECISIONS = ("fp32", "bf16", "int8")


class PrecisionError(ConvseqError, ValueError):
    """A precision this machine or device cannot run, an unknown one, or loss-scale settings
    that cannot work (training's fp16)."""


def check_precision(precision: str, device: torch.device | str = "cpu") -> None:
    """Raise PrecisionError unless ``precision`` can run on ``device`` here."""
    device = torch.device(device)
    if precision not in PRECISIONS:
        raise PrecisionError(f"gen.precision={precision!r}: choose one of {', '.join(PRECISIONS)}")
    if precision == "bf16":
        if device.type == "cuda":
            # the device in use, by its capability: torch.cuda.is_bf16_supported() asks about
            # the current device and counts emulation (slower than fp32) as support
            major, minor = torch.cuda.get_device_capability(device)
            if (major, minor) < (8, 0):
                raise PrecisionError(
                    f"gen.precision=bf16: {torch.cuda.get_device_name(device)} ({device}, "
                    f"compute capability {major}.{minor}) has no bf16 arithmetic (it needs 8.0, "
                    "Ampere or newer); use gen.precision=fp32"
                )
        elif not cpu_has("bf16"):
            raise PrecisionError(
                "gen.precision=bf16 needs a CPU with AVX-512 BF16 instructions (this one has "
                "none: bf16 would be emulated and slower than fp32); use gen.precision=fp32"
            )
    if precision == "int8":
        if device.type != "cpu":
            raise PrecisionError(
                f"gen.precision=int8 runs on the CPU only (dynamic quantisation), not on "
                f"{device}; use gen.precision=bf16 on a GPU"
            )
        if not cpu_has("vnni"):
            raise PrecisionError(
                "gen.precision=int8 needs a CPU with AVX-512 VNNI instructions (this one has "
                "none: int8 products would not be faster); use gen.precision=fp32"
            )


def device_type(accelerator: str | None) -> str:
    """ "cuda" or "cpu": where ``trainer.accelerator`` runs (``auto``: CUDA when present)."""
    accelerator = str(accelerator or "auto").lower()
    if accelerator in ("gpu", "cuda"):
        return "cuda"
    if accelerator == "auto" and torch.cuda.is_available():
        return "cuda"
    return "cpu"


def cpu_has(feature: str) -> bool:
    """Whether this CPU has AVX-512 BF16 (``bf16``) or AVX-512 VNNI (``vnni``)."""
    if feature == "bf16":
        return bool(torch.cpu._is_avx512_bf16_supported())
    return bool(torch.cpu._is_vnni_supported())


def for_generation(
    model: nn.Module, precision: str, device: torch.device | str | None = None
) -> nn.Module:
    """A copy of ``model`` for translating in ``precision`` (see the module docstring).

    ``fp32`` returns ``model`` itself. ``device``: where it will run (default: where its
    parameters are). Raises PrecisionError where the precision cannot run there.
    """
    if device is None:
        device = next(model.parameters()).device
    check_precision(precision, device)
    if precision == "fp32":
        return model
    out = fold_weight_norm(copy.deepcopy(model)).eval()
    if precision == "bf16":
        return out.to(torch.bfloat16)
    return quantize_int8(out)


def fold_weight_norm(model: nn.Module) -> nn.Module:
    """Replace every weight-normalised ``weight`` by its plain value, in place.

    Not `parametrize.remove_parametrizations`: it deletes the ``weight`` property from the
    module's parametrized class, which a deep copy shares with the original model.
    """
    for module in model.modules():
        if parametrize.is_parametrized(module, "weight"):
            weight = module.weight.detach().clone()  # g * v / ||v||, computed once
            delattr(module, "parametrizations")
            module.__class__ = module.__class__.__bases__[0]  # the unparametrized class
            module.weight = nn.Parameter(weight, requires_grad=False)
    return model


# -- int8 ----------------------------------------------------------------------------------------
def _packed_int8(weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """fbgemm's packed int8 weight of a (out, in) matrix, one symmetric scale per output row."""
    weight = weight.detach().float().contiguous()  # (out, in)
    scales = (weight.abs().amax(dim=1) / 127.0).clamp_min(1e-12).double()  # (out,)
    zeros = torch.zeros(weight.size(0), dtype=torch.long)
    with warnings.catch_warnings():  # torch 2.13 marks quantized tensors deprecated; they work
        warnings.simplefilter("ignore", UserWarning)
        qweight = torch.quantize_per_channel(weight, scales, zeros, 0, torch.qint8)
    return torch.ops.quantized.linear_prepack(qweight, None if bias is None else bias.detach())


class Int8Linear(nn.Module):
    """``x @ weight.T + bias`` with an int8 weight and the activation quantised per call."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.in_features, self.out_features = weight.size(1), weight.size(0)
        self._packed = _packed_int8(weight, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., in) -> (..., out), float32."""
        shape = x.shape
        flat = x.reshape(-1, shape[-1]).float().contiguous()  # (N, in)
        # reduce_range=False: with VNNI the int8 x int8 sums cannot saturate (fbgemm's x86 path)
        out = torch.ops.quantized.linear_dynamic(flat, self._packed, False)  # (N, out)
        return out.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


class Int8LinearizedConvolution(LinearizedConvolution):
    """A LinearizedConvolution whose one-step product uses an int8 copy of its weight.

    Full-sequence calls (never made while generating) keep the fp32 weight.
    """

    def quantize_step(self) -> Int8LinearizedConvolution:
        k = self.kernel_size[0]
        # the step multiplies (B, k * C_in) frames by the weight viewed as (k * C_in, C_out)
        weight = self.weight.detach().reshape(k * self.in_channels, self.out_channels)
        self._step_linear = Int8Linear(weight.t(), self.bias)  # (C_out, k * C_in)
        return self

    def _step_product(self, frames: torch.Tensor) -> torch.Tensor:
        return self._step_linear(frames)  # (B, C_out)


def quantize_int8(model: nn.Module) -> nn.Module:
    """Swap, in place, every nn.Linear for an Int8Linear and make every LinearizedConvolution's
    step int8 (weight norm must be folded first)."""
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Linear) and not parametrize.is_parametrized(child):
            setattr(model, name, Int8Linear(child.weight, child.bias))
        elif type(child) is LinearizedConvolution:
            child.__class__ = Int8LinearizedConvolution  # keeps its state key and buffers
            child.quantize_step()
        else:
            quantize_int8(child)
    return model
