"""The book's laboratory: what the chapters run on top of posenc's position methods.

A tiny decoder-only language model with a pluggable position method (:mod:`posenc.lab.lm`), its
training loop and evaluation (:mod:`posenc.lab.train`), data that needs no download
(:mod:`posenc.lab.data`), the stored studies (:mod:`posenc.lab.experiments`), attention diagnostics
(:mod:`posenc.lab.diagnostics`), the matrix analysis of position tables (:mod:`posenc.lab.analysis`),
the digit toy of chapter 8 (:mod:`posenc.lab.digits`), the convolutional position probe of chapter 5
(:mod:`posenc.lab.cnn_position`) and the chapters' notebook helpers (:mod:`posenc.lab.notebook`).

The lab imports the core (``posenc``'s top level); the core never imports the lab.
"""

from posenc.lab.lm import LMConfig, TinyLM

__all__ = ["LMConfig", "TinyLM"]
