"""The healing study's helpers (tools/experiments/heal_study.py, heal_study_report.py): where the curve is measured,
the power-law estimate of the tokens a missed goal would take (against its closed form), and the report's rows."""
import math

import pytest

from tools.experiments import heal_study as hs
from tools.experiments import heal_study_report as hr


def test_points_double_from_eight_steps_and_end_at_the_budget():
    assert hs.points(32_768) == [8_192, 16_384, 32_768]
    assert hs.points(8_192) == [8_192]
    assert hs.points(20_000) == [8_192, 16_384, 20_000]


@pytest.mark.parametrize("a,b", [(2.0, -0.5), (30.0, -0.9), (0.7, -0.1)])
def test_tokens_to_reach_inverts_an_exact_power_law(a, b):
    ts = [8_192, 16_384, 32_768, 65_536]
    kl = [(t, a * t ** b) for t in ts]
    target = a * 1e7 ** b  # the KL this law reaches at 10 million tokens
    got = hr.tokens_to_reach(kl, target, higher_is_better=False)
    print(got)
    assert math.isclose(got, 1e7, rel_tol=1e-6)
    agree = [(t, 1 - a * t ** b) for t in ts]  # the gap of an agreement: 1 - agreement
    assert math.isclose(hr.tokens_to_reach(agree, 1 - target, higher_is_better=True), 1e7, rel_tol=1e-6)


def test_tokens_to_reach_gives_no_estimate_for_a_curve_that_does_not_fall():
    assert hr.tokens_to_reach([(8_192, 1.0), (16_384, 1.1), (32_768, 1.2)], 0.15, higher_is_better=False) is None
    assert hr.tokens_to_reach([(8_192, 1.0), (16_384, 0.9)], 0.15, higher_is_better=False) is None  # two points


def _row(arm, tokens, agree, kl, qa=None, paris=None):
    r = dict(arm=arm, tokens=tokens, ppl=50.0 + kl, kl=kl, chat_agreement=agree, chat_kl=kl, chat_prompts=50,
             train_wall_seconds=10.0 * tokens / 1024)
    if qa is not None:
        r.update(qa_right=qa, qa_items=60, chat_identical=1, paris=paris)
    return r


def test_report_lists_the_arms_best_first_with_their_curves_and_goals(tmp_path):
    rows = [dict(_row("original", 0, 1.0, 0.0, 40, "The capital of France is Paris."), ppl=43.5),
            _row("start", 0, 0.2, 3.0, 0, "Nothing"),
            _row("self:kd:s0", 8_192, 0.30, 2.0), _row("self:kd:s0", 16_384, 0.40, 1.6),
            _row("self:kd:s0", 32_768, 0.50, 1.3, 3, "Paris is nice"),
            _row("self:ce:s0", 8_192, 0.25, 2.5), _row("self:ce:s0", 32_768, 0.35, 2.2, 1, "No"),
            _row("self:kd:s1", 32_768, 0.52, 1.2, 5, "x")]
    out = tmp_path / "heal.md"
    out.write_text("old table\n\n## Reading\n\nkept by hand\n")
    hr.write_report(rows, str(out), budget=32_768)
    text = out.read_text()
    print(text)
    arms = [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| self")]
    assert arms[:3] == ["self KD seed 1", "self KD seed 0", "self CE seed 0"]  # by chat agreement
    assert "self KD, 32,768 tokens, 2 seeds: ppl 51.250 ± 0.050" in text
    assert "| 0.300 / 2.00 / 52.0 | 0.400 / 1.60 / 51.6 | 0.500 / 1.30 / 51.3 |" in text
    assert "## The goals, for the best arm (self KD seed 1" in text
    assert text.endswith("## Reading\n\nkept by hand\n") and "old table" not in text
    assert (tmp_path / "heal.json").is_file()
