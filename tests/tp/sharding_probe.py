"""Paddle's own sharding stage 1 on 2 CPU ranks (gloo), without this project: one parameter used through a transpose
(whose backward leaves it a strided gradient, as Premix's did), AdamW through fleet's DygraphShardingOptimizer, one
step. On Paddle 3.3.1 the optimizer's gradient reduce fails with `ValueError: (InvalidArgument) The tensor must be
contiguous (at /paddle/paddle/fluid/distributed/collective/process_group.h:55)`; with `--contiguous` (the same
weight used without the transpose) the step runs. docs/training.md ("Parallel layouts") quotes it:

    python -m paddle.distributed.launch --nproc_per_node 2 --log_dir /tmp/sharding-probe tests/tp/sharding_probe.py
"""
import sys

import paddle
from paddle.distributed import fleet

strategy = fleet.DistributedStrategy()
strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 1, "pp_degree": 1, "sharding_degree": 2}
fleet.init(is_collective=True, strategy=strategy)
paddle.seed(0)
w = paddle.create_parameter([4, 8], "float32")  # [out, in]
x = paddle.randn([2, 8])
y = paddle.matmul(x, w, transpose_y=True) if "--contiguous" in sys.argv else paddle.matmul(x, w.transpose([1, 0]))
opt = fleet.distributed_optimizer(paddle.optimizer.AdamW(1e-3, parameters=[w]))
y.mean().backward()
print(f"gradient contiguous: {w.grad.is_contiguous()}")
opt.step()
print("sharding stage 1 step ran")
