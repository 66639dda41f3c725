"""The tasks: one module per ``task=`` value, each with a ``run_<task>(cfg)``.

The command line above (`convseq.cli`) composes and checks the config and calls the task;
tests, notebooks and scripts may call a task's function directly with a config of their own.
"""
