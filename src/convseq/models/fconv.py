"""FConvModel: fairseq's convolutional sequence-to-sequence model (ConvS2S, "fconv")."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from omegaconf import DictConfig
from torch.nn.utils import parametrize

from convseq.common.specials import PAD_ID
from convseq.models.base import EncoderDecoderModel, eval_mode
from convseq.models.config import FConvConfig, as_fconv_config
from convseq.models.decoder import FConvDecoder
from convseq.models.encoder import FConvEncoder
from convseq.models.spec import parse_attention, parse_layers
from convseq.modules.attention import AttentionLayer


class FConvModel(EncoderDecoderModel):
    """An fconv encoder-decoder with fairseq's conventions, maths and state-dict names.

    The source is left-padded, the decoder input is the target with EOS moved to the front
    (right-padded), and ``state_dict()`` has exactly the keys and shapes of a fairseq fconv
    checkpoint's ``model`` entry.
    """

    def __init__(
        self, encoder: FConvEncoder, decoder: FConvDecoder, cfg: FConvConfig | None = None
    ):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.cfg = cfg  # the configuration it was built from (None if built by hand)
        self.encoder.num_attention_layers = sum(a is not None for a in decoder.attention)

    @classmethod
    def build(
        cls,
        cfg: FConvConfig | DictConfig | Mapping[str, Any],
        src_vocab_size: int,
        tgt_vocab_size: int,
        padding_idx: int = PAD_ID,
    ) -> FConvModel:
        """Build a freshly initialised model.

        Args:
            cfg: an FConvConfig, a DictConfig (the composed ``model`` group) or a plain dict
                with FConvConfig's keys; missing keys take fairseq's base defaults.
            src_vocab_size: source dictionary length (padding symbols included).
            tgt_vocab_size: target dictionary length.
            padding_idx: the pad symbol of both dictionaries.
        """
        cfg = as_fconv_config(cfg)
        encoder_layers = parse_layers(cfg.encoder_layers, "encoder_layers")
        decoder_layers = parse_layers(cfg.decoder_layers, "decoder_layers")
        attention = parse_attention(cfg.decoder_attention, len(decoder_layers))
        encoder = FConvEncoder(
            src_vocab_size,
            embed_dim=cfg.encoder_embed_dim,
            layers=encoder_layers,
            dropout=cfg.dropout,
            max_positions=cfg.max_source_positions,
            padding_idx=padding_idx,
        )
        decoder = FConvDecoder(
            tgt_vocab_size,
            embed_dim=cfg.decoder_embed_dim,
            out_embed_dim=cfg.decoder_out_embed_dim,
            layers=decoder_layers,
            attention=attention,
            dropout=cfg.dropout,
            max_positions=cfg.max_target_positions,
            share_embed=cfg.share_input_output_embed,
            padding_idx=padding_idx,
        )
        return cls(encoder, decoder, cfg)

    def forward(
        self,
        src_tokens: torch.Tensor,
        src_lengths: torch.Tensor | None,
        prev_output_tokens: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Teacher-forced logits.

        Args:
            src_tokens: (B, S) left-padded source.
            src_lengths: (B,) source lengths.
            prev_output_tokens: (B, T) EOS-first, right-padded decoder input.

        Returns:
            (B, T, V) logits and the (B, T, S) layer-averaged attention (eval mode with
            ``decoder.need_attn``) or None.
        """
        encoder_out = self.encoder(src_tokens, src_lengths)
        return self.decoder(prev_output_tokens, encoder_out)

    @contextlib.contextmanager
    def generation_mode(
        self,
        beam_size: int | None = None,
        fold_weight_norm: bool = True,
        need_attn: bool | None = None,
    ) -> Iterator[FConvModel]:
        """Temporarily set the model up for fast generation; everything is restored on exit.

        Inside: eval mode, no autograd, and the optional fast paths fairseq's
        ``make_generation_fast_`` applies. Unlike that method, nothing is removed or replaced:
        parameters, optimiser references, RNG state and train/eval flags come out exactly as
        they went in, so validation decoding in the middle of training changes nothing.

        Args:
            beam_size: rows come in blocks of this many copies of a sentence; single-step
                attention products are then done once per sentence (fairseq's BeamableMM).
            fold_weight_norm: compute every ``g * v / ||v||`` once for the whole block and
                reuse it as a plain weight (instead of once per layer call and step).
            need_attn: set ``decoder.need_attn`` (False skips averaging the attention);
                None leaves it as is.
        """
        attention = [m for m in self.modules() if isinstance(m, AttentionLayer)]
        beams = [a.beam_size for a in attention]
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.no_grad())
            if fold_weight_norm:
                stack.enter_context(parametrize.cached())
            stack.enter_context(eval_mode(self, need_attn))
            try:
                for a in attention:
                    a.beam_size = beam_size
                yield self
            finally:
                for a, beam in zip(attention, beams, strict=True):
                    a.beam_size = beam
