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

# name -> overrides after BASE, in the order they ran
ARMS: dict[str, list[str]] = {
    # Adam with fairseq's inverse_sqrt schedule (the usual transformer recipe), no clipping
    "adam2e-3_isqrt500": [
        "optim=adam",
        "optim.lr=0.002",
        "optim.betas=[0.9,0.98]",
        "anneal=inverse_sqrt",
        "anneal.warmup_updates=500",
    ],
    # the same peak, then a cosine to 0 over about 12 epochs: the lr's drop inside the budget
    "adam2e-3_cos1600": [
        "optim=adam",
        "optim.lr=0.002",
        "optim.betas=[0.9,0.98]",
        "anneal=cosine",
        "anneal.warmup_updates=300",
        "anneal.total_updates=1600",
    ],
    "adam3e-3_cos1600": [
        "optim=adam",
        "optim.lr=0.003",
        "optim.betas=[0.9,0.98]",
        "anneal=cosine",
        "anneal.warmup_updates=300",
        "anneal.total_updates=1600",
    ],
    "adam2e-3_cos1600_drop0.1": [
        "optim=adam",
        "optim.lr=0.002",
        "optim.betas=[0.9,0.98]",
        "anneal=cosine",
        "anneal.warmup_updates=300",
        "anneal.total_updates=1600",
        "model.dropout=0.1",
    ],
    # two DDP processes of one thread each, bf16-mixed: updates of 2 x 4000 tokens
    "ddp_bf16_adam3e-3_cos800": [
        "trainer=ddp",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.precision=bf16-mixed",
        "optim=adam",
        "optim.lr=0.003",
        "optim.betas=[0.9,0.98]",
        "anneal=cosine",
        "anneal.warmup_updates=150",
        "anneal.total_updates=800",
    ],
}
