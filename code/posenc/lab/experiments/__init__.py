"""Experiments too costly for a live notebook cell, run from the command line and stored as JSON.

:mod:`posenc.lab.experiments.compare` trains the tiny LM with several position methods and several
seeds, on byte-level language modelling and on a task that cannot be solved without position,
and writes one record per (arm, seed, setting) with the provenance of the run. The chapters plot
the stored records beside a small live run of the same code. :mod:`posenc.lab.experiments.tables`
measures what training writes into a learned table, once per seed, for the ``"tables"`` study.

:mod:`posenc.lab.experiments.extrapolation` is the length-extrapolation study: every method trained at
a length ``L`` and evaluated at several multiples of it, with log-n scaling and RoPE's scalings
(:mod:`posenc.lab.experiments.variants`), configured by :mod:`posenc.lab.experiments.extrapolation_config`
and plotted by :mod:`posenc.lab.experiments.extrapolation_plots`. It
runs in one process or, under ``torchrun``, on several processes and machines
(:mod:`posenc.lab.experiments.distributed`). Both runners store their records with
:mod:`posenc.lab.experiments.records` (provenance, locked appends, resume);
:mod:`posenc.lab.experiments.options` turns a configuration dataclass into command-line options.

The experiments protocol (the book's "How the experiments work"): :mod:`posenc.lab.experiments.budget`
measures how many steps the studies' model needs; ``compare``'s protocol studies
(``--protocol``, :data:`~posenc.lab.experiments.compare.PROTOCOL_STUDIES`) tune each method's one
knob on a seed of its own, record learning curves and per-item scores, and are summarised with
:mod:`posenc.lab.experiments.stats` (intervals over seeds, the evaluation-sample bootstrap, and the
one meaning of "separated").
"""
