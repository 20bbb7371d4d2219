"""paddle_vha/train/loop.py, the small loop the experiments train with: its fixed-rate schedule and its stop on
divergence."""
import math

import pytest


def test_constant_schedule_and_divergence_stop_the_loop():
    """TrainSettings(schedule='constant') holds the rate after warm-up; a run that hits a NaN loss stops there and
    reports no validation number."""
    import paddle
    from paddleformers.transformers import Qwen3Config, Qwen3ForCausalLM

    from paddle_vha.train.corpus import load_stdlib_corpus
    from paddle_vha.train.loop import TrainSettings, train_lm
    from tools.experiments.toy import toy_fields

    corpus = load_stdlib_corpus(max_bytes=1 << 20)
    cfg = Qwen3Config(**toy_fields(32, 1, 8, heads=4, kv_heads=2, seq_len=16, intermediate=64, min_positions=64))
    paddle.seed(0)
    res = train_lm(Qwen3ForCausalLM(cfg), corpus, TrainSettings(steps=6, batch_size=2, seq_len=16, val_batches=1,
                                                                 progress=False, schedule="constant", lr=1e-3))
    assert res.diverged_at is None and math.isfinite(res.val_loss)
    paddle.seed(0)
    model = Qwen3ForCausalLM(cfg)
    w = model.lm_head.weight
    w.set_value(paddle.full(w.shape, float("nan"), dtype=w.dtype))  # the first loss is NaN
    res = train_lm(model, corpus, TrainSettings(steps=5, batch_size=2, seq_len=16, val_batches=1, progress=False))
    print(res.losses)
    assert res.diverged_at == 0 and math.isnan(res.val_loss) and res.losses == res.losses[:1] and math.isnan(res.losses[0])
    with pytest.raises(ValueError, match="schedule"):
        train_lm(model, corpus, TrainSettings(steps=1, schedule="linear", progress=False))
