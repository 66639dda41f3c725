"""LightConvModel: fairseq 0.12's LightConv / DynamicConv encoder-decoder (Wu et al. 2019).

Parameter names, shapes and initialisation are those of fairseq's ``LightConvModel``
(``encoder.embed_tokens.weight``, ``encoder.embed_positions.weight`` when positions are learned,
``encoder.layers.N.*``, ``encoder.layer_norm.*`` with ``encoder_normalize_before``,
``encoder.version``, the same under ``decoder.``, ``decoder.output_projection.weight`` (the
embedding itself when tied), ``decoder.project_in_dim`` / ``project_out_dim`` when the widths
differ). Sinusoidal positions have no state_dict entry, as in fairseq 0.12.
"""

from __future__ import annotations

import contextlib
import math
import uuid
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from convseq.models.base import EncoderDecoderModel, eval_mode
from convseq.models.lightconv_config import LightConvConfig
from convseq.modules.dynamic_conv import DynamicConv1dTBC
from convseq.modules.lightconv_layer import LightConvDecoderLayer, LightConvEncoderLayer
from convseq.modules.linearized_conv import IncrementalState
from convseq.modules.positional import LearnedPositionalEmbedding, SinusoidalPositionalEmbedding


def make_embedding(num_embeddings: int, dim: int, padding_idx: int) -> nn.Embedding:
    """fairseq's Embedding: normal(0, dim ** -0.5) with the pad row zero."""
    m = nn.Embedding(num_embeddings, dim, padding_idx=padding_idx)
    nn.init.normal_(m.weight, mean=0, std=dim**-0.5)
    nn.init.constant_(m.weight[padding_idx], 0)
    return m


def make_positions_module(
    max_positions: int, dim: int, padding_idx: int, learned: bool
) -> nn.Module:
    """fairseq's PositionalEmbedding: a learned table of max + pad + 1 rows (normal(0, dim **
    -0.5), pad row zero) or sinusoids with as many rows precomputed."""
    rows = max_positions + padding_idx + 1
    if not learned:
        return SinusoidalPositionalEmbedding(dim, padding_idx, init_size=rows)
    m = LearnedPositionalEmbedding(rows, dim, padding_idx)
    nn.init.normal_(m.weight, mean=0, std=dim**-0.5)
    nn.init.constant_(m.weight[padding_idx], 0)
    return m


class LightConvEncoderOut(NamedTuple):
    """The encoder's output: ``encoder_out`` (S, B, E) and the (B, S) pad mask (None: no pad)."""

    encoder_out: torch.Tensor
    encoder_padding_mask: torch.Tensor | None

    def reorder(self, new_order: torch.Tensor) -> LightConvEncoderOut:
        """Row ``i`` of the result is row ``new_order[i]`` (beam search)."""
        mask = self.encoder_padding_mask
        return LightConvEncoderOut(
            self.encoder_out.index_select(1, new_order),
            None if mask is None else mask.index_select(0, new_order),
        )


class LightConvEncoder(nn.Module):
    """Scaled token embeddings + positions, dropout, the encoder layers, a final layer norm
    when ``encoder_normalize_before``."""

    def __init__(self, cfg: LightConvConfig, embed_tokens: nn.Embedding):
        super().__init__()
        cfg = cfg.resolved()  # the sizes fairseq derives, filled in by their one home
        dim = embed_tokens.embedding_dim
        self.dropout = cfg.dropout
        self.padding_idx = int(embed_tokens.padding_idx)  # type: ignore[arg-type]
        self.embed_tokens = embed_tokens
        self.embed_scale = math.sqrt(dim)
        self.max_source_positions = cfg.max_source_positions
        self.embed_positions = None
        if not cfg.no_token_positional_embeddings:
            self.embed_positions = make_positions_module(
                cfg.max_source_positions, dim, self.padding_idx, cfg.encoder_learned_pos
            )
        self.layers = nn.ModuleList(
            LightConvEncoderLayer(
                dim,
                cfg.encoder_conv_dim,
                cfg.encoder_ffn_embed_dim,
                kernel,
                cfg.encoder_attention_heads,
                conv_type=cfg.encoder_conv_type,
                glu=cfg.encoder_glu,
                normalize_before=cfg.encoder_normalize_before,
                **_block_settings(cfg),
            )
            for kernel in cfg.encoder_kernel_size_list
        )
        self.register_buffer("version", torch.Tensor([2]))
        self.layer_norm = nn.LayerNorm(dim) if cfg.encoder_normalize_before else None

    def forward(
        self, src_tokens: torch.Tensor, src_lengths: torch.Tensor | None = None
    ) -> LightConvEncoderOut:
        """(B, S) source tokens -> (S, B, E) states and the (B, S) pad mask (None if no pad).
        ``src_lengths`` is not read (the pad mask comes from the tokens), as in fairseq."""
        x = self.embed_scale * self.embed_tokens(src_tokens)  # (B, S, E)
        if self.embed_positions is not None:
            x = x + self.embed_positions(src_tokens)  # (B, S, E)
        x = F.dropout(x, self.dropout, self.training).transpose(0, 1)  # (S, B, E)
        pads = src_tokens.eq(self.padding_idx)  # (B, S)
        mask = pads if bool(pads.any()) else None
        for layer in self.layers:
            x = layer(x, mask)  # (S, B, E)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        return LightConvEncoderOut(x, mask)

    def reorder_encoder_out(
        self, encoder_out: LightConvEncoderOut, new_order: torch.Tensor
    ) -> LightConvEncoderOut:
        """The encoder output with row ``i`` taken from row ``new_order[i]``."""
        return encoder_out.reorder(new_order)

    def max_positions(self) -> int:
        """The longest source (tokens, EOS included) the positions can number."""
        return self.max_source_positions


def _block_settings(cfg: LightConvConfig) -> dict[str, Any]:
    """What encoder and decoder layers take alike from a resolved config: the kernel softmax
    and DropConnect, and the dropouts."""
    return {
        "weight_softmax": cfg.weight_softmax,
        "weight_dropout": float(cfg.weight_dropout),
        "dropout": cfg.dropout,
        "relu_dropout": cfg.relu_dropout,
        "input_dropout": cfg.input_dropout,
    }


def _decoder_layer(cfg: LightConvConfig, kernel: int) -> LightConvDecoderLayer:
    """One decoder layer with a resolved config's decoder settings and kernel size ``kernel``."""
    return LightConvDecoderLayer(
        cfg.decoder_embed_dim,
        cfg.decoder_conv_dim,
        cfg.decoder_ffn_embed_dim,
        kernel,
        cfg.decoder_attention_heads,
        conv_type=cfg.decoder_conv_type,
        glu=cfg.decoder_glu,
        attention_dropout=cfg.attention_dropout,
        normalize_before=cfg.decoder_normalize_before,
        **_block_settings(cfg),
    )


class LightConvDecoder(nn.Module):
    """Scaled token embeddings (projected in when widths differ) + positions, dropout, causal
    layers with encoder attention, a final layer norm when ``decoder_normalize_before``, a
    projection out to ``decoder_output_dim`` when it differs, and the vocabulary projection."""

    def __init__(self, cfg: LightConvConfig, embed_tokens: nn.Embedding):
        super().__init__()
        cfg = cfg.resolved()  # the sizes fairseq derives, filled in by their one home
        in_dim = embed_tokens.embedding_dim
        dim, out_dim = cfg.decoder_embed_dim, cfg.decoder_output_dim
        self.dropout = cfg.dropout
        self.padding_idx = int(embed_tokens.padding_idx)  # type: ignore[arg-type]
        self.embed_tokens = embed_tokens
        self.embed_scale = math.sqrt(dim)
        self.project_in_dim = nn.Linear(in_dim, dim, bias=False) if in_dim != dim else None
        self.max_target_positions = cfg.max_target_positions
        self.embed_positions = None
        if not cfg.no_token_positional_embeddings:
            self.embed_positions = make_positions_module(
                cfg.max_target_positions, dim, self.padding_idx, cfg.decoder_learned_pos
            )
        self.layers = nn.ModuleList(_decoder_layer(cfg, k) for k in cfg.decoder_kernel_size_list)
        self.project_out_dim = nn.Linear(dim, out_dim, bias=False) if dim != out_dim else None
        vocab, emb_dim = embed_tokens.weight.shape
        if cfg.share_decoder_input_output_embed:
            self.output_projection = nn.Linear(emb_dim, vocab, bias=False)
            self.output_projection.weight = embed_tokens.weight
        else:
            self.output_projection = nn.Linear(out_dim, vocab, bias=False)
            nn.init.normal_(self.output_projection.weight, mean=0, std=out_dim**-0.5)
        self.register_buffer("version", torch.Tensor([2]))
        self.layer_norm = nn.LayerNorm(dim) if cfg.decoder_normalize_before else None
        self._steps_key = f"{uuid.uuid4().hex}.steps"

    def forward(
        self,
        prev_output_tokens: torch.Tensor,
        encoder_out: LightConvEncoderOut,
        incremental_state: IncrementalState | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, T) decoder input -> (B, T', V) logits and the last layer's (B, T', S) attention
        (None in training).

        Without ``incremental_state`` T' = T (teacher forcing). With it, ``prev_output_tokens``
        is the whole prefix so far (no padding) and only the positions not fed before are
        computed: T' = T - (positions fed before), one step or several at once.
        """
        done = 0
        if incremental_state is not None:
            done = int(incremental_state.get(self._steps_key, 0))  # type: ignore[arg-type]
            incremental_state[self._steps_key] = prev_output_tokens.size(1)
        x = self._embed(prev_output_tokens, done)  # (T', B, E)
        attn = None
        enc, mask = encoder_out.encoder_out, encoder_out.encoder_padding_mask
        for layer in self.layers:
            x, attn = layer(x, enc, mask, incremental_state)  # (T', B, E)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        x = x.transpose(0, 1)  # (B, T', E)
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)  # (B, T', out_dim)
        return self.output_projection(x), attn  # (B, T', V)

    def _embed(self, tokens: torch.Tensor, done: int) -> torch.Tensor:
        """Embeddings of positions ``done:`` of the (B, T) tokens as (T - done, B, E)."""
        positions = None
        if self.embed_positions is not None:
            positions = self.embed_positions(tokens)[:, done:]  # (B, T', E)
        x = self.embed_scale * self.embed_tokens(tokens[:, done:].contiguous())  # (B, T', E)
        if self.project_in_dim is not None:
            x = self.project_in_dim(x)
        if positions is not None:
            x = x + positions
        return F.dropout(x, self.dropout, self.training).transpose(0, 1)  # (T', B, E)

    def reorder_incremental_state(
        self, incremental_state: IncrementalState, new_order: torch.Tensor
    ) -> None:
        """Row ``i`` continues row ``new_order[i]`` in every layer's cache."""
        for layer in self.layers:
            layer.reorder_incremental_state(incremental_state, new_order)

    @property
    def need_attn(self) -> bool:
        """Whether forward returns the last layer's attention in eval mode (every layer's flag)."""
        return all(layer.need_attn for layer in self.layers)

    @need_attn.setter
    def need_attn(self, value: bool) -> None:
        for layer in self.layers:
            layer.need_attn = value

    def max_positions(self) -> int:
        """The longest decoder input the positions can number."""
        return self.max_target_positions

    def get_normalized_probs(
        self, net_output: tuple[torch.Tensor, object], log_probs: bool = True
    ) -> torch.Tensor:
        """(Log-)probabilities of the (B, T, V) logits in ``net_output``, in fp32 (fairseq's)."""
        logits = net_output[0].float()
        return F.log_softmax(logits, dim=-1) if log_probs else F.softmax(logits, dim=-1)


class LightConvModel(EncoderDecoderModel):
    """fairseq's LightConvModel: `LightConvEncoder` and `LightConvDecoder`."""

    def __init__(self, encoder: LightConvEncoder, decoder: LightConvDecoder, cfg: LightConvConfig):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.cfg = cfg

    @classmethod
    def build(
        cls, cfg: LightConvConfig, src_vocab_size: int, tgt_vocab_size: int, pad: int = 1
    ) -> LightConvModel:
        """A freshly initialised model (fairseq's build_model; ``share_all_embeddings`` needs
        one joined dictionary, so equal vocabulary sizes)."""
        cfg = cfg.resolved()
        enc_embed = make_embedding(src_vocab_size, cfg.encoder_embed_dim, pad)
        if cfg.share_all_embeddings:
            if src_vocab_size != tgt_vocab_size:
                raise ValueError("share_all_embeddings needs one joined dictionary")
            dec_embed = enc_embed
        else:
            dec_embed = make_embedding(tgt_vocab_size, cfg.decoder_embed_dim, pad)
        return cls(LightConvEncoder(cfg, enc_embed), LightConvDecoder(cfg, dec_embed), cfg)

    def forward(
        self,
        src_tokens: torch.Tensor,
        src_lengths: torch.Tensor | None,
        prev_output_tokens: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Teacher forcing: (B, S) left-padded source, its (B,) lengths and the (B, T) decoder
        input -> (B, T, V) logits and the (B, T, S) attention of the last layer (None in
        training). The arguments are `FConvModel.forward`'s, so a batch feeds either family."""
        return self.decoder(prev_output_tokens, self.encoder(src_tokens, src_lengths))

    @contextlib.contextmanager
    def generation_mode(
        self,
        beam_size: int | None = None,
        fold_weight_norm: bool = True,
        need_attn: bool | None = None,
    ) -> Iterator[LightConvModel]:
        """Eval mode, no autograd, ``need_attn`` set and dynamic kernels untrimmed
        (`untrimmed_kernels`) for a search; all restored on exit.

        ``beam_size`` and ``fold_weight_norm`` are fconv's fast paths (beamable products,
        weight-norm folding); this family has neither, so they change nothing here.
        """
        with torch.no_grad(), self.untrimmed_kernels(), eval_mode(self, need_attn):
            yield self

    @contextlib.contextmanager
    def untrimmed_kernels(self) -> Iterator[LightConvModel]:
        """Every dynamic convolution's full forward without ``trim_short_kernel``, restored on
        exit: the decoder's full forward over a prefix shorter than a kernel then gives the
        incremental form's output (fairseq's generation), so a search without incremental
        state (greedy, a full-forward check) sees what the beam search sees. Teacher forcing
        outside a search keeps fairseq's trimmed form (docs/model.md, T < K).
        """
        convs = [m for m in self.modules() if isinstance(m, DynamicConv1dTBC)]
        saved = [c.trim_short_kernel for c in convs]
        try:
            for c in convs:
                c.trim_short_kernel = False
            yield self
        finally:
            for c, trim in zip(convs, saved, strict=True):
                c.trim_short_kernel = trim
