"""DSv4 at model level: presets, the attention stack that registers every kernel family per
layer, serving traces replayed against it (coverage of the warmup keys), and the pipeline that
runs a trace on real tensors and judges the kernels against the references step by step.

``presets`` is light (no kernel imports); ``stack`` and ``trace`` import the kernel families
lazily, so ``import dsv4kit.model`` stays cheap.
"""

from dsv4kit.model.presets import DSV4_FLASH, DSV4_PRO, PRESETS, ModelPreset

__all__ = ["DSV4_FLASH", "DSV4_PRO", "PRESETS", "ModelPreset"]
