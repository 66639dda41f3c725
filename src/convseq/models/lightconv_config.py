"""`LightConvConfig`: every hyperparameter of fairseq 0.12's LightConv / DynamicConv model
(``fairseq/models/lightconv.py``), with ``base_architecture``'s defaults, and its five presets.

fairseq derives some defaults from others (decoder sizes from the encoder's, conv dims from the
embed dims, ``weight_dropout`` from ``attention_dropout``); here such a field is None until
`LightConvConfig.resolved` fills it in the way fairseq does.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from convseq.models.config import ModelConfigError

CONV_TYPES = ("lightweight", "dynamic")  # the two convolutions of the family
ENCODER_KERNELS = (3, 7, 15, 31, 31, 31, 31)  # base_architecture's encoder_kernel_size_list
DECODER_KERNELS = (3, 7, 15, 31, 31, 31)  # base_architecture's decoder_kernel_size_list


@dataclass
class LightConvConfig:
    """fairseq's LightConv arguments; defaults are ``base_architecture``'s (``lightconv``)."""

    arch: str = "lightconv"  # preset name, for display and checkpoints (fairseq's --arch)
    family: str = "lightconv"  # the model family (`convseq.models.family`)
    encoder_embed_dim: int = 512  # encoder token embedding and layer width
    encoder_conv_dim: int | None = None  # encoder convolution channels (None: embed dim)
    encoder_ffn_embed_dim: int = 2048  # encoder feed-forward hidden width
    encoder_layers: int = 7  # encoder layers
    encoder_attention_heads: int = 8  # encoder convolution heads
    encoder_kernel_size_list: tuple[int, ...] = ENCODER_KERNELS  # per layer (or one for all)
    encoder_glu: bool = True  # GLU after the encoder's input projection
    encoder_conv_type: str = "dynamic"  # lightweight | dynamic (fairseq's add_args default)
    encoder_normalize_before: bool = False  # pre-norm encoder layers and a final layer norm
    encoder_learned_pos: bool = False  # learned (else sinusoidal) encoder positions
    decoder_embed_dim: int | None = None  # decoder width (None: encoder_embed_dim)
    decoder_conv_dim: int | None = None  # decoder convolution channels (None: decoder embed)
    decoder_ffn_embed_dim: int | None = None  # decoder FFN width (None: encoder's)
    decoder_layers: int = 6  # decoder layers
    decoder_attention_heads: int = 8  # decoder convolution and encoder-attention heads
    decoder_kernel_size_list: tuple[int, ...] = DECODER_KERNELS  # per layer (or one for all)
    decoder_glu: bool = True  # GLU after the decoder's input projection
    decoder_conv_type: str = "dynamic"  # lightweight | dynamic (fairseq's add_args default)
    decoder_normalize_before: bool = False  # pre-norm decoder layers and a final layer norm
    decoder_learned_pos: bool = False  # learned (else sinusoidal) decoder positions
    decoder_output_dim: int | None = None  # width before the vocabulary (None: decoder embed)
    decoder_input_dim: int | None = None  # kept for fairseq parity (None: decoder embed; unused)
    weight_softmax: bool = True  # softmax over each kernel's taps
    weight_dropout: float | None = None  # DropConnect on the kernels (None: attention_dropout)
    dropout: float = 0.1  # dropout on embeddings and block outputs
    relu_dropout: float = 0.0  # dropout after the FFN's ReLU
    input_dropout: float = 0.1  # dropout on each convolution block's input
    attention_dropout: float = 0.0  # dropout on encoder-attention probabilities
    share_decoder_input_output_embed: bool = False  # tie the decoder's output projection
    share_all_embeddings: bool = False  # one embedding for source, target and output
    no_token_positional_embeddings: bool = False  # no positions at all
    max_source_positions: int = 1024  # source positions (fairseq's default)
    max_target_positions: int = 1024  # target positions (fairseq's default)
    adaptive_softmax_cutoff: tuple[int, ...] | None = None  # not supported here (must be None)
    adaptive_softmax_dropout: float = 0.0  # fairseq parity (adaptive softmax unsupported)
    tie_adaptive_weights: bool = False  # fairseq parity (adaptive softmax unsupported)

    def __post_init__(self) -> None:
        self._check()

    def _check(self) -> None:
        """Refuse a value fairseq's model would fail on, naming the key (at composition)."""
        for key in ("encoder_conv_type", "decoder_conv_type"):
            if getattr(self, key) not in CONV_TYPES:
                raise ModelConfigError(
                    f"model.{key}={getattr(self, key)!r}: choose {' or '.join(CONV_TYPES)}"
                )
        _expand(self.encoder_kernel_size_list, self.encoder_layers, "en")
        _expand(self.decoder_kernel_size_list, self.decoder_layers, "de")
        if self.adaptive_softmax_cutoff is not None:
            raise ModelConfigError(
                "model.adaptive_softmax_cutoff: convseq's LightConv has no adaptive softmax; "
                "leave it null"
            )
        dims = (self.encoder_embed_dim, self.decoder_embed_dim or self.encoder_embed_dim)
        if self.share_all_embeddings and dims[0] != dims[1]:
            raise ModelConfigError(
                f"model.share_all_embeddings needs equal encoder and decoder embed dims, not "
                f"{dims[0]} and {dims[1]}"
            )

    def resolved(self) -> LightConvConfig:
        """A copy with fairseq's derived defaults filled in and the kernel lists expanded."""
        c = dataclasses.replace(self)
        c.decoder_embed_dim = c.decoder_embed_dim or c.encoder_embed_dim
        c.decoder_ffn_embed_dim = c.decoder_ffn_embed_dim or c.encoder_ffn_embed_dim
        c.decoder_output_dim = c.decoder_output_dim or c.decoder_embed_dim
        c.decoder_input_dim = c.decoder_input_dim or c.decoder_embed_dim
        c.encoder_conv_dim = c.encoder_conv_dim or c.encoder_embed_dim
        c.decoder_conv_dim = c.decoder_conv_dim or c.decoder_embed_dim
        if c.weight_dropout is None:
            c.weight_dropout = c.attention_dropout
        c.encoder_kernel_size_list = _expand(c.encoder_kernel_size_list, c.encoder_layers, "en")
        c.decoder_kernel_size_list = _expand(c.decoder_kernel_size_list, c.decoder_layers, "de")
        if c.share_all_embeddings:
            c.share_decoder_input_output_embed = True
        return c


def _expand(kernels: tuple[int, ...], layers: int, side: str) -> tuple[int, ...]:
    """One kernel size repeats over all layers; otherwise there must be one per layer."""
    kernels = tuple(kernels)
    if len(kernels) == 1:
        kernels = kernels * layers
    if len(kernels) != layers:
        name = "encoder" if side == "en" else "decoder"
        raise ModelConfigError(
            f"model.{name}_kernel_size_list has {len(kernels)} sizes for model.{name}_layers="
            f"{layers}: give one size per layer, or one size for all"
        )
    return kernels


_BIG = dict(  # lightconv_wmt_en_de_big's overrides
    attention_dropout=0.1,
    encoder_embed_dim=1024,
    encoder_ffn_embed_dim=4096,
    encoder_attention_heads=16,
    encoder_normalize_before=False,
    decoder_embed_dim=1024,
    decoder_ffn_embed_dim=4096,
    decoder_attention_heads=16,
    dropout=0.3,
)

# fairseq 0.12's @register_model_architecture functions: each preset's overrides of
# base_architecture (derived values, e.g. weight_dropout = attention_dropout, come from resolved).
PRESETS: dict[str, dict[str, object]] = {
    "lightconv_iwslt_de_en": dict(
        encoder_embed_dim=512,
        encoder_ffn_embed_dim=1024,
        encoder_attention_heads=4,
        encoder_layers=7,
        decoder_embed_dim=512,
        decoder_ffn_embed_dim=1024,
        decoder_attention_heads=4,
        decoder_layers=6,
        attention_dropout=0.1,
        weight_dropout=0.1,
        encoder_glu=False,
        decoder_glu=False,
        input_dropout=0.0,
    ),
    "lightconv_wmt_en_de": {},
    "lightconv_wmt_en_de_big": _BIG,
    "lightconv_wmt_en_fr_big": {**_BIG, "dropout": 0.1},
    "lightconv_wmt_zh_en_big": {
        **_BIG,
        "dropout": 0.2,
        "attention_dropout": 0.2,
        "weight_dropout": 0.2,
    },
}


def preset(name: str, **overrides: object) -> LightConvConfig:
    """The resolved config of fairseq's preset ``name``, with ``overrides`` applied first."""
    if name not in PRESETS:
        raise KeyError(f"unknown LightConv preset {name!r}; known: {sorted(PRESETS)}")
    return LightConvConfig(arch=name, **{**PRESETS[name], **overrides}).resolved()  # type: ignore[arg-type]
