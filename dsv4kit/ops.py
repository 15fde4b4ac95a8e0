"""Public ops: one per registered kernel family, built from its spec (the argument table as the
signature, the backend chosen through :mod:`dsv4kit.platform`, every check before any launch,
the kernel warmup compiled): ``dsv4kit.ops.<op_name>`` for each family of
:func:`dsv4kit.kernels.families`.

Importing this module also defines each op as a torch op, ``torch.ops.dsv4kit.<op_name>``
(:mod:`dsv4kit.family.torch_op`), on any device: under ``torch.compile`` the public op calls it, so
a compiled graph holds the op whole; eager calls do not go through the dispatcher.
"""

from dsv4kit.family.torch_op import register as _register_torch_op
from dsv4kit.kernels import families as _families

for _spec in _families():
    _register_torch_op(_spec)  # strict: a registered family must declare its outputs or writes
    globals()[_spec.op_name] = _spec.op

__all__ = [_spec.op_name for _spec in _families()]
del _spec
