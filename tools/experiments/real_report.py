"""What tools/experiments/real_model_study.py reports from its journal: the step-0 table, the table of every start at
step 0 and after CE / KD healing (mean ± std over seeds where several ran), healing per 1,000 tokens, the healing
curves (real_model.png), the compute used, the cost rows and three chat answers of the best arm next to the
original's. Writes OUT/real_model.json and OUT/real_model.md; a '## Reading' section already in the .md is kept, and
the page says PARTIAL while planned runs are missing."""
from __future__ import annotations

import math
import os

from .real_plan import ORIGINAL, eval_key, heal_plan, train_key
from .report import write_atomic, write_json

__all__ = ["write_report", "mean_std", "arm_label", "per_thousand"]

READING = "## Reading"
METRICS = [("ppl", "perplexity", 3), ("kl", "KL to the original", 4), ("cloze", "cloze accuracy", 3),
           ("chat_agreement", "chat token agreement", 3), ("chat_identical", "identical chat answers / 20", 0)]


def mean_std(xs):
    xs = [float(x) for x in xs if x is not None]
    if not xs:
        return float("nan"), float("nan")
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else float("nan")
    return m, sd


def _pm(ms, p):
    m, sd = ms
    if m != m:
        return "—"
    if abs(m) < 0.5 * 10 ** -p:
        m = 0.0  # the original's KL to itself: float32 rounding, not a negative divergence
    return f"{m:.{p}f} ± {sd:.{p}f}" if sd == sd else f"{m:.{p}f}"


def arm_label(rec) -> str:
    """ "VHA calibrated KD" for a healing record (a journal record: its settings under "key")."""
    k = rec["key"]
    extra = " (attention only)" if k.get("trainable", "all") != "all" else ""
    return f"{k['start']} {k['loss'].upper()}{extra}"


def per_thousand(before: float, after: float, tokens: int) -> float:
    """The mean change per 1,000 healing tokens of a metric that went from `before` to `after`."""
    return (after - before) / (tokens / 1000.0) if tokens else float("nan")


def _matches(rec, want: dict) -> bool:
    return all(rec["key"].get(k) == v for k, v in want.items())


def write_report(args, journal, facts, bench, wall: float) -> None:

    ek, tk = eval_key(args), train_key(args)
    s0 = {r["key"]["start"]: r for r in journal.records if r["key"].get("kind") == "step0" and _matches(r, ek)}
    heals = [r for r in journal.records if r["key"].get("kind") == "heal" and _matches(r, tk)
             and "ppl" in r["metrics"]]
    diverged = [r for r in journal.records if r["key"].get("kind") == "heal" and _matches(r, tk)
                and "ppl" not in r["metrics"]]
    costs = [r for r in journal.records if r["key"].get("kind") == "cost"]
    starts = [n for n in args.starts if n in s0]
    planned = heal_plan(args, s0) if all(n in s0 for n in args.starts) else []
    done = {(r["key"]["start"], r["key"]["loss"], r["key"]["seed"], r["key"]["steps"], r["key"]["trainable"])
            for r in heals + diverged}
    missing = [p for p in planned if p not in done]
    orig = s0.get(ORIGINAL)

    lines = [f"# The conversion on a real model: SmolLM2-135M-Instruct, {3} KV heads -> {args.kv_heads} "
             "(written by tools/real_model_study.py)", ""]
    no_step0 = [n for n in [ORIGINAL] + args.starts if n not in s0]
    if missing or no_step0:
        what = [f"step 0 of {', '.join(no_step0)}"] if no_step0 else []
        what += [f"{n} {l.upper()} seed {s} ({k} steps{', attention only' if t != 'all' else ''})"
                 for n, l, s, k, t in missing]
        lines += [f"**PARTIAL RESULTS.** Done: step 0 of {len(s0)} of {1 + len(args.starts)} models, "
                  f"{len(planned) - len(missing)} of {len(planned) or 'the (not yet planned)'} healing runs. Missing: "
                  + "; ".join(what + ([] if planned else ["the healing runs, planned once every step 0 is in"]))
                  + ". Rerun the same command to continue (it resumes from the journal and a run's last save).", ""]
    lines += [_setup(args, facts, bench), "", "### Step 0: every start before healing", "",
              _step0_table(s0, [ORIGINAL] + starts), "", "### Healed: step 0, CE, KD", "",
              _main_table(args, s0, heals, starts), "", _per_thousand_table(s0, heals), "",
              "### Healing curves", "", "Held-out perplexity (the same windows as the tables) against healing "
              "tokens:", "",
              _curve_table(s0, heals, args), "", "![healing curves](real_model.png)" if heals else "(no run yet)", "",
              "### Compute", "", _compute_table(s0, heals, args), ""]
    if costs:
        lines += ["### Cost: KV cache and int4 decode speed", "", _cost_table(costs), ""]
    # the best converted arm (the fine-tuned original is a control, and a diverged run has no metrics)
    converted = [r for r in heals if r["key"]["start"] != ORIGINAL and "kl" in r["metrics"]]
    best = min(converted, key=lambda r: r["metrics"]["kl"]) if converted else None
    if best and orig and orig["metrics"].get("chat_answers") and best["metrics"].get("chat_answers"):
        from .real_eval import PROMPTS

        lines += [f"### Chat: {arm_label(best)} (seed {best['key']['seed']}) next to the original", ""]
        for i in (0, 5, 9):
            lines += [f"**{PROMPTS[i]}**", "", f"- original: {_quote(orig['metrics']['chat_answers'][i])}",
                      f"- {arm_label(best)}: {_quote(best['metrics']['chat_answers'][i])}", ""]
    md_path = os.path.join(args.out, "real_model.md")
    kept = ""
    if os.path.isfile(md_path):
        with open(md_path, encoding="utf-8") as f:
            old = f.read()
        if READING in old:
            kept = old[old.index(READING):]
    write_atomic(md_path, "\n".join(lines) + ("\n" + kept if kept else "\n"))
    if heals:
        plot(s0, heals, args, os.path.join(args.out, "real_model.png"))
    write_json(os.path.join(args.out, "real_model.json"), dict(
        settings={k: v for k, v in vars(args).items()}, text=facts, step0=s0, healing=heals, diverged=diverged,
        cost=costs, planned=[list(p) for p in planned], missing=[list(p) for p in missing], partial=bool(missing),
        cloze_examples=[dict(word=c.word, where=c.where) for c in bench.cloze[:10]], wall_seconds_this_call=wall))
    print("\n".join(lines))
    print(f"\nwrote {args.out}/real_model.md, real_model.json" + (", real_model.png" if heals else ""))


def _quote(text: str) -> str:
    return "“" + " ".join(text.split()).replace("|", "\\|") + "”"


def _setup(args, facts, bench) -> str:
    return (f"Text: {facts['provenance']}. {facts['chapters']} chapters (one document each); split by document "
            f"({facts['split']}): {facts['train_chapters']} training chapters ({facts['train_chars'] / 1e6:.2f} MB, "
            f"{facts['train_tokens']:,} tokens), {facts['held_chapters']} held-out chapters "
            f"({facts['held_chars'] / 1e6:.2f} MB, {facts['held_tokens']:,} tokens). Metrics on the held-out chapters: "
            f"perplexity and mean KL(original || model) over {len(bench.windows)} windows x {args.seq_len} tokens; "
            f"cloze accuracy over {len(bench.cloze)} items (the last word of a held-out sentence, >= 4 letters, after "
            f"{args.cloze_context} tokens of its chapter; right when every token of the word is the argmax); chat: the "
            f"original's greedy answers (<= {args.chat_new} tokens) to 20 prompts through the chat template, token "
            f"agreement teacher-forced and identical greedy answers. Healing: batch {args.batch_size} x "
            f"{args.seq_len} tokens, AdamW at a constant {args.lr:g} after {args.warmup} warm-up steps, the same "
            f"batches for every start and loss of a seed; KD = 1 CE + 1 T^2 KL (T = 1) against the frozen original."
            "\n\n" + FORMS.format(kv=args.kv_heads))


# what each arm is (the tables' rows), so that its numbers can be read: the VHA arms are not VHA trained from scratch
FORMS = ("Arms (each caches {kv} KV head(s)): **MQA mean-pool** is the stock Llama with its KV heads averaged; **MEA** is "
         "tools/compress_kv.py's form (learned key / value head combinations, k_norm before them); the **VHA** arms "
         "are the form tools/convert_to_vha.py gives a pretrained model: **Premix off** (no d x d map per KV group: "
         "each query head is used as it is), **every query head kept** (not halved as in VHA trained from scratch), "
         "and **Postmix added** (identity + rank-4 head mixing, starting as the identity); mean / svd / calibrated "
         "name how the new K / V projections are made from the old ones, refined = calibrated then layer-wise "
         "refinement against the original. Folded, every VHA arm is a stock Llama with {kv} KV head(s).")


def _row(m):
    return [_pm(mean_std([x.get(k) for x in m]), p) for k, _, p in METRICS]


def _step0_table(s0, names) -> str:
    rows = ["| start | KV bytes / token (16-bit) | " + " | ".join(h for _, h, _ in METRICS) + " |",
            "| --- | ---: |" + " ---: |" * len(METRICS)]
    for n in names:
        if n in s0:
            rows.append(f"| {n} | {s0[n]['kv_bytes']:,} | " + " | ".join(_row([s0[n]["metrics"]])) + " |")
    return "\n".join(rows)


def _groups(heals):
    out = {}
    for r in heals:
        out.setdefault((r["key"]["start"], r["key"]["loss"], r["key"]["trainable"], r["key"]["steps"]), []).append(r)
    return out


def _main_table(args, s0, heals, starts) -> str:

    rows = ["| start | when | tokens | seeds | " + " | ".join(h for _, h, _ in METRICS) + " |",
            "| --- | --- | ---: | ---: |" + " ---: |" * len(METRICS)]
    groups = _groups(heals)
    for n in [ORIGINAL] + starts:
        if n in s0:
            rows.append(f"| {n} | step 0 | 0 | — | " + " | ".join(_row([s0[n]["metrics"]])) + " |")
        for (start, loss, trainable, steps), rs in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][3])):
            if start != n:
                continue
            when = (f"{'fine-tuned' if n == ORIGINAL else 'healed'} {loss.upper()}"
                    + (" (attention only)" if trainable != "all" else ""))
            rows.append(f"| {n} | {when} | {rs[0]['tokens']:,} | {len(rs)} | "
                        + " | ".join(_row([r["metrics"] for r in rs])) + " |")
    return "\n".join(rows)


def _per_thousand_table(s0, heals) -> str:
    rows = ["What healing bought per 1,000 tokens (step 0 -> end of the run, mean over seeds):", "",
            "| arm | tokens | perplexity / 1K tokens | KL / 1K tokens | cloze / 1K tokens |", "| --- | ---: | ---: | ---: | ---: |"]
    for (start, loss, trainable, steps), rs in _groups(heals).items():
        if start not in s0:
            continue
        b = s0[start]["metrics"]
        cells = []
        for k, p in (("ppl", 3), ("kl", 4), ("cloze", 4)):
            cells.append(f"{mean_std([per_thousand(b[k], r['metrics'][k], r['tokens']) for r in rs])[0]:+.{p}f}")
        rows.append(f"| {arm_label(rs[0])} | {rs[0]['tokens']:,} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _curve_table(s0, heals, args) -> str:
    tps = args.batch_size * args.seq_len
    rows = ["| arm | seed | tokens: held-out perplexity |", "| --- | ---: | --- |"]
    for r in heals:
        pts = "; ".join(f"{s * tps:,}: {math.exp(v):.3f}" for s, v in r["curve"] if v is not None)
        rows.append(f"| {arm_label(r)} | {r['key']['seed']} | {pts} |")
    return "\n".join(rows)


def _compute_table(s0, heals, args) -> str:
    rows = ["| part | tokens trained | wall s |", "| --- | ---: | ---: |"]
    for n, r in s0.items():
        rows.append(f"| measure {n} (step 0) | 0 | {r['metrics']['seconds']:.0f} |")
    tot_tok = tot_s = 0
    for r in heals:
        rows.append(f"| heal {arm_label(r)} seed {r['key']['seed']} (+ measure) | {r['tokens']:,} | "
                    f"{r['seconds']:.0f} (+ {r['metrics']['seconds']:.0f}) |")
        tot_tok += r["tokens"]
        tot_s += r["seconds"] + r["metrics"]["seconds"]
    tot_s += sum(r["metrics"]["seconds"] for r in s0.values())
    rows.append(f"| **total** | **{tot_tok:,}** | **{tot_s:,.0f}** |")
    return "\n".join(rows)


def _cost_table(costs) -> str:
    rows = ["| start | serving form | KV bytes / token (fp32 cache; 16-bit) | int4 gate (KL, agreement) | "
            "batch 1 tokens/s | batch 8 @ 4K tokens/s |", "| --- | --- | ---: | --- | ---: | ---: |"]
    for r in costs:
        rows.append(f"| {r['key']['start']} | {r['form']} | {r['kv_fp32']:,}; {r['kv_fp32'] // 2:,} | {r['gate']} | "
                    f"{r.get('b1', float('nan')):.1f} | {r.get('b8', float('nan')):.1f} |")
    return "\n".join(rows)


def plot(s0, heals, args, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tps = args.batch_size * args.seq_len
    fig, ax = plt.subplots(figsize=(8, 5))
    starts = list(dict.fromkeys(r["key"]["start"] for r in heals))
    colour = {n: plt.get_cmap("tab10")(i % 10) for i, n in enumerate(starts)}
    for r in heals:
        base = s0.get(r["key"]["start"])
        pts = ([(0, base["metrics"]["ppl"])] if base else []) + [(s * tps, math.exp(v)) for s, v in r["curve"]]
        ls = "-" if r["key"]["loss"] == "kd" else "--"
        if r["key"]["trainable"] != "all":
            ls = ":"
        ax.plot([p[0] for p in pts], [p[1] for p in pts], ls=ls, marker="o", ms=3, color=colour[r["key"]["start"]],
                label=f"{arm_label(r)} s{r['key']['seed']}")
    if "original" in s0:
        ax.axhline(s0["original"]["metrics"]["ppl"], color="k", lw=1, ls="-.", label="original (step 0)")
    ax.set_yscale("log")
    ax.set_xlabel("healing tokens")
    ax.set_ylabel("held-out perplexity (log scale)")
    ax.set_title("SmolLM2-135M-Instruct, 3 -> 1 KV head: healing on Austen (KD solid, CE dashed)", fontsize=9)
    ax.legend(fontsize=6, ncol=2)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
