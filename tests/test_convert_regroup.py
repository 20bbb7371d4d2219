"""tools/convert_to_vha.py --regroup and paddle_vha.transform.regroup: which old KV heads merge into each new one.

A head permutation absorbed into q/k/v/o leaves a GQA model's function unchanged (float64 oracle, 1e-12); the
partition search is the exhaustive optimum (against brute force over every permutation); a checkpoint whose KV heads
are near-duplicates in a scrambled order gets its true groups back, with lower k / v fit error and KL than the
contiguous groups; the result is an ordinary Qwen3-VHA; a folded VHA converts back exactly with regrouping on."""
import itertools
import json
import os
import re

import numpy as np
import paddle
import pytest
from paddleformers.transformers import Qwen3Config, Qwen3ForCausalLM

import oracle
from _utils import tiny_config, validate_vha_checkpoint
from paddle_vha import Qwen3VHAForCausalLM
from paddle_vha.transform import regroup as rg
from paddle_vha.transform.convert_to_vha import convert_layer, plan_convert
from test_convert import SHAPE, fit_errors, kl_table, logits, run_tool
from test_fold import read_state

TRUE_GROUPS = [[0, 2, 6, 7], [1, 3, 4, 5]]  # 8 KV heads -> 2: the near-duplicate families, scrambled


def _raw(path):
    raw = json.load(open(os.path.join(path, "config.json")))
    if raw.get("rope_theta") is None:
        raw["rope_theta"] = (raw.get("rope_parameters") or {})["rope_theta"]
    return raw


def test_head_permutation_leaves_gqa_logits_unchanged(tmp_path):
    """Every layer's KV heads permuted (a different random order per layer), the query heads following: the float64
    oracle's logits are those of the original to 1e-12."""
    paddle.seed(2)
    path = str(tmp_path / "gqa")
    Qwen3ForCausalLM(Qwen3Config(**{**SHAPE, "num_hidden_layers": 2})).save_pretrained(path)
    state, cfg = {k: v.astype(np.float64) for k, v in read_state(path).items()}, _raw(path)
    rng = np.random.default_rng(0)
    permuted = dict(state)
    for i in range(cfg["num_hidden_layers"]):
        order = rng.permutation(cfg["num_key_value_heads"])
        for t in rg.PERMUTED:
            name = f"model.layers.{i}.self_attn.{t}"
            if name not in state:  # a bias this base does not have
                continue
            permuted[name] = rg.permute_heads(name, state[name], order, cfg["num_attention_heads"],
                                              cfg["num_key_value_heads"], cfg["head_dim"])
            assert not np.array_equal(permuted[name], state[name])
    ids = rng.integers(0, SHAPE["vocab_size"], size=(2, 13))
    a = oracle.stock_causal_lm(ids, state, cfg)[0]
    b = oracle.stock_causal_lm(ids, permuted, cfg)[0]
    rel = np.abs(a - b).max() / np.abs(a).max()
    print(f"permuted heads, float64 oracle logits: max rel diff {rel:.3e}")
    assert rel < 1e-12


@pytest.mark.parametrize("n,m", [(6, 2), (6, 3), (8, 4)])
def test_partition_search_is_the_brute_force_optimum(n, m, monkeypatch):
    """best_partition against the minimum over every permutation of the heads (random group costs); the greedy +
    swaps search used for many heads returns a valid partition no worse than the contiguous one."""
    rng = np.random.default_rng(n * 10 + m)
    table = {}

    def cost(grp):
        return table.setdefault(tuple(grp), float(rng.random()))

    def total(part):
        return sum(cost(tuple(sorted(g))) for g in part)

    brute = min(total([p[k:k + m] for k in range(0, n, m)]) for p in itertools.permutations(range(n)))
    got = rg.best_partition(n, m, cost)
    print(f"n={n} m={m}: exhaustive {total(got):.6f}, brute force {brute:.6f}, got {got}")
    assert sorted(h for g in got for h in g) == list(range(n)) and all(len(g) == m for g in got)
    assert total(got) == pytest.approx(brute, abs=1e-12)
    monkeypatch.setattr(rg, "EXHAUSTIVE_LIMIT", 0)
    greedy = rg.best_partition(n, m, cost)
    contiguous = [list(range(k, k + m)) for k in range(0, n, m)]
    assert sorted(h for g in greedy for h in g) == list(range(n))
    assert total(greedy) <= total(contiguous) + 1e-12


@pytest.fixture(scope="module")
def scrambled(tmp_path_factory):
    """A stock Qwen3, 16 query heads over 8 KV heads, whose KV heads (keys and values) are two families of
    near-duplicates (noise 5% of the entries' scale) laid out as TRUE_GROUPS."""
    paddle.seed(7)
    path = str(tmp_path_factory.mktemp("scrambled") / "qwen3")
    shape = {**SHAPE, "num_key_value_heads": 8, "num_hidden_layers": 2}
    model = Qwen3ForCausalLM(Qwen3Config(**shape))
    d, h = shape["head_dim"], shape["hidden_size"]
    rng = np.random.default_rng(1)
    family = {t: g for g, grp in enumerate(TRUE_GROUPS) for t in grp}
    for layer in model.model.layers:
        for lin in (layer.self_attn.k_proj, layer.self_attn.v_proj):
            base = rng.normal(0, 0.2, (2, h, d))  # in-memory [in, out]: head t is columns t*d..(t+1)*d
            w = np.concatenate([base[family[t]] + rng.normal(0, 0.01, (h, d)) for t in range(8)], axis=1)
            lin.weight.set_value(w.astype(np.float32))
    model.save_pretrained(path)
    return path


@pytest.mark.parametrize("how", ["key-similarity", "fit-error"])
def test_regrouping_finds_scrambled_near_duplicates(tmp_path, scrambled, how):
    """Both objectives find TRUE_GROUPS in every layer and reach a lower k and v fit error than the contiguous
    groups (library, float64)."""
    errs = {}
    for regroup in ("contiguous", how):
        plan = plan_convert(scrambled, str(tmp_path / regroup), 2, regroup=regroup)
        for i in range(2):
            convert_layer(plan, i, "svd")
        errs[regroup] = np.array(list(plan.errors.values()))  # (layers, 3): q, k, v
        if regroup == how:
            print(f"{how}: groups {plan.groups}")
            assert all(plan.groups[i] == TRUE_GROUPS for i in range(2)), plan.groups
    print(f"mean fit errors (q, k, v): contiguous {errs['contiguous'].mean(0)}, {how} {errs[how].mean(0)}")
    assert (errs[how][:, 1:] < 0.2 * errs["contiguous"][:, 1:]).all()


def test_regrouped_checkpoint_is_an_ordinary_vha_with_lower_kl(tmp_path, scrambled):
    """The tool prints the chosen groups, writes a checkpoint the registry validates, and its KL from the original
    is lower than with the contiguous groups."""
    kls = {}
    for regroup in ("contiguous", "key-similarity"):
        out = str(tmp_path / regroup)
        calib = ["--calib-tokens", "512"] if regroup == "key-similarity" else []  # only there is calibration read
        r = run_tool(scrambled, out, "--kv-heads", "2", "--method", "svd", "--regroup", regroup, "--no-compare",
                     "--no-progress", "--eval-len", "32", *calib, "--dtype", "float32")
        assert r.returncode == 0, r.stderr
        validate_vha_checkpoint(out)
        kls[regroup] = kl_table(r.stdout)["svd"]
        if regroup == "key-similarity":
            line = [ln for ln in r.stdout.splitlines() if "groups (--regroup key-similarity" in ln][0]
            assert line.count(str(TRUE_GROUPS)) == 2, line
            assert fit_errors(r.stdout, "svd")[1] < 0.1  # 5% noise per head: ~0.043
    print(f"KL: {kls}")
    assert kls["key-similarity"] < 0.5 * kls["contiguous"]


@pytest.mark.parametrize("how", ["key-similarity", "fit-error"])
def test_fold_then_convert_with_regrouping_is_exact(tmp_path, how):
    """A Qwen3-VHA folded to stock GQA-2 and converted back with the same N and r under --regroup: one old head per
    new one, so the groups are the identity and the function is the same (float32 rounding); the KL is ~0."""
    from paddle_vha.transform.fold import fold_checkpoint, plan_fold

    paddle.seed(3)
    cfg = tiny_config(num_attention_heads=6, num_key_value_heads=2, head_dim=16, vha_q_head_dim=8,
                      vha_postmix_rank=2, vocab_size=256, vha_premix_init_alpha=3.0, vha_postmix_u_init_std=0.5,
                      vha_postmix_v_init_std=0.5, initializer_range=0.2)
    vha = Qwen3VHAForCausalLM(cfg)
    vha_dir, folded, back = (str(tmp_path / n) for n in ("vha", "folded", "back"))
    vha.save_pretrained(vha_dir)
    fold_checkpoint(plan_fold(vha_dir, folded), progress=False)
    calib = ["--calib-tokens", "512"] if how == "key-similarity" else []  # fit-error reads no calibration text
    r = run_tool(folded, back, "--kv-heads", "2", "--q-head-dim", "8", "--postmix-rank", "2", "--regroup", how,
                 "--method", "svd", "--no-compare", "--no-progress", *calib, "--eval-len", "32")
    assert r.returncode == 0, r.stderr
    assert re.search(r"layer 0 \[\[0\], \[1\]\]", r.stdout), r.stdout
    assert kl_table(r.stdout)["svd"] < 1e-9
    ids = np.random.default_rng(0).integers(0, 256, size=(2, 19))
    a, b = logits(Qwen3VHAForCausalLM, vha_dir, ids), logits(Qwen3VHAForCausalLM, back, ids)
    rel = np.abs(a - b).max() / np.abs(a).max()
    print(f"{how}: VHA vs fold -> convert --regroup, float32 logits: max rel diff {rel:.3e}")
    assert rel < 1e-5
