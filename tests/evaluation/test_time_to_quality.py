"""A run's own time to quality: minutes since the command started at every validation, the
first minute each whole number of valid BLEU was reached, the line printed at the end."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from convseq.evaluation.history import minutes_to_scores, time_to_quality_line
from tests.training_utils import summary, tiny_config


def test_each_whole_number_takes_the_first_validation_that_reached_it():
    validations = [
        {"minutes": 1.0, "valid/bleu": 20.5},
        {"minutes": 2.0, "valid/bleu": 19.0},  # a worse one changes nothing
        {"minutes": 3.0, "valid/bleu": 22.1},
        {"minutes": 4.0, "valid/loss": 3.0},  # no BLEU at this validation
        {"valid/bleu": 30.0},  # no minutes (a run from before they were kept)
        {"minutes": 5.0, "valid/bleu": float("nan")},
    ]
    reached = minutes_to_scores(validations)
    assert sorted(reached) == list(range(1, 23))
    assert {reached[n] for n in range(1, 21)} == {1.0}
    assert reached[21] == reached[22] == 3.0
    line = time_to_quality_line(reached)
    assert (
        line == "valid BLEU first reached <=20 at 1.0, 21-22 at 3.0 min (since the command started)"
    )
    line = time_to_quality_line({1: 0.5, 2: 0.9, 3: 0.9, 4: 1.2})
    assert line.startswith("valid BLEU first reached 1 at 0.5, 2-3 at 0.9, 4 at 1.2 min")
    assert time_to_quality_line({}) is None


def test_the_clock_starts_with_the_process_not_with_the_import():
    code = (
        "import time; time.sleep(1.2)\n"
        "from convseq.common.clock import process_seconds\n"
        "print(process_seconds())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert 1.2 <= float(out.stdout) < 10.0


def test_validations_carry_the_commands_minutes_across_a_resume(tiny_data, tmp_path, capsys):
    from convseq.tasks.train import train

    common = ["bleu_every_n_epochs=1", "final_test=false"]
    train(tiny_config(tiny_data, tmp_path, "trainer.max_epochs=2", *common))
    first = summary(tmp_path)["validations"]
    t0 = time.monotonic()
    train(tiny_config(tiny_data, tmp_path, "trainer.max_epochs=3", "resume=true", *common))
    second = (time.monotonic() - t0) / 60
    s = summary(tmp_path)
    minutes = [v["minutes"] for v in s["validations"]]
    assert len(minutes) == 3 and minutes[:2] == [v["minutes"] for v in first]
    assert 0 < minutes[0] < minutes[1] < minutes[2]
    # the resumed run counts on from the first one's time (its clock starts with it)
    assert minutes[2] - minutes[1] < second
    expected = {}
    for v in s["validations"]:
        for n in range(1, int(v["valid/bleu"]) + 1):
            expected.setdefault(str(n), v["minutes"])
    assert s["minutes_to_valid_bleu"] == expected
    json.dumps(s)  # plain JSON
