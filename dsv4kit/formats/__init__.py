"""Numeric formats of DSv4 (spec §2): bit primitives, RoPE, Q8, Q4, cache layouts, encoders E1-E5.

Pure PyTorch, normative. Each submodule cites the spec section it implements.
"""

from dsv4kit.formats import (
    bits,
    checks,
    diagram,
    ds_mla,
    fp8,
    indexer_cache,
    mxfp4,
    plain_row,
    rope,
    state_cache,
)
from dsv4kit.formats.bits import *  # noqa: F403
from dsv4kit.formats.checks import *  # noqa: F403
from dsv4kit.formats.diagram import *  # noqa: F403
from dsv4kit.formats.ds_mla import *  # noqa: F403
from dsv4kit.formats.fp8 import *  # noqa: F403
from dsv4kit.formats.indexer_cache import *  # noqa: F403
from dsv4kit.formats.mxfp4 import *  # noqa: F403
from dsv4kit.formats.plain_row import *  # noqa: F403
from dsv4kit.formats.rope import *  # noqa: F403
from dsv4kit.formats.state_cache import *  # noqa: F403

#: The public names of the submodules (each lists its own in ``__all__``).
__all__ = [
    *bits.__all__,
    *checks.__all__,
    *diagram.__all__,
    *ds_mla.__all__,
    *fp8.__all__,
    *indexer_cache.__all__,
    *mxfp4.__all__,
    *plain_row.__all__,
    *rope.__all__,
    *state_cache.__all__,
]
