"""Large-batch studies: where a model stops scaling with the batch size, measured on Optuna.

A study is declared in a file (Python or YAML, ``largebatch.study.spec``) beside a training
config: the optimizers and global batch sizes to compare, the search space, the target on a
held-out split, the trials per cell and the seeds. ``largebatch study run STUDY`` turns it
into trials, each one ``largebatch train`` run with ``--set`` overrides in its own run
directory, recorded in an Optuna storage (an SQLite file in the study's folder by default);
``study status`` and ``study report`` read that storage.

The protocol is Shallue et al. 2019 ("Measuring the Effects of Data Parallelism on Neural
Network Training") with the fairness rule of Nado et al. 2021 ("A Large Batch Optimizer
Reality Check"): every (optimizer, batch) cell gets the same tuning budget, N scrambled
Sobol points of the same search space (Optuna's ``QMCSampler``, ``plan``), and the best is
the trial that reaches the target on the held-out split in the fewest steps (none reached:
the best held-out value). The best configuration is then re-run with fresh seeds; steps to
target are read on the test split of those runs only, to a stated resolution
(``target``), and fitted with McCandlish et al. 2018's S = S_min (1 + B_crit / B) with a
bootstrap over seeds (``fit``); Zhang et al. 2024's critical batch (steps 20% above perfect
scaling) is reported beside it, and B_simple from the ``noise_scale`` hook at a fixed
held-out loss.

Modules, one idea each: ``spec`` (the study file), ``space`` (the search space and its
edges), ``data`` (carving the held-out split), ``evaluation`` (the hook that evaluates a
trial densely near the target and stops it), ``target`` (steps to target), ``storage``
(Optuna storages), ``ledger`` (claiming, heartbeats, finishing trials), ``plan`` (which
trials a study needs), ``runner`` (one trial as a subprocess), ``worker`` (the loop),
``analysis``, ``fit``, ``report``, ``plots``, ``cli``; the critical batch along a run by
branching from its checkpoints (Merrill et al. 2025): ``branches`` (the measurement),
``branch_trials`` (the branches as trials), ``branch_hook``, ``branch_report``, ``branch_plots``;
named training recipes compared over seeds: ``arm_trials`` (the arms as trials),
``arm_report`` (medians, ranges and the rank test over seeds), ``arm_plots``.
"""
