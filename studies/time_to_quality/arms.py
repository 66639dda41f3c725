"""The settings tried (each an arm: a name and the overrides added to its base experiment).

Every arm is read on the validation set only (valid BLEU, beam 5, after every epoch, with the
command's minutes at each validation); test BLEU is computed for the chosen recipe alone. An arm
runs for at most `MINUTES` minutes of wall time (`trainer.max_time`), or less by its own rule.
"""

from __future__ import annotations

MINUTES = 12  # each exploration arm's wall-time cap (DD:HH:MM:SS below)

BASE = [
    "experiment=multi30k_study",  # the small fconv (2.7M), valid BLEU every epoch, best by BLEU
    "trainer.max_epochs=100",
    f"trainer.max_time=00:00:{MINUTES:02d}:00",
    "final_test=false",  # arms are chosen on valid; test BLEU only for the chosen recipe
]


def adam(lr: float) -> list[str]:
    """Adam at peak `lr`, betas (0.9, 0.98); clip norm 0.1 stays (multi30k_compare's)."""
    return ["optim=adam", f"optim.lr={lr}", "optim.betas=[0.9,0.98]"]


def inverse_sqrt(warmup: int) -> list[str]:
    return ["anneal=inverse_sqrt", f"anneal.warmup_updates={warmup}"]


def cosine(warmup: int, total: int) -> list[str]:
    return ["anneal=cosine", f"anneal.warmup_updates={warmup}", f"anneal.total_updates={total}"]


def recipe(experiment: str, seed: int, minutes: int, *extra: str) -> list[str]:
    """A recipe run (its own experiment, not BASE): the seed, every epoch's checkpoint kept for
    its test curve (studies/time_to_quality/curve.py), at most `minutes` of wall time."""
    return [
        f"experiment={experiment}",
        f"seed={seed}",
        "checkpoint.keep_epochs=-1",
        f"trainer.max_time=00:00:{minutes:02d}:00",
        *extra,
    ]


# two DDP processes of one thread each, bf16-mixed (updates of 2 x 4000 tokens)
DDP_BF16 = [
    "trainer=ddp",
    "trainer.accelerator=cpu",
    "trainer.devices=2",
    "trainer.precision=bf16-mixed",
]

EN_DE = ["data.src_lang=en", "data.tgt_lang=de"]


def width(dim: int) -> list[str]:
    """The recipe's model with every layer and embedding `dim` wide (its depth kept)."""
    return [
        f"model.encoder_embed_dim={dim}",
        f"model.encoder_layers=[{{layer:[{dim},3],repeat:3}}]",
        f"model.decoder_embed_dim={dim}",
        f"model.decoder_layers=[{{layer:[{dim},3],repeat:2}}]",
        f"model.decoder_out_embed_dim={dim}",
    ]


# one lever at a time on the recipe (readings.md, "One lever at a time on the recipe"): name -> overrides
LEVERS: dict[str, list[str]] = {
    "drop0.1": ["model.dropout=0.1"],  # the recipe's model is small: less dropout, faster fit?
    "ls0": ["criterion.label_smoothing=0.0"],
    "tok2000": ["batching.max_tokens=2000"],  # twice the updates an epoch, each half as large
    "tok8000": ["batching.max_tokens=8000"],
    "wide192": width(192),  # 1.5x the time an update (multi30k_compare.yaml's measurement)
    # two processes of one thread: an 8,000-token update in about one 4,000-token update's time
    "ddp": ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"],
}


def family(preset: str, *extra: str) -> list[str]:
    """The recipe (multi30k_fast's optimiser, schedule, data and stop rule) with another model
    preset, seed 1, capped at `MINUTES`, read on valid BLEU like the exploration arms."""
    return [
        "experiment=multi30k_fast",
        f"model={preset}",
        "seed=1",
        f"trainer.max_time=00:00:{MINUTES:02d}:00",
        "final_test=false",
        *extra,
    ]


LIGHTWEIGHT = ["model.encoder_conv_type=lightweight", "model.decoder_conv_type=lightweight"]

# name -> overrides after BASE, in the order they ran (an arm whose overrides start with an
# `experiment=` is a recipe run: BASE is not added)
ARMS: dict[str, list[str]] = {
    # Adam with fairseq's inverse_sqrt schedule (the usual transformer recipe)
    "adam2e-3_isqrt500": adam(0.002) + inverse_sqrt(500),
    # the same peak, then a cosine to 0 over about 12 epochs: the lr's drop inside the budget
    "adam2e-3_cos1600": adam(0.002) + cosine(300, 1600),
    "adam3e-3_cos1600": adam(0.003) + cosine(300, 1600),
    "adam5e-3_cos1600": adam(0.005) + cosine(300, 1600),
    # inverse_sqrt (no end: the best checkpoint keeps improving) at a higher peak
    "adam4e-3_isqrt300": adam(0.004) + inverse_sqrt(300),
    # the chosen recipe (conf/experiment/multi30k_fast.yaml), three seeds, capped at MINUTES
    **{f"fast_seed{seed}": recipe("multi30k_fast", seed, MINUTES) for seed in (1, 2, 3)},
    # the recipe to 45 minutes (its patience, 5 when these ran, may stop it sooner), every
    # epoch's checkpoint kept: the 20- and 45-minute figures, and checkpoint averaging read after
    **{f"fast45_seed{seed}": recipe("multi30k_fast", seed, 45, "patience=5") for seed in (1, 2, 3)},
    # the recipe with patience 10 instead of 5: each continues its seed's patience-5 run
    # (copied from fast45_seedN) with resume=true; resuming is exact, so it is the patience-10
    # run but for one more start-up (seed 3 read first: its patience-5 run stopped at 25 min)
    **{
        f"fast45p10_seed{seed}": recipe("multi30k_fast", seed, 45, "patience=10")
        for seed in (3, 1, 2)
    },
    # fairseq's recipe (experiment=multi30k_fconv, which keeps every epoch and picks by valid
    # BLEU) cut at 45 minutes: its curve beside the fast recipe's, on the same machine
    **{f"fconv45_seed{seed}": recipe("multi30k_fconv", seed, 45) for seed in (1, 2, 3)},
    # English -> German, both recipes, as their German -> English arms (the data-bin of this
    # direction built first: `python run.py task=preprocess data=multi30k_recipe
    # data.src_lang=en data.tgt_lang=de`, so that no seed's minutes include it)
    **{f"fast45ende_seed{seed}": recipe("multi30k_fast", seed, 45, *EN_DE) for seed in (1, 2, 3)},
    **{f"fconv45ende_seed{seed}": recipe("multi30k_fconv", seed, 45, *EN_DE) for seed in (1, 2, 3)},
    # one lever at a time on the recipe (seed 1, 20 minutes): read against fast45_seed1's best
    # valid BLEU by 12 and by 20 minutes (the same run up to its 20th minute)
    **{f"lever_{name}": recipe("multi30k_fast", 1, 20, *extra) for name, extra in LEVERS.items()},
    # the lever that read best on seed 1 (two DDP processes) on the recipe's other two seeds,
    # read against fast45_seed2 and fast45_seed3 up to their 20th minute
    **{
        f"lever_ddp_seed{seed}": recipe("multi30k_fast", seed, 20, *LEVERS["ddp"])
        for seed in (2, 3)
    },
    # the LightConv family on the recipe: lightconv_toy (DynamicConv, 2.5M parameters on this
    # data) and its LightConv twin, read on valid BLEU against fast_seed1 run again beside them
    "family_dynamic_toy": family("lightconv_toy"),
    "family_lightweight_toy": family("lightconv_toy", *LIGHTWEIGHT),
    # the one that read best, at half the recipe's peak learning rate
    "family_lightweight_lr2e-3": family("lightconv_toy", *LIGHTWEIGHT, "optim.lr=0.002"),
    # the LightConv toy, one lever at a time (read against family_lightweight_toy):
    # wider kernels (fairseq's iwslt preset starts 3, 7, 15), the same cost an update
    "family_lightweight_k15": family(
        "lightconv_toy",
        *LIGHTWEIGHT,
        "model.encoder_kernel_size_list=[3,7,15]",
        "model.decoder_kernel_size_list=[3,7]",
    ),
    # 1.5x wider (more capacity for the 45-minute goal, slower epochs)
    "family_lightweight_wide192": family(
        "lightconv_toy",
        *LIGHTWEIGHT,
        "model.encoder_embed_dim=192",
        "model.encoder_ffn_embed_dim=384",
        "model.decoder_embed_dim=192",
        "model.decoder_ffn_embed_dim=384",
    ),
    # the LightConv recipe (experiment=multi30k_lightconv, chosen on the arms above) to 45
    # minutes, three seeds one after another, every epoch's checkpoint kept for the test curves
    # (run at dropout 0.1, the recipe's value then; 0.2 now)
    **{
        f"lightconv45_seed{seed}": recipe("multi30k_lightconv", seed, 45, "model.dropout=0.1")
        for seed in (1, 2, 3)
    },
    # seed 1 of the above levels off by minute 20 (valid loss rising from epoch 18): the same
    # recipe at dropout 0.2 (the studies' fconv value; the recipe's since), 45 minutes
    **{
        f"lightconv45d2_seed{seed}": recipe("multi30k_lightconv", seed, 45, "model.dropout=0.2")
        for seed in (1, 2, 3)
    },
}

# arm -> the arm whose folder it starts from (copied, less its summary and test curve; the
# driver then resumes it): a change of a stop rule read without re-running the shared epochs
CONTINUES: dict[str, str] = {f"fast45p10_seed{seed}": f"fast45_seed{seed}" for seed in (1, 2, 3)}

# written down, not run yet (the session's time went to the recipe's seeds)
NOT_RUN: dict[str, list[str]] = {
    # started, stopped after 1 epoch to give its time to the recipe's seeds
    "ddp_bf16_adam4e-3_isqrt150": DDP_BF16 + adam(0.004) + inverse_sqrt(150),
    "ddp_bf16_adam4e-3_cos800": DDP_BF16 + adam(0.004) + cosine(150, 800),
    "adam3e-3_cos1600_drop0.1": adam(0.003) + cosine(300, 1600) + ["model.dropout=0.1"],
    # the studies' fconv regularisation (fconv_compare's dropout) on the LightConv toy: its
    # 12 minutes went to the LightConv recipe's seeds
    "family_lightweight_drop0.2": family("lightconv_toy", *LIGHTWEIGHT, "model.dropout=0.2"),
}
