"""Compiled backends under the warmup contract.

* :mod:`dsv4kit.backends.triton` — ``TritonJitKernel``: declared parameters checked against
  the CompileKey, AOT compiles for an explicit target on CPU, ``JITFunction.warmup`` on a GPU
  (same cache as launches), the interpreter on CPU, Triton's compile hook for the monitor.
* :mod:`dsv4kit.backends.cutedsl` — ``CuTeDSLJitKernel``: fake tensors and stream, compiles
  with an explicit ``--gpu-arch`` (and TVM-FFI), the ``cute.compile`` wrapper for the monitor.

Both keep one :class:`~dsv4kit.jit.CompileArtifact` per key (PTX, cubin, registers, spills).
The submodules are imported on demand: importing this package imports neither compiler.
See ``docs/backends.md`` for the compiler internals these rely on.
"""
