"""Relative position methods: position enters the attention logits (and values) as a function of
``key_position - query_position``.

One module per family, each a pure-function core plus a thin :class:`~posenc.method.PositionMethod`
registered for the tiny LM:

=========================  ===================================  ======================  ==========
module                     method                               paper                   registered
=========================  ===================================  ======================  ==========
:mod:`.shaw`               clipped learned key/value vectors    arXiv:1803.02155        ``shaw``
:mod:`.transformer_xl`     u, v, sinusoidal R, relative shift   arXiv:1901.02860        ``transformer_xl``
:mod:`.t5`                 per-head scalar of a log bucket      arXiv:1910.10683        ``t5``
:mod:`.deberta`            disentangled c2p + p2c, 1/sqrt(3D)   arXiv:2006.03654        ``deberta``
:mod:`.tupe`               untied position-position term        arXiv:2006.15595        ``tupe``
=========================  ===================================  ======================  ==========

:mod:`.common` holds what they share: :func:`relative_positions`, the four-term expansion
:func:`four_terms`, :func:`relative_shift`, and :class:`RelativeScalarBias`, the base of biases that
depend only on (head, relative position), which run on the flex backend with no ``T x S`` tensor.
"""

from posenc.relative.common import RelativeScalarBias, four_terms, relative_positions, relative_shift
from posenc.relative.deberta import DebertaPE, deberta_bias, deberta_log_bucket, deberta_relative_ids
from posenc.relative.shaw import ShawRelativePE, shaw_key_bias, shaw_relative_ids, shaw_value_term
from posenc.relative.t5 import T5RelativeBias, t5_bias, t5_relative_bucket
from posenc.relative.transformer_xl import TransformerXLPE, transformer_xl_bias, transformer_xl_sinusoids
from posenc.relative.tupe import TUPE, tupe_position_logits

__all__ = [
    "DebertaPE",
    "RelativeScalarBias",
    "ShawRelativePE",
    "T5RelativeBias",
    "TUPE",
    "TransformerXLPE",
    "deberta_bias",
    "deberta_log_bucket",
    "deberta_relative_ids",
    "four_terms",
    "relative_positions",
    "relative_shift",
    "shaw_key_bias",
    "shaw_relative_ids",
    "shaw_value_term",
    "t5_bias",
    "t5_relative_bucket",
    "transformer_xl_bias",
    "transformer_xl_sinusoids",
    "tupe_position_logits",
]
