"""bench/machine.py: /proc/cpuinfo read into a model name and the flags that decide a benchmark's
speed, the one-line summary above every benchmark's table, and that every benchmark prints it.

The benchmarks' own output (the line on top, "machine" in their JSON) is checked beside each
benchmark's cheap run: tests/test_bench_scale.py, test_gpu_check.py, test_bench_vs_fairseq.py and
test_bench_decoder_compile.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
from machine import FLAGS, machine, machine_line, parse_cpuinfo  # noqa: E402

# Two processors each, the second different: only the first counts. The flags are in the kernel's
# order (not FLAGS'), with look-alikes that must not match (avx_vnni, avx512vbmi, "vmx flags").
EPYC = """\
processor	: 0
vendor_id	: AuthenticAMD
cpu family	: 25
model		: 17
model name	: AMD EPYC 9R14 96-Core Processor
flags		: fpu vme de pse tsc msr sse sse2 ssse3 fma cx16 sse4_1 sse4_2 avx f16c bmi1 avx2 bmi2 \
avx512f avx512dq adx avx512ifma avx512cd sha_ni avx512bw avx512vl avx512_bf16 avx512vbmi umip \
avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni avx512_bitalg avx512_vpopcntdq
bogomips	: 5199.99

processor	: 1
model name	: Some Other CPU
flags		: fpu sse sse2 amx_tile amx_bf16
"""
XEON = """\
processor	: 0
vendor_id	: GenuineIntel
model name	: Intel(R) Xeon(R) Platinum 8488C
flags		: fpu vme sse sse2 ssse3 fma sse4_1 sse4_2 avx avx2 avx512f avx512dq avx512cd avx512bw \
avx512vl avx_vnni avx512_bf16 avx512vbmi avx512_vbmi2 gfni avx512_vnni avx512_bitalg \
avx512_vpopcntdq serialize tsxldtrk amx_bf16 avx512_fp16 amx_tile amx_int8 flush_l1d
vmx flags	: vnmi preemption_timer invvpid ept_x_only ept_ad
bugs		: spectre_v1 spectre_v2

processor	: 1
model name	: Intel(R) Xeon(R) Platinum 8488C
flags		: fpu sse
"""


def test_parse_cpuinfo_epyc_without_amx():
    got = parse_cpuinfo(EPYC)
    assert got["model"] == "AMD EPYC 9R14 96-Core Processor"
    assert got["flags"] == ["avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16"]


def test_parse_cpuinfo_xeon_with_amx():
    got = parse_cpuinfo(XEON)
    assert got["model"] == "Intel(R) Xeon(R) Platinum 8488C"
    assert got["flags"] == [
        "avx2",
        "fma",
        "avx512f",
        "avx512_vnni",
        "avx512_bf16",
        "avx512_fp16",
        "amx_tile",
        "amx_bf16",
        "amx_int8",
    ]
    assert got["flags"] == list(FLAGS)  # every flag the module knows, in its order


def test_parse_cpuinfo_without_cpuinfo_fields():
    assert parse_cpuinfo("processor\t: 0\n") == {"model": "", "flags": []}


def test_machine_line_names_model_flags_torch_and_gpu():
    info = {
        "model": "AMD EPYC 9R14 96-Core Processor",
        "flags": ["avx512f", "avx512_bf16"],
        "cpus": 8,
        "torch": "2.5.1",
        "threads": 4,
        "aten_isa": "AVX512",
        "gpu": "NVIDIA H100 80GB HBM3",
    }
    assert machine_line(info) == (
        "CPU: AMD EPYC 9R14 96-Core Processor (AVX512F, AVX512_BF16), 8 CPUs, "
        "torch 2.5.1 (AVX512), 4 threads, GPU: NVIDIA H100 80GB HBM3"
    )


def test_machine_line_without_flags_torch_or_gpu():
    line = machine_line({"model": "aarch64", "flags": [], "cpus": 2})
    assert line == "CPU: aarch64 (no AVX-512/AMX flags), 2 CPUs"
    one = machine_line({"model": "m", "flags": [], "cpus": 2, "torch": "t", "threads": 1})
    assert one.endswith("torch t, 1 thread")


def test_machine_of_this_process():
    info = machine()
    assert info["model"] and info["cpus"] >= 1
    assert info["flags"] == [f for f in FLAGS if f in info["flags"]]  # known flags, FLAGS order
    assert (info["torch"], info["threads"]) == (torch.__version__, torch.get_num_threads())
    assert ("gpu" in info) == torch.cuda.is_available()
    assert machine_line().startswith(f"CPU: {info['model']} (")


# Every script under bench/ that prints figures, and the helpers that print none of their own.
HELPERS = {"machine.py", "search_inputs.py", "search_baseline.py", "fairseq_side.py"}
# fairseq's halves of the layer comparisons (run in its venv; their drivers print the line)
HELPERS |= {
    "conv_layers_fairseq_side.py",
    "lightconv_layers_fairseq_side.py",
    "fairseq_cases_side.py",
    "lightconv_fairseq_side.py",  # bench_lightconv_vs_fairseq.py's fairseq half
    "lightconv_speed_fairseq_side.py",  # bench_lightconv_vs_fairseq_speed.py's fairseq half
}
# gpu_check.py's parts: it prints the machine line for all of them
HELPERS |= {"gpu_common.py", "gpu_parity.py", "gpu_runpy.py", "gpu_train.py", "gpu_translate.py"}
HELPERS |= {"gpu_lightconv.py"}
BENCHMARKS = sorted(p.name for p in BENCH.glob("*.py") if p.name not in HELPERS)


def test_the_benchmarks_are_found():
    assert {
        "bench_batching.py",
        "bench_decoder_compile.py",
        "bench_incremental.py",
        "bench_scale.py",
        "bench_search.py",
        "bench_train.py",
        "bench_vs_fairseq.py",
        "bench_vs_fairseq_gen.py",
        "soak_generate.py",
        "soak_train.py",
        "gpu_check.py",
    } <= set(BENCHMARKS)


@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmark_prints_the_machine_line(name):
    """A new benchmark that forgets the line fails here (or belongs in HELPERS: no figures)."""
    text = (BENCH / name).read_text(encoding="utf-8")
    # bench_vs_fairseq's machine_of_run prints it for both of its halves
    assert "machine_line(" in text or "machine_of_run(" in text, f"{name} prints no machine line"
