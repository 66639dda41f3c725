"""The command line of a fairseq-side case script (run with bench/fairseq-venv's Python): read
the cases a driver saved, run each through fairseq, save the outputs, print one JSON line; an
error is printed as that line (the driver shows it) and exits 3. Imports no convseq: the
fairseq venv has none. Its driver's half is `vs_fairseq_common.fairseq_cases`."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable


def serve(run_case: Callable[[dict], dict], description: str) -> None:
    """`python SIDE.py --cases IN.pt --out OUT.pt [--threads N]` with `run_case` per case."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--cases", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    try:
        import torch

        torch.set_num_threads(args.threads)
        cases = torch.load(args.cases, weights_only=True)
        torch.save([run_case(case) for case in cases], args.out)
        print(json.dumps({"cases": len(cases)}))
    except Exception as e:  # reported, not hidden: the driver prints it as this side's result
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
        sys.exit(3)
