"""A layer's declared tensors made real: the variant's spec, not its attention class, says which parameters exist.

The base's constructor has built its own sublayer (e.g. Qwen3Attention's q/k/v/o projections and norms); then
`build_declared` makes that sublayer hold exactly the tensors the variant's LayerSpec declares under its prefix, in the
spec's order (so the random draws are in a fixed order):

* a Linear the base built with the declared shape and bias is kept; any other declared Linear is built (Paddle's
  default initializer, bias as declared);
* a tensor that is not a Linear's is kept if the base built it with the declared shape, else created with its
  Param.init (a dotted name such as "mea_norm.weight" gets a parameter-only sublayer);
* a Linear of the base the spec does not declare for this layer (k_proj / v_proj of a shared-KV layer) is removed.
"""
from __future__ import annotations

from paddle import nn

from ..spec.params import LayerSpec

__all__ = ["build_declared"]


def _owner(layer, rel: str):
    """(the sublayer that holds `rel`'s last component, that component), creating parameter-only sublayers."""
    *path, attr = rel.split(".")
    for name in path:
        sub = getattr(layer, name, None)
        if sub is None:
            sub = nn.Layer()
            setattr(layer, name, sub)
        layer = sub
    return layer, attr


def _shape(x):
    return None if x is None else list(x.shape)


def build_declared(layer, spec: LayerSpec, cfg, layer_idx: int, prefix: str) -> None:
    """Give `layer` (the sublayer at `prefix`, e.g. "self_attn.", of decoder layer `layer_idx`) the declared tensors."""
    sizes = spec.sizes(cfg, layer_idx)
    present = [p for p in spec.params if p.name.startswith(prefix) and p.when(sizes)]
    names = {p.name for p in present}
    linears = {p.name[: -len(".weight")] for p in present if p.linear}
    for base in spec.base_linears:  # base Linears this layer does not have
        if base.startswith(prefix) and base not in linears and getattr(layer, base[len(prefix):], None) is not None:
            delattr(layer, base[len(prefix):])
    for p in present:
        rel = p.name[len(prefix):]
        if p.linear:
            name, (out, inp) = rel[: -len(".weight")], p.shape(sizes)
            bias = f"{prefix}{name}.bias" in names
            cur = getattr(layer, name, None)
            if cur is None or _shape(cur.weight) != [inp, out] or (getattr(cur, "bias", None) is not None) != bias:
                setattr(layer, name, nn.Linear(inp, out, bias_attr=bias))  # [in, out] in memory
        elif rel.endswith(".bias") and p.name[: -len(".bias")] in linears:
            continue  # built with its Linear
        else:
            owner, attr = _owner(layer, rel)
            shape = list(p.shape(sizes))
            if _shape(getattr(owner, attr, None)) == shape:
                continue
            if p.init is None:
                raise ValueError(f"{p.name}: declared without an initializer and not built by the base")
            setattr(owner, attr, owner.create_parameter(shape=shape, default_initializer=p.init(sizes, cfg)))
