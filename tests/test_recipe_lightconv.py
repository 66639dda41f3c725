"""The LightConv recipe (conf/experiment/multi30k_lightconv.yaml): multi30k_fast's settings with
the LightConv of conf/model/lightconv_multi30k.yaml, its size counted from fairseq's layer
structure.
"""

from __future__ import annotations

from convseq.common.config import plain as to_plain
from convseq.models.family import build_model
from convseq.models.lightconv_config import LightConvConfig
from convseq.tasks.config import as_config
from tests.conftest import compose_config

DE, EN = 5480, 4280  # the recipe's dictionaries (data=multi30k_recipe), German -> English


def test_the_lightconv_recipe_is_the_fast_recipe_with_another_model(tmp_path):
    args = dict(output_dir=str(tmp_path))
    recipe = to_plain(compose_config(["experiment=multi30k_lightconv"], **args))
    fast = to_plain(compose_config(["experiment=multi30k_fast"], **args))
    assert {k: v for k, v in recipe.items() if k != "model"} == {
        k: v for k, v in fast.items() if k != "model"
    }
    model = as_config(compose_config(["experiment=multi30k_lightconv"], **args)).model
    assert type(model) is LightConvConfig and model.arch == "lightconv_multi30k"
    assert (model.encoder_conv_type, model.decoder_conv_type) == ("lightweight", "lightweight")


def _layer(d: int, ffn: int, heads: int, kernel: int) -> int:
    """A LightConv block without encoder attention: GLU input projection d -> 2d, lightweight
    kernels (heads x kernel, no bias), output projection, feed-forward, two layer norms."""
    return (
        (d * 2 * d + 2 * d) + heads * kernel + (d * d + d) + (d * ffn + ffn) + (ffn * d + d) + 4 * d
    )


def test_the_recipes_model_has_the_size_of_its_layers():
    cfg = as_config(compose_config(["experiment=multi30k_lightconv"], output_dir="/nowhere")).model
    d, ffn, h = cfg.encoder_embed_dim, cfg.encoder_ffn_embed_dim, cfg.encoder_attention_heads
    assert (d, ffn, h) == (
        cfg.decoder_embed_dim,
        cfg.decoder_ffn_embed_dim,
        cfg.decoder_attention_heads,
    )
    assert not (cfg.encoder_normalize_before or cfg.decoder_normalize_before)  # no final norms
    assert not cfg.share_all_embeddings and not cfg.share_decoder_input_output_embed
    encoder = DE * d + sum(_layer(d, ffn, h, k) for k in cfg.encoder_kernel_size_list)
    attention = 4 * (d * d + d) + 2 * d  # q, k, v, out projections and the attention's norm
    decoder = EN * d + sum(_layer(d, ffn, h, k) + attention for k in cfg.decoder_kernel_size_list)
    decoder += EN * d  # the output projection (no bias)
    model = build_model(cfg, DE, EN, padding_idx=1)
    assert sum(p.numel() for p in model.parameters()) == encoder + decoder
    assert len(cfg.encoder_kernel_size_list) == cfg.encoder_layers
    assert len(cfg.decoder_kernel_size_list) == cfg.decoder_layers
