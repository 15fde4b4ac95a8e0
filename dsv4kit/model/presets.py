"""DeepSeek-V4 model presets: the constants of spec §1 as frozen dataclasses.

Provenance markers used in docstrings and comments:

* ``ext`` -- taken from the public model config, not from kernel code (spec §1).
* ``inf`` -- inferred (derived by the spec from other values).
* ``assumed`` -- DSv4-Pro only: the spec states no value, so the DSv4-Flash value is used.

Everything unmarked is stated directly by the spec for DSv4-Flash.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from dsv4kit.formats.ds_mla import ds_min_page_stride
from dsv4kit.formats.rope import YarnConfig, yarn_correction_range

__all__ = [
    "RopePreset",
    "CompressorPreset",
    "ModelPreset",
    "DSV4_FLASH",
    "DSV4_PRO",
    "dsv4_compress_ratios",
    "PRESETS",
]


def dsv4_compress_ratios(num_layers: int = 43) -> tuple[int, ...]:
    """Per-layer compress ratios (ext): layers 0, 1 -> 0 (sliding-window only); then even -> 4, odd -> 128."""
    return tuple(0 if layer < 2 else (4 if layer % 2 == 0 else 128) for layer in range(num_layers))


@dataclass(frozen=True)
class RopePreset:
    """One RoPE flavour: ``theta`` (ext), optional YaRN (ext), cos/sin cache rows ``max_pos``."""

    theta: float
    yarn: YarnConfig | None
    max_pos: int
    rope_dim: int = 64

    def correction_range(self) -> tuple[int, int] | None:
        """YaRN ``(low, high)`` of §2.2 (``(15, 25)`` for theta 160 000), or None for plain RoPE."""
        return None if self.yarn is None else yarn_correction_range(self.theta, self.yarn, self.rope_dim)


@dataclass(frozen=True)
class CompressorPreset:
    """One compressor (§1, §2.8): ratio R, head D, ``coff``, state block size ``sbs``.

    Derived: window ``W = coff * R`` (C4: 8 overlapping rows; C128: 128), state width
    ``SW = coff * D``, ``kv_score`` width ``2 * SW``, ``ape`` shape ``[R, SW]``.
    """

    ratio: int
    head_dim: int
    state_block_size: int

    @property
    def overlap(self) -> bool:
        """Ratio 4 pools an overlapping window (previous 4 + current 4)."""
        return self.ratio == 4

    @property
    def coff(self) -> int:
        """2 for ratio 4, 1 for ratio 128."""
        return 2 if self.overlap else 1

    @property
    def window(self) -> int:
        return self.coff * self.ratio

    @property
    def state_width(self) -> int:
        return self.coff * self.head_dim

    @property
    def kv_score_width(self) -> int:
        return 2 * self.state_width

    @property
    def ape_shape(self) -> tuple[int, int]:
        return (self.ratio, self.state_width)


@dataclass(frozen=True)
class ModelPreset:
    """Attention-side constants of a DSv4 model (spec §1). See the module docstring for markers."""

    name: str
    head_dim: int = 512
    rope_dim: int = 64
    nope_dim: int = 448
    nope_quant_block: int = 64
    index_head_dim: int = 128
    index_rope_dim: int = 64
    index_n_heads: int = 64
    num_layers: int = 43  # ext
    compress_ratios: tuple[int, ...] = field(default_factory=dsv4_compress_ratios)  # ext
    sliding_window: int = 128
    index_topk: int = 512
    c128_selection_width: int = 8192  # inf: 1 048 576 / 128
    cache_block_size: int = 256  # default B
    rms_norm_eps: float = 1e-6  # ext (model config); 1e-6 in all tests
    rope: RopePreset = RopePreset(theta=10_000.0, yarn=None, max_pos=65_536 * 16)  # ext, plain RoPE
    compress_rope: RopePreset = RopePreset(
        theta=160_000.0, yarn=YarnConfig(), max_pos=65_536 * 16
    )  # ext, YaRN
    fp8_max: float = 448.0
    model_dtype: str = "bfloat16"
    c4: CompressorPreset = CompressorPreset(ratio=4, head_dim=512, state_block_size=4)
    c128: CompressorPreset = CompressorPreset(ratio=128, head_dim=512, state_block_size=8)
    indexer: CompressorPreset = CompressorPreset(ratio=4, head_dim=128, state_block_size=4)
    assumed: tuple[str, ...] = ()
    """Names of fields whose value the spec does not state for this model (taken from DSv4-Flash)."""

    @property
    def indexer_softmax_scale(self) -> float:
        """``index_head_dim ** -0.5`` (128^-0.5)."""
        return self.index_head_dim**-0.5

    @property
    def indexer_head_scale(self) -> float:
        """``index_n_heads ** -0.5`` (64^-0.5 = 0.125)."""
        return self.index_n_heads**-0.5

    @property
    def attention_scale(self) -> float:
        """Main attention scale ``head_dim ** -0.5``."""
        return self.head_dim**-0.5

    def ratio_of_layer(self, layer: int) -> int:
        """Compress ratio of ``layer`` (0 = sliding-window only, treated as ratio 1)."""
        return self.compress_ratios[layer]

    def ratios_present(self) -> frozenset[int]:
        """Compress ratios > 1 used by some layer ({4, 128} for DSv4)."""
        return frozenset(r for r in self.compress_ratios if r > 1)

    def compressed_block_size(self, ratio: int, cache_block_size: int | None = None) -> int:
        """Entries per compressed page: ``max(1, B // R)`` (64 for C4, 2 for C128 with B = 256)."""
        b = self.cache_block_size if cache_block_size is None else cache_block_size
        return max(1, b // ratio)

    def ds_mla_page_stride(self, ratio: int, cache_block_size: int | None = None) -> int:
        """Allocator page stride ``round_up(kv_bs * 584, 576)`` of the compressed fp8_ds_mla cache."""
        return ds_min_page_stride(self.compressed_block_size(ratio, cache_block_size))

    def compressor_for_ratio(self, ratio: int) -> CompressorPreset:
        """Main compressor of a layer with ``ratio`` (4 or 128)."""
        return {4: self.c4, 128: self.c128}[ratio]

    def state_configs(self) -> tuple[tuple[int, int, int], ...]:
        """``(SW, R, sbs)`` of every state cache the model uses: main C4, main C128, indexer."""
        out = []
        for comp in (self.c4, self.c128, self.indexer):
            if comp.ratio in self.ratios_present():
                out.append((comp.state_width, comp.ratio, comp.state_block_size))
        return tuple(out)


DSV4_FLASH = ModelPreset(name="DSv4-Flash")
"""DSv4-Flash: every value as in spec §1."""

_PRO_STATED = ("name", "index_topk", "assumed")

DSV4_PRO = ModelPreset(
    name="DSv4-Pro",
    index_topk=1024,
    assumed=tuple(f.name for f in fields(ModelPreset) if f.name not in _PRO_STATED),
)
"""DSv4-Pro: the spec states only ``index_topk = 1024``.

All other fields (dims, heads, layers, ratios, window, RoPE/YaRN, block sizes, eps) are
**assumed** equal to DSv4-Flash because the spec is silent about them (listed in
``DSV4_PRO.assumed``); treat them as placeholders until a Pro model config is checked.
"""

PRESETS: dict[str, ModelPreset] = {p.name: p for p in (DSV4_FLASH, DSV4_PRO)}
