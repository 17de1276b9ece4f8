"""posenc: positional encodings for Transformers, the code of *Positional Encoding: an executable textbook*.

Shape legend (used in every docstring of the package):

    B  batch size
    H  attention heads
    T  query length (tokens whose outputs are computed)
    S  key/value length (tokens attended to; S == T without a cache)
    D  head dimension
    C  model width (d_model = H * D)
    N  number of positions in a table
    V  vocabulary size

Conventions:

* Positions are integer indices starting at 0.
* Relative position is ``key_position - query_position`` everywhere
  (negative for keys in the past).
* Boolean masks mark what is *removed*: ``key_padding_mask[b, s] is True``
  means key ``s`` of batch row ``b`` is padding (the ``torch.nn.MultiheadAttention``
  convention; a Hugging Face ``attention_mask`` is its logical negation).

Where position enters a model (see :mod:`posenc.method`):

1. added to (or multiplied into) the token embeddings, before the first layer;
2. a transform of queries and keys inside every attention layer;
3. a bias on the attention logits inside every attention layer.

Two floors. This package's top level is what an engineer imports next to a checkpoint: the position
methods (:mod:`posenc.absolute`, :mod:`posenc.naive`, :mod:`posenc.recursive`,
:mod:`posenc.complex_order`, :mod:`posenc.relative`, :mod:`posenc.rope`, :mod:`posenc.alibi`),
attention (:mod:`posenc.attention`), the KV cache (:mod:`posenc.kv_cache`), reading Hugging Face
configs (:mod:`posenc.rope.hf_config`) and running inside transformers models (:mod:`posenc.hf`).
:mod:`posenc.lab` is what the book runs on top of it (the tiny LM, training, data, the studies,
diagnostics, notebook helpers); nothing in the top level imports it.
"""

from posenc.attention import SelfAttention, attention, causal_mask
from posenc.method import METHODS, NoPE, PositionMethod, build_method, register_method
from posenc import absolute, alibi, naive, recursive, relative, rope  # noqa: F401  (register their methods)

__version__ = "0.2.1"

__all__ = [
    "METHODS",
    "NoPE",
    "PositionMethod",
    "SelfAttention",
    "attention",
    "build_method",
    "causal_mask",
    "register_method",
]
