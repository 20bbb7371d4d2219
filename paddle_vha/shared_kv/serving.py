"""How Qwen3 shared-KV is served by the exported decoder (paddle_vha/export/decoder.py): each layer caches ONE tensor,
`past_key_values.{i}.key` -> `present.{i}.key` (B, H_kv, T, d), the normed and rotated shared projection, which
attention reads as keys and as values; the output is rotated back by the query's angle (inverse RoPE in the graph).
A window layer's sink logits come from the spec (paddle_vha/sinks/spec.py), as for any family."""
from __future__ import annotations

from ..qwen3.functional import inverse_rope
from ..qwen3.serving import GQAForm, Serving
from .spec import KV_PROJECTIONS

__all__ = ["SharedKVForm", "SHARED_KV"]


class SharedKVForm(GQAForm):
    kv_projections = KV_PROJECTIONS  # the one projection the spec declares for both keys and values
    cache_names = ("key",)

    def to_cache(self, k, v):
        """(B, S, H_kv, d) rotated shared projection -> its one cache entry (B, H_kv, S, d)."""
        return [k.transpose([0, 2, 1, 3])]

    def attention_kv(self, cached):
        return cached[0], cached[0]  # K = V

    def output(self, y, cos, sin):
        return inverse_rope(y, cos, sin)  # R(-theta s) at the query positions


SHARED_KV = Serving(build=SharedKVForm.build, cache_names=SharedKVForm.cache_names)
