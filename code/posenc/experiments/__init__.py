"""Experiments too costly for a live notebook cell, run from the command line and stored as JSON.

:mod:`posenc.experiments.compare` trains the tiny LM with several position methods and several
seeds, on byte-level language modelling and on a task that cannot be solved without position,
and writes one record per (arm, seed, setting) with the provenance of the run. The chapters plot
the stored records beside a small live run of the same code. :mod:`posenc.experiments.tables`
measures what training wrote into a learned table, once per seed, for the ``"tables"`` study.
"""
