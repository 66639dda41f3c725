"""Every configuration mistake on run.py's command line is one line on stderr and exit status 2,
before Hydra runs: an unknown group option (its options and the closest), a value of the wrong
type (the key, the value, the type), an unknown task, an override Hydra cannot read, each value
of a sweep under -m, in each task's primary config; and each task's messages name that task.

Here main_guard is called in-process; test_reliability_config.py reads run.py's own stderr."""

from __future__ import annotations

import io

import pytest

from convseq.cli.command_line import main_guard
from convseq.cli.dispatch import dispatch
from convseq.errors import CheckpointError
from convseq.tasks.config import TASK_CONFIGS, GenerateTaskConfig
from convseq.tasks.interactive import run_interactive
from tests.conftest import CONF_DIR, compose_config

OPTIM_OPTIONS = sorted(p.stem for p in (CONF_DIR / "optim").glob("*.yaml"))


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """main_guard's one line for `argv`, having checked the exit status and the line count."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main_guard(argv, CONF_DIR)
    err = capsys.readouterr().err
    assert e.value.code == 2, err
    assert err.endswith("\n") and err.count("\n") == 1, err  # one line
    assert err.startswith("convseq: error: "), err
    assert "HYDRA_FULL_ERROR" not in err and "search path" not in err.lower()
    return err.removeprefix("convseq: error: ").strip()


def test_an_unknown_group_option_names_the_options_and_the_closest(capsys):
    msg = refused(["optim=nagg", "trainer.max_epochs=1"], capsys)
    assert msg.startswith("unknown option optim=nagg (did you mean optim=nag?)"), msg
    assert len(OPTIM_OPTIONS) >= 3
    assert msg.endswith("the options of optim are " + ", ".join(OPTIM_OPTIONS)), msg


def test_an_option_close_to_none_lists_the_options_without_a_guess(capsys):
    msg = refused(["anneal=zzzzzz"], capsys)
    assert "did you mean" not in msg
    assert "unknown option anneal=zzzzzz: the options of anneal are " in msg
    for option in (p.stem for p in (CONF_DIR / "anneal").glob("*.yaml")):
        assert option in msg


@pytest.mark.parametrize(
    ("override", "key", "expected", "given"),
    [
        ("optim.lr=abc", "optim.lr", "a float", "the string 'abc'"),
        ("trainer.max_epochs=two", "trainer.max_epochs", "an integer", "the string 'two'"),
        ("model.dropout=[1]", "model.dropout", "a float", "the list [1]"),
        (
            "batching.max_tokens=lots",
            "batching.max_tokens",
            "an integer or null",
            "the string 'lots'",
        ),
        ("trainer.tf32=maybe", "trainer.tf32", "true or false", "the string 'maybe'"),
        ("trainer.max_epochs=1.5", "trainer.max_epochs", "an integer", "the number 1.5"),
        ("optim.lr=null", "optim.lr", "a float", "null"),
    ],
)
def test_a_value_of_the_wrong_type_names_the_key_the_value_and_the_type(
    capsys, override, key, expected, given
):
    assert refused([override], capsys) == f"{override}: {key} takes {expected}, not {given}"


# each task (its own primary config, conf/<task>.yaml): a key it reads given a wrong type, and
# a group option it composes given an unknown name
TASK_MISTAKES = {
    "train": ("optim.clip_norm=high", "a float", "model=fconvv"),
    "preprocess": ("data.subword.vocab_size=big", "an integer", "data=toyy"),
    "generate": ("gen.beam=wide", "an integer", "trainer=gpuu"),
    "interactive": ("gen.beam=wide", "an integer", "trainer=gpuu"),
    "average": ("average.last_n=five", "an integer", "paths=nowhere"),
    "compare": ("compare.n_samples=many", "an integer", "data=toyy"),
    "report": ("report.test=perhaps", "true or false", "paths=nowhere"),
    "import_fairseq": ("optim.lr=abc", "a float", "optim=nagg"),
}


def test_every_task_is_listed():
    assert set(TASK_MISTAKES) == set(TASK_CONFIGS)


@pytest.mark.parametrize("task", sorted(TASK_MISTAKES))
def test_each_tasks_config_gives_the_same_shape(capsys, task):
    wrong, expected, option = TASK_MISTAKES[task]
    key = wrong.split("=")[0]
    msg = refused([f"task={task}", wrong], capsys)
    assert msg.startswith(f"{wrong}: {key} takes {expected}, not "), msg
    group = option.split("=")[0]
    msg = refused([f"task={task}", option], capsys)
    assert msg.startswith(f"unknown option {option}"), msg
    options = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
    assert msg.endswith(f"the options of {group} are {', '.join(options)}"), msg


def test_sweeps_are_checked_value_by_value(capsys):
    msg = refused(["-m", "optim=nag,sgd,nagg"], capsys)
    assert msg.startswith("unknown option optim=nagg (did you mean optim=nag?)"), msg
    msg = refused(["--multirun", "optim.lr=0.1,0.2,abc", "optim=nag,sgd"], capsys)
    assert msg.startswith("optim.lr=abc: optim.lr takes a float, not the string 'abc'"), msg
    msg = refused(["-m", "trainer.max_epochs=range(1,4)", "optim.lr=choice(0.1,x)"], capsys)
    assert msg.startswith("optim.lr=x: optim.lr takes a float"), msg


def test_good_sweeps_and_single_runs_pass():
    main_guard(["-m", "optim=nag,sgd", "optim.lr=0.1,0.2", "seed=range(1,30)"], CONF_DIR)
    main_guard(["-m", "optim.lr=interval(0.01,0.1)"], CONF_DIR)  # the sweeper's to draw
    main_guard(["optim=sgd", "optim.lr=0.5", "model.dropout=0.2"], CONF_DIR)
    main_guard(["task=generate", "ckpt=x.ckpt", "data.dir=/somewhere", "gen.beam=3"], CONF_DIR)
    main_guard(["optim=nagg", "--help"], CONF_DIR)  # Hydra's own help: left to Hydra


def test_an_unknown_task_names_the_tasks_and_the_closest(capsys):
    msg = refused(["task=interactiv", "ckpt=x.ckpt"], capsys)
    assert msg.startswith("unknown task=interactiv (did you mean task=interactive?)"), msg
    for task in TASK_CONFIGS:
        assert task in msg


def test_a_group_of_another_tasks_config_names_those_tasks(capsys):
    msg = refused(["task=report", "optim=nag"], capsys)
    assert msg.startswith("unknown config key optim for task=report"), msg
    assert "task=train" in msg and "task=import_fairseq" in msg


def test_an_added_key_the_schema_lacks_still_gets_did_you_mean(capsys):
    msg = refused(["+optim.lrr=0.1"], capsys)
    assert msg.startswith("unknown config key optim.lrr (did you mean optim.lr?)"), msg


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["optim.lr=[0.1"], "cannot read the override optim.lr=[0.1"),
        (["optim=nag,sgd"], "--multirun"),  # a sweep without -m
    ],
)
def test_what_hydra_itself_refuses_is_one_line_too(capsys, argv, words):
    assert words in refused(argv, capsys)


@pytest.mark.parametrize(
    "task", ["generate", "interactive", "average", "compare", "report", "import_fairseq"]
)
def test_a_missing_input_names_the_task_that_needs_it(task, tmp_path, cache_dir, capsys):
    cfg = compose_config([f"task={task}"], output_dir=str(tmp_path))
    with pytest.raises(SystemExit) as e:
        dispatch(cfg)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert f"task={task} " in err or f"task={task}:" in err, err
    named = {t for t in TASK_CONFIGS if f"task={t} " in err or f"task={t}:" in err}
    assert named == {task}, err


def test_interactive_without_a_checkpoint_says_task_interactive():
    cfg = GenerateTaskConfig(task="interactive")
    with pytest.raises(CheckpointError, match=r"^task=interactive needs ckpt=PATH"):
        run_interactive(cfg, io.BytesIO(b""), io.StringIO(), io.StringIO())
