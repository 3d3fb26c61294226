"""Kernels, one module per operator family; importing this package registers them all."""

from . import (  # noqa: F401 - importing registers the kernels
    control_flow,
    conv,
    conv_extra,
    elementwise,
    fused,
    indexing,
    math,
    ml,
    nn,
    pool,
    quant,
    randomness,
    reduce,
    rnn,
    sequence,
    signal,
    strings,
    tensor,
    training,
    vision,
)
