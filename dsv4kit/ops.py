"""Public ops: one per registered kernel family, built from its spec (the argument table as the
signature, the backend chosen through :mod:`dsv4kit.platform`, every check before any launch,
the kernel warmup compiled): ``dsv4kit.ops.<op_name>`` for each family of
:func:`dsv4kit.kernels.families`."""

from dsv4kit.kernels import families as _families

for _spec in _families():
    globals()[_spec.op_name] = _spec.op

__all__ = [_spec.op_name for _spec in _families()]
del _spec
