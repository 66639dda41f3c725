#!/usr/bin/env bash
# Build the benchmark-only fairseq peer in bench/fairseq-venv (git-ignored): fairseq 0.12
# (PyPI's fairseq-fixed 0.12.3.1, which adds Python 3.11 support) against the same CPU torch
# 2.13.0 as convseq. fairseq is never a dependency of convseq, its tests or CI; only
# bench/bench_vs_fairseq.py runs it, in its own processes. About 5 minutes on 2 cores.
#   bash bench/make_fairseq_venv.sh            # then: bench/fairseq-venv/bin/fairseq-train ...
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/fairseq-venv"
if [ -x "$venv/bin/fairseq-train" ]; then
    echo "$venv already holds fairseq"; exit 0
fi
python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
# the CPU build of torch that convseq pins (an unpinned torch would pull a CUDA build)
"$venv/bin/pip" install -q torch==2.13.0
# fairseq's runtime dependencies, without torchaudio (it would pull another torch)
"$venv/bin/pip" install -q hydra-core==1.3.2 omegaconf==2.3.0 numpy regex sacrebleu tqdm \
    bitarray scikit-learn packaging cython setuptools wheel
# builds its C++/Cython extensions from the sdist against the torch above
"$venv/bin/pip" install -q --no-deps --no-build-isolation fairseq-fixed==0.12.3.1
TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 "$venv/bin/python" -c "import fairseq; print('fairseq', fairseq.__version__)"
