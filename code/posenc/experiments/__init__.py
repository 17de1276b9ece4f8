"""Experiments too costly for a live notebook cell, run from the command line and stored as JSON.

:mod:`posenc.experiments.compare` trains the tiny LM with several position methods and several
seeds, on byte-level language modelling and on a task that cannot be solved without position,
and writes one record per (arm, seed, setting) with the provenance of the run. The chapters plot
the stored records beside a small live run of the same code. :mod:`posenc.experiments.tables`
measures what training writes into a learned table, once per seed, for the ``"tables"`` study.

:mod:`posenc.experiments.extrapolation` is the length-extrapolation study: every method trained at
a length ``L`` and evaluated at several multiples of it, with log-n scaling and RoPE's scalings
(:mod:`posenc.experiments.variants`), configured by :mod:`posenc.experiments.extrapolation_config`
and plotted by :mod:`posenc.experiments.extrapolation_plots`. It
runs in one process or, under ``torchrun``, on several processes and machines
(:mod:`posenc.experiments.distributed`). Both runners store their records with
:mod:`posenc.experiments.records` (provenance, locked appends, resume);
:mod:`posenc.experiments.options` turns a configuration dataclass into command-line options.

The experiments protocol (the book's "How the experiments work"): :mod:`posenc.experiments.budget`
measures how many steps the studies' model needs; ``compare``'s protocol studies
(``--protocol``, :data:`~posenc.experiments.compare.PROTOCOL_STUDIES`) tune each method's one
knob on a seed of its own, record learning curves and per-item scores, and are summarised with
:mod:`posenc.experiments.stats` (intervals over seeds, the evaluation-sample bootstrap, and the
one meaning of "separated").
"""
