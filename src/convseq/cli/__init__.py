"""The command line: what stands between `python run.py ...` and a task.

`dispatch` runs the task that `task=` names (a module of `convseq.tasks`), `schema` registers
the typed config with Hydra, `command_line` and `config_check` read and check the command
line's keys, `hydra_callbacks` hooks into multiruns (the sweep report), `optuna_search` keeps an
Optuna study resumable, `rank_args` gives the ranks of a multi-process launch their arguments.
Nothing else in convseq imports from here.
"""
