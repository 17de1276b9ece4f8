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
"""
