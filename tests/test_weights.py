"""paddle_vha.checkpoint.load: checkpoint tensors into a built model without PaddleFormers' loader (used by TP ranks)."""
import numpy as np
import paddle
import pytest

from _utils import tiny_config
from paddle_vha import Qwen3VHAForCausalLM
from paddle_vha.checkpoint.contract import CheckpointError
from paddle_vha.checkpoint.folder import CheckpointFolder
from paddle_vha.checkpoint.load import load_checkpoint_into, load_tensors_into


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    paddle.seed(11)
    cfg = tiny_config(vha_gated_attention=True, attention_bias=True, vha_q_head_dim=9)  # gate_proj + biases + r < d
    model = Qwen3VHAForCausalLM(cfg)
    for n, p in model.named_parameters():  # no zero-initialised tensor may hide a load that skipped it
        p.set_value(paddle.randn(p.shape) * 0.2 + (1.0 if n.endswith("norm.weight") else 0.0))
    path = str(tmp_path_factory.mktemp("w") / "vha")
    model.save_pretrained(path)
    return cfg, model, path


def test_loaded_model_equals_the_saved_one(saved):
    cfg, model, path = saved
    paddle.seed(12)
    fresh = Qwen3VHAForCausalLM(cfg)
    load_checkpoint_into(fresh, path)
    for (n, a), (m, b) in zip(model.named_parameters(), fresh.named_parameters()):
        assert n == m and np.array_equal(a.numpy(), b.numpy()), n
    ids = paddle.to_tensor(np.random.RandomState(0).randint(0, cfg.vocab_size, (2, 7)))
    model.eval()
    fresh.eval()
    with paddle.no_grad():
        assert np.array_equal(model(ids, return_dict=True).logits.numpy(), fresh(ids, return_dict=True).logits.numpy())


def test_refusals_name_the_tensor(saved):
    cfg, model, path = saved
    tensors = CheckpointFolder(path).read_all()
    fresh = Qwen3VHAForCausalLM(cfg)
    name = "model.layers.1.self_attn.vha_premix_weight"
    cases = [({**tensors, "model.layers.9.mlp.up_proj.weight": tensors["model.norm.weight"]},
              r"tensor\(s\) the model does not have, e.g. model.layers.9.mlp.up_proj.weight"),
             ({k: v for k, v in tensors.items() if k != name}, f"missing tensor {name}"),
             ({**tensors, name: tensors[name][:, :-1]}, f"{name} has shape")]
    for bad, msg in cases:
        with pytest.raises(CheckpointError, match=msg) as e:
            load_tensors_into(fresh, bad, source="ckpt")
        print(e.value)
        assert "\n" not in str(e.value)

    from paddle_vha.mea.config import Qwen3MEAConfig
    from paddle_vha.mea.modeling import Qwen3MEAForCausalLM
    from _utils import TINY

    with pytest.raises(CheckpointError, match="model_type 'qwen3_vha', the model is 'qwen3_mea'"):
        load_checkpoint_into(Qwen3MEAForCausalLM(Qwen3MEAConfig(**TINY)), path)
