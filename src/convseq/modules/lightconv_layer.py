"""The LightConv / DynamicConv encoder and decoder layers (Wu et al. 2019), fairseq 0.12's
LightConvEncoderLayer and LightConvDecoderLayer in plain PyTorch, with fairseq's parameter names,
shapes, initialisation and order of operations.

An encoder layer is two residual blocks, each with a layer norm before it or after it
(``normalize_before``):

* the convolution block: input dropout, ``linear1`` (to ``conv_dim``, doubled and halved again by
  a GLU when ``glu``), padded positions zeroed, ``conv`` (lightweight or dynamic, centred),
  ``linear2`` back to ``embed_dim``, dropout;
* the feed-forward block: ``fc1``, ReLU, ReLU dropout, ``fc2``, dropout.

A decoder layer has the same blocks with a causal convolution, and between them an encoder
attention block (``encoder_attn``, dropout). Layer norms: ``layer_norm1`` / ``layer_norm2`` in the
encoder; ``conv_layer_norm``, ``encoder_attn_layer_norm``, ``final_layer_norm`` in the decoder.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from convseq.modules.dynamic_conv import DynamicConv1dTBC
from convseq.modules.lightweight_conv import LightweightConv1dTBC
from convseq.modules.linearized_conv import IncrementalState
from convseq.modules.multihead_attention import MultiheadAttention

CONV_TYPES = ("lightweight", "dynamic")


def xavier_linear(in_features: int, out_features: int, bias: bool = True) -> nn.Linear:
    """fairseq's ``Linear`` helper: Xavier-uniform weight, zero bias."""
    layer = nn.Linear(in_features, out_features, bias)
    nn.init.xavier_uniform_(layer.weight)
    if bias:
        nn.init.zeros_(layer.bias)
    return layer


def make_conv(
    conv_type: str,
    channels: int,
    kernel_size: int,
    padding_l: int,
    num_heads: int,
    weight_softmax: bool,
    weight_dropout: float,
) -> nn.Module:
    """The layer's convolution as fairseq builds it (no biases, no in_proj, no renorm)."""
    if conv_type == "lightweight":
        return LightweightConv1dTBC(
            channels,
            kernel_size,
            padding_l=padding_l,
            num_heads=num_heads,
            weight_dropout=weight_dropout,
            weight_softmax=weight_softmax,
        )
    if conv_type == "dynamic":
        return DynamicConv1dTBC(
            channels,
            kernel_size,
            padding_l=padding_l,
            num_heads=num_heads,
            weight_dropout=weight_dropout,
            weight_softmax=weight_softmax,
            # fairseq's layers build DynamicConv_scripatable, whose full forward (unfold form)
            # normalises over the last T taps when T < K with causal padding
            trim_short_kernel=True,
        )
    raise ValueError(f"conv_type: one of {', '.join(CONV_TYPES)}, got {conv_type!r}")


def keep_fairseq_conv_bias_entry(conv: nn.Module) -> None:
    """Give a bias-less dynamic convolution fairseq's ``conv_bias`` state-dict entry.

    fairseq's LightConv layers build DynamicConv_scripatable, which registers a (1, 1, C)
    ``conv_bias`` parameter even without a conv bias (never initialised, never used), so its
    checkpoints hold ``conv.conv_bias``. Ours has none: the entry is written as zeros and
    dropped on load, so that state dicts go both ways with ``strict=True``.
    """
    if not isinstance(conv, DynamicConv1dTBC) or conv.conv_bias is not None:
        return
    shape = (1, 1, conv.input_size)
    conv.register_state_dict_post_hook(partial(_write_conv_bias, shape=shape))
    conv.register_load_state_dict_pre_hook(partial(_drop_conv_bias, shape=shape))


def _write_conv_bias(module: nn.Module, state_dict: dict, prefix: str, _meta, shape) -> None:
    weight = module.weight_linear.weight
    state_dict[prefix + "conv_bias"] = weight.new_zeros(shape)  # (1, 1, C), fairseq's shape


def _drop_conv_bias(_module, state_dict: dict, prefix: str, *_args, shape) -> None:
    entry = state_dict.get(prefix + "conv_bias")
    if entry is not None and tuple(entry.shape) == shape:  # another shape: strict load refuses
        del state_dict[prefix + "conv_bias"]


def encoder_padding_l(kernel_size: int) -> int:
    """The encoder's centred padding, K // 2 for an odd K (fairseq's rule).

    fairseq gives an even K a (left, right) pair that its plain-PyTorch convolutions cannot
    take (only its CUDA kernels), so an even K is refused here rather than guessed.
    """
    if kernel_size % 2 == 0:
        raise ValueError(f"kernel_size: the encoder needs an odd kernel size, got {kernel_size}")
    return kernel_size // 2


class _ConvBlock(nn.Module):
    """Shared by both layers: the input projection, convolution and output projection, and the
    feed-forward block, with fairseq's names (``linear1``, ``conv``, ``linear2``, ``fc1``,
    ``fc2``) and construction order (so that one seed draws fairseq's values)."""

    def _build_conv_block(
        self,
        embed_dim: int,
        conv_dim: int,
        glu: bool,
        conv: tuple[str, int, int, int, bool, float],
    ) -> None:
        conv_type, kernel_size, padding_l, num_heads, weight_softmax, weight_dropout = conv
        self.embed_dim = embed_dim
        self.conv_dim = conv_dim
        self.glu = glu
        self.linear1 = xavier_linear(embed_dim, 2 * conv_dim if glu else conv_dim)
        self.conv = make_conv(
            conv_type, conv_dim, kernel_size, padding_l, num_heads, weight_softmax, weight_dropout
        )
        keep_fairseq_conv_bias_entry(self.conv)
        self.linear2 = xavier_linear(conv_dim, embed_dim)

    def _set_dropouts(
        self, dropout: float, relu_dropout: float, input_dropout: float, normalize_before: bool
    ) -> None:
        self.dropout = dropout
        self.relu_dropout = relu_dropout
        self.input_dropout = input_dropout
        self.normalize_before = normalize_before

    def _project_in(self, x: torch.Tensor) -> torch.Tensor:
        """(T, B, E) -> (T, B, conv_dim): input dropout, ``linear1``, GLU."""
        x = F.dropout(x, self.input_dropout, self.training)  # (T, B, E)
        x = self.linear1(x)  # (T, B, 2 * conv_dim) with GLU, else (T, B, conv_dim)
        return F.glu(x, dim=-1) if self.glu else x  # (T, B, conv_dim)

    def _project_out(self, x: torch.Tensor) -> torch.Tensor:
        """(T, B, conv_dim) -> (T, B, E): ``linear2``, dropout."""
        return F.dropout(self.linear2(x), self.dropout, self.training)  # (T, B, E)

    def _feed_forward(self, x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
        """The residual feed-forward block, with ``norm`` before or after it. (T, B, E)."""
        residual = x
        if self.normalize_before:
            x = norm(x)
        x = F.relu(self.fc1(x))  # (T, B, ffn_dim)
        x = F.dropout(x, self.relu_dropout, self.training)
        x = F.dropout(self.fc2(x), self.dropout, self.training)  # (T, B, E)
        x = residual + x
        return x if self.normalize_before else norm(x)

    def extra_repr(self) -> str:
        return (
            f"dropout={self.dropout}, relu_dropout={self.relu_dropout}, "
            f"input_dropout={self.input_dropout}, normalize_before={self.normalize_before}"
        )


class LightConvEncoderLayer(_ConvBlock):
    """One encoder layer: a centred convolution block and a feed-forward block (see the module).

    Args:
        embed_dim: E, the layer's input and output channels.
        conv_dim: the convolution's channels.
        ffn_dim: the feed-forward block's hidden channels.
        kernel_size: K, odd.
        num_heads: the convolution's heads.
        conv_type: ``lightweight`` or ``dynamic``.
        glu: ``linear1`` doubles to 2 * conv_dim and a GLU halves it.
        weight_softmax, weight_dropout: the convolution's kernel softmax and DropConnect.
        dropout, relu_dropout, input_dropout: as fairseq's (training only).
        normalize_before: layer norm before each block (else after the residual sum).
    """

    def __init__(
        self,
        embed_dim: int,
        conv_dim: int,
        ffn_dim: int,
        kernel_size: int,
        num_heads: int,
        conv_type: str = "lightweight",
        glu: bool = True,
        weight_softmax: bool = True,
        weight_dropout: float = 0.0,
        dropout: float = 0.0,
        relu_dropout: float = 0.0,
        input_dropout: float = 0.0,
        normalize_before: bool = False,
    ):
        super().__init__()
        padding_l = encoder_padding_l(kernel_size)
        conv = (conv_type, kernel_size, padding_l, num_heads, weight_softmax, weight_dropout)
        self._build_conv_block(embed_dim, conv_dim, glu, conv)
        self._set_dropouts(dropout, relu_dropout, input_dropout, normalize_before)
        self.fc1 = xavier_linear(embed_dim, ffn_dim)
        self.fc2 = xavier_linear(ffn_dim, embed_dim)
        self.layer_norm1 = nn.LayerNorm(embed_dim)
        self.layer_norm2 = nn.LayerNorm(embed_dim)

    def forward(
        self, x: torch.Tensor, encoder_padding_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """(T, B, E) -> (T, B, E); ``encoder_padding_mask`` (B, T) is True at pads, whose
        convolution inputs are zeroed (their outputs are not: the caller ignores them)."""
        residual = x
        if self.normalize_before:
            x = self.layer_norm1(x)
        x = self._project_in(x)  # (T, B, conv_dim)
        if encoder_padding_mask is not None:
            pads = encoder_padding_mask.to(torch.bool).transpose(0, 1).unsqueeze(2)  # (T, B, 1)
            x = x.masked_fill(pads, 0.0)  # (T, B, conv_dim)
        x = self._project_out(self.conv(x))  # (T, B, E)
        x = residual + x
        if not self.normalize_before:
            x = self.layer_norm1(x)
        return self._feed_forward(x, self.layer_norm2)


class LightConvDecoderLayer(_ConvBlock):
    """One decoder layer: a causal convolution block, encoder attention, a feed-forward block.

    Args: as `LightConvEncoderLayer`'s (any kernel size: the convolution is causal), and
        attention_dropout: dropout on the attention probabilities;
        encoder_attention: False builds no ``encoder_attn`` (a decoder without an encoder).

    ``need_attn`` (True by default, as fairseq's): whether forward returns the attention
    weights outside training.
    """

    def __init__(
        self,
        embed_dim: int,
        conv_dim: int,
        ffn_dim: int,
        kernel_size: int,
        num_heads: int,
        conv_type: str = "lightweight",
        glu: bool = True,
        weight_softmax: bool = True,
        weight_dropout: float = 0.0,
        dropout: float = 0.0,
        relu_dropout: float = 0.0,
        input_dropout: float = 0.0,
        attention_dropout: float = 0.0,
        normalize_before: bool = False,
        encoder_attention: bool = True,
    ):
        super().__init__()
        conv = (conv_type, kernel_size, kernel_size - 1, num_heads, weight_softmax, weight_dropout)
        self._build_conv_block(embed_dim, conv_dim, glu, conv)
        self._set_dropouts(dropout, relu_dropout, input_dropout, normalize_before)
        self.conv_layer_norm = nn.LayerNorm(embed_dim)
        self.encoder_attn: MultiheadAttention | None = None
        self.encoder_attn_layer_norm: nn.LayerNorm | None = None
        if encoder_attention:
            self.encoder_attn = MultiheadAttention(embed_dim, num_heads, dropout=attention_dropout)
            self.encoder_attn_layer_norm = nn.LayerNorm(embed_dim)
        self.fc1 = xavier_linear(embed_dim, ffn_dim)
        self.fc2 = xavier_linear(ffn_dim, embed_dim)
        self.final_layer_norm = nn.LayerNorm(embed_dim)
        self.need_attn = True

    def forward(
        self,
        x: torch.Tensor,
        encoder_out: torch.Tensor | None,
        encoder_padding_mask: torch.Tensor | None = None,
        incremental_state: IncrementalState | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(T, B, E) -> (T, B, E) and the (B, T, S) attention weights averaged over heads
        (None in training, without ``need_attn`` or without encoder attention).

        Args:
            encoder_out: (S, B, E) the encoder's output (may be None once an incremental state
                holds its projected keys and values).
            encoder_padding_mask: (B, S) True at padded source positions.
            incremental_state: with it, ``x`` holds the next T positions (one or several)
                after those fed before.
        """
        residual = x
        if self.normalize_before:
            x = self.conv_layer_norm(x)
        x = self._project_in(x)  # (T, B, conv_dim)
        x = self.conv(x, incremental_state=incremental_state)  # (T, B, conv_dim)
        x = residual + self._project_out(x)  # (T, B, E)
        if not self.normalize_before:
            x = self.conv_layer_norm(x)
        attn = None
        if self.encoder_attn is not None:
            x, attn = self._attend(x, encoder_out, encoder_padding_mask, incremental_state)
        return self._feed_forward(x, self.final_layer_norm), attn

    def _attend(
        self,
        x: torch.Tensor,
        encoder_out: torch.Tensor | None,
        encoder_padding_mask: torch.Tensor | None,
        incremental_state: IncrementalState | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The residual encoder-attention block: (T, B, E) and the (B, T, S) weights or None."""
        assert self.encoder_attn is not None and self.encoder_attn_layer_norm is not None
        residual = x
        if self.normalize_before:
            x = self.encoder_attn_layer_norm(x)
        x, attn = self.encoder_attn(
            x,
            encoder_out,
            encoder_out,
            key_padding_mask=encoder_padding_mask,
            incremental_state=incremental_state,
            need_weights=not self.training and self.need_attn,
        )  # (T, B, E), (B, T, S) or None
        x = residual + F.dropout(x, self.dropout, self.training)  # (T, B, E)
        if not self.normalize_before:
            x = self.encoder_attn_layer_norm(x)
        return x, attn

    def reorder_incremental_state(
        self, incremental_state: IncrementalState, new_order: torch.Tensor
    ) -> None:
        """Keep row ``new_order[i]``'s state as row ``i``: the convolution's input buffer and
        the attention's cached keys and values."""
        self.conv.reorder_incremental_state(incremental_state, new_order)
        if self.encoder_attn is not None:
            self.encoder_attn.reorder_incremental_state(incremental_state, new_order)

    def make_generation_fast_(self, need_attn: bool = False, **kwargs: object) -> None:
        """fairseq's hook: whether to return attention weights in generation."""
        self.need_attn = need_attn
