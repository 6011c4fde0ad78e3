"""The toy study of CB paper section 5.1: a population of emission sequences and labels, a
learner of the same form trained with each estimator of :mod:`cbasr.estimators` or the exact
marginal, the sweep over ``T``, ``N``, ``M`` and ``sigma``, and its report.

- :mod:`cbasr.toy.population`: the population and learner, sampling, rewards, parameter MSE.
- :mod:`cbasr.toy.training`: one training run per method, with its per-step records.
- :mod:`cbasr.toy.sweep`: the typed sweep file and the runs it expands to.
- :mod:`cbasr.toy.compare`: gradient variance and bias of every estimator at shared parameters.
- :mod:`cbasr.toy.report`: the results table and plots.

Run it with ``recipes/toy/run.sh`` or ``python -m cbasr.toy {train,compare,report}``.
"""
