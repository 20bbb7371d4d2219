"""paddle_vha.train.heal_report.greedy_answers: prompts decoded together (left-padded batches) give each prompt's own
greedy answer, recomputed here from scratch by full forwards of the prompt alone (no cache, no padding), for Llama,
Qwen3 (whose cached step needs the positions passed) and the converted families (Llama-VHA, Qwen3-VHA)."""
import numpy as np
import pytest


def _model(family: str, seed: int = 0):
    import paddle

    from paddle_vha.families import family as get_family

    paddle.seed(seed)
    kw = dict(vocab_size=97, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=3,
              num_key_value_heads=1, head_dim=16, max_position_embeddings=128, pad_token_id=None, bos_token_id=None,
              eos_token_id=None, tie_word_embeddings=True)
    fam = get_family(family)
    model = fam.model_class(fam.config_class(**kw))
    for n, p in model.named_parameters():  # Postmix / Premix away from the identity, so they take part
        if "postmix" in n or "premix" in n:
            p.set_value(paddle.randn(p.shape) * 0.3 + (p.numpy() if "premix" in n else 0))
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


@pytest.mark.parametrize("family", ["llama", "qwen3", "llama_vha", "qwen3_vha"])
def test_batched_greedy_answers_equal_each_prompt_alone(family):
    from paddle_vha.train.heal_report import greedy_answers

    model = _model(family)
    rng = np.random.default_rng(3)
    # lengths 1 to 13 (prime, repeated), batches of 4: rows padded by 0 to 12 positions
    prompts = [list(rng.integers(0, 97, n)) for n in (7, 11, 1, 7, 13, 7, 2)]
    free = [_from_scratch(model, p, 9, eos=[]) for p in prompts]
    eos = [free[1][3]]  # one row stops early (keeping its EOS id) while its batch-mates go on
    want = [_from_scratch(model, p, 9, eos) for p in prompts]
    got = greedy_answers(model, prompts, 9, eos, batch=4)
    for p, g, w in zip(prompts, got, want):
        print(len(p), g, w)
    assert got == want
    assert any(len(w) < 9 for w in want) and any(len(w) == 9 for w in want)
