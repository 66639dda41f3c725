"""fconv's layer constructors, with fairseq's initialisation and weight normalisation.

``p`` is the dropout probability applied to a layer's input, so ``1 - p`` is the keep
probability; the std formulas keep activation variance constant through dropout and GLU
(Gehring et al. 2017, section 3.5):

====================  ==========================  ==================
layer                 weight std                  weight norm dim
====================  ==========================  ==================
token / position emb  0.1 (pad row 0)             none
Linear                sqrt((1 - p) / in)          0  (g: (out, 1))
TBC conv (feeds GLU)  sqrt(4 (1 - p) / (k in))    2  (g: (1, 1, out))
====================  ==========================  ==================

Biases start at 0.
"""

from __future__ import annotations

import math

from torch import nn

from convseq.modules.conv_tbc import ConvTBC
from convseq.modules.linearized_conv import LinearizedConvolution
from convseq.modules.positional import LearnedPositionalEmbedding
from convseq.modules.weight_norm import apply_weight_norm


def embedding(num_embeddings: int, embedding_dim: int, padding_idx: int) -> nn.Embedding:
    """Token embeddings ~ N(0, 0.1) with the pad row zero."""
    m = nn.Embedding(num_embeddings, embedding_dim, padding_idx=padding_idx)
    nn.init.normal_(m.weight, 0.0, 0.1)
    nn.init.constant_(m.weight[padding_idx], 0.0)
    return m


def positional_embedding(
    num_embeddings: int, embedding_dim: int, padding_idx: int
) -> LearnedPositionalEmbedding:
    """A learned position table of ``num_embeddings`` rows ~ N(0, 0.1), the pad row zero."""
    m = LearnedPositionalEmbedding(num_embeddings, embedding_dim, padding_idx)
    nn.init.normal_(m.weight, 0.0, 0.1)
    nn.init.constant_(m.weight[padding_idx], 0.0)
    return m


def linear(in_features: int, out_features: int, dropout: float = 0.0) -> nn.Linear:
    """A weight-normalised Linear, weight ~ N(0, sqrt((1 - dropout) / in)), bias 0."""
    m = nn.Linear(in_features, out_features)
    nn.init.normal_(m.weight, 0.0, math.sqrt((1.0 - dropout) / in_features))
    nn.init.constant_(m.bias, 0.0)
    return apply_weight_norm(m, dim=0)


def _init_glu_conv(m: ConvTBC, dropout: float) -> ConvTBC:
    k, in_channels = m.kernel_size[0], m.in_channels
    nn.init.normal_(m.weight, 0.0, math.sqrt(4.0 * (1.0 - dropout) / (k * in_channels)))
    nn.init.constant_(m.bias, 0.0)
    return apply_weight_norm(m, dim=2)


def conv_tbc(
    in_channels: int, out_channels: int, kernel_size: int, dropout: float, padding: int
) -> ConvTBC:
    """An encoder convolution feeding a GLU, std sqrt(4 (1 - dropout) / (k in)), weight norm dim 2."""
    return _init_glu_conv(ConvTBC(in_channels, out_channels, kernel_size, padding), dropout)


def linearized_conv1d(
    in_channels: int, out_channels: int, kernel_size: int, dropout: float
) -> LinearizedConvolution:
    """A causal decoder convolution, initialised and normalised like `conv_tbc`."""
    return _init_glu_conv(LinearizedConvolution(in_channels, out_channels, kernel_size), dropout)
