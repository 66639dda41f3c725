"""The fairseq side of bench/bench_lightconv_vs_fairseq_speed.py (runs in bench/fairseq-venv).

Standalone: it imports fairseq and torch only, never convseq. From the driver's case file (the
preset's overrides, the vocabulary sizes, convseq's state_dict, the batches) it builds fairseq
0.12's LightConvModel with dictionaries of the same sizes, loads the state_dict with
strict=True, and either trains (forward, label-smoothed loss, backward, Adam step per batch) or
translates the generation batches with fairseq's SequenceGenerator; it prints one JSON line.

On CPU fairseq's model takes its pure-PyTorch convolutions (its CUDA kernels are not built):
DynamicConv_scripatable, always the unfold form, and the LightweightConv factory's
LightweightConv1dTBC, band form in a full forward; unfold in incremental steps for both.

    bench/fairseq-venv/bin/python bench/lightconv_speed_fairseq_side.py --case C.pt \
        --what train --threads 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def build(case: dict):
    """fairseq's LightConvModel of the case, its target dictionary, the weights loaded."""
    from fairseq.data import Dictionary
    from fairseq.models import lightconv

    dicts = []
    for size in case["vocab"]:
        d = Dictionary()  # <s> 0, <pad> 1, </s> 2, <unk> 3: convseq's numbering
        for i in range(size - len(d)):
            d.add_symbol(f"w{i}")
        dicts.append(d)
    task = argparse.Namespace(source_dictionary=dicts[0], target_dictionary=dicts[1])
    args = argparse.Namespace(**case["overrides"])
    getattr(lightconv, case["arch"])(args)  # the preset's @register_model_architecture
    model = lightconv.LightConvModel.build_model(args, task)
    model.load_state_dict(case["state"], strict=True)
    return model, dicts[1]


def train(model, case: dict) -> dict:
    """Each batch: forward, fairseq's label-smoothed loss, backward, Adam step; the first
    `warmup` untimed. Also the first batch's loss in eval mode before training."""
    import torch
    from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss

    def loss_of(batch):
        src, lengths, prev, target = batch
        out = model(src, lengths, prev)
        lprobs = model.get_normalized_probs(out, log_probs=True)  # (B, T, V)
        lprobs = lprobs.view(-1, lprobs.size(-1))
        loss, _ = label_smoothed_nll_loss(lprobs, target.view(-1), case["smoothing"], 1)
        return loss

    model.eval()  # no dropout: both sides compute the same loss
    with torch.no_grad():
        first = float(loss_of(case["train"][0]).item())
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=case["lr"])
    tokens, seconds, cpu = 0, 0.0, 0.0
    for i, batch in enumerate(case["train"]):
        start, cpu_start = time.perf_counter(), time.process_time()
        opt.zero_grad()
        loss_of(batch).backward()
        opt.step()
        if i >= case["warmup"]:
            seconds += time.perf_counter() - start
            cpu += time.process_time() - cpu_start
            tokens += int(batch[3].ne(1).sum())
    return {"tokens": tokens, "seconds": seconds, "cpu_seconds": cpu, "first_loss": first}


def generate(model, tgt_dict, case: dict) -> dict:
    """The generation batches through SequenceGenerator (fairseq-generate's settings)."""
    import torch
    from fairseq.sequence_generator import SequenceGenerator

    # fairseq-generate's prepare_for_inference_: no attention returned unless printed
    model.make_generation_fast_(beamable_mm_beam_size=case["beam"], need_attn=False)
    gen = SequenceGenerator(
        [model], tgt_dict, beam_size=case["beam"], max_len_a=0, max_len_b=case["max_len_b"]
    )
    hyps, tokens = [], 0
    start, cpu_start = time.perf_counter(), time.process_time()
    with torch.no_grad():
        for src, lengths in case["generate"]:
            sample = {"net_input": {"src_tokens": src, "src_lengths": lengths}}
            for finalized in gen.generate([model], sample):
                best = finalized[0]["tokens"].tolist()
                hyps.append(best)
                tokens += len(best)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return {"tokens": tokens, "seconds": seconds, "cpu_seconds": cpu, "hyps": hyps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--case", required=True)
    parser.add_argument("--what", choices=("train", "generate"), required=True)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    case = torch.load(args.case, weights_only=False)
    torch.manual_seed(case["seed"])
    model, tgt_dict = build(case)
    if args.what == "train":
        result = train(model, case)
    else:
        result = generate(model.eval(), tgt_dict, case)
    print(json.dumps(result))


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # reported, not hidden: the driver prints it as this side's result
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
        sys.exit(3)
