"""Declarations every concern reads: a family's tensors (params.py) and tensor-parallel plans as data (sharding.py).

params.py     Param / linear / LayerSpec / ModelSpec: each tensor of a decoder layer declared once (shape, shard,
              Linear layout, fold role, presence); the tensor contract, TP shards and checkpoint name rules derived
fold.py       FoldRule: a fold role as data; layer_fold / model_fold: what fold makes of each tensor of a spec
sharding.py   TensorShard, LayerPlan, the GQA head split, the MLP's shards (what one rank holds and computes)

Pure Python (no Paddle), so the registry, the calculators and the plans import it anywhere.
"""
