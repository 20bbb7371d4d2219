"""paddle_vha.train.heal_report.greedy_answers: prompts of equal length decoded together give each prompt's own greedy
answer, recomputed here from scratch by full forwards (no cache), for Llama and for Qwen3 (whose cached step needs
the positions passed)."""
import numpy as np
import pytest


def _model(family: str, seed: int = 0):
    import paddle
    from paddleformers.transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    paddle.seed(seed)
    kw = dict(vocab_size=97, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=3,
              num_key_value_heads=1, head_dim=16, max_position_embeddings=128, pad_token_id=None, bos_token_id=None,
              eos_token_id=None, tie_word_embeddings=True)
    model = LlamaForCausalLM(LlamaConfig(**kw)) if family == "llama" else Qwen3ForCausalLM(Qwen3Config(**kw))
    model.eval()
    return model


def _from_scratch(model, prompt, max_new, eos):
    import paddle

    ids, out = list(prompt), []
    with paddle.no_grad():
        for _ in range(max_new):
            tok = int(model(paddle.to_tensor(np.asarray([ids], np.int64)), return_dict=True).logits[0, -1]
                      .numpy().argmax())
            out.append(tok)
            if tok in eos:
                break
            ids.append(tok)
    return out


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_batched_greedy_answers_equal_each_prompt_alone(family):
    from paddle_vha.train.heal_report import greedy_answers

    model = _model(family)
    rng = np.random.default_rng(3)
    # lengths 1, 7, 7, 7, 11, 11 (prime, repeated: rows of one batch) and a batch cap of 2 (a length split in two)
    prompts = [list(rng.integers(0, 97, n)) for n in (7, 11, 1, 7, 11, 7)]
    free = [_from_scratch(model, p, 9, eos=[]) for p in prompts]
    eos = [free[1][3]]  # one row stops early (keeping its EOS id) while its batch-mates go on
    want = [_from_scratch(model, p, 9, eos) for p in prompts]
    got = greedy_answers(model, prompts, 9, eos, batch=2)
    for p, g, w in zip(prompts, got, want):
        print(len(p), g, w)
    assert got == want
    assert any(len(w) < 9 for w in want) and any(len(w) == 9 for w in want)
