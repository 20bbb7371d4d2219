"""When each option of a tool takes effect, and the one-line refusal of an option given where it cannot.

Every command line in paddle_vha/cli/ declares, beside its parser, a table `TAKES_EFFECT`: option string ->
`Effect(when, applies)`: `when` says in words when the option changes what the tool does (docs/reliability.md prints
every table), `applies(args)` decides it for the parsed arguments (None: it always does). An option the user gave
(on the command line, whatever its value) whose `applies` is false is refused in one line, exit 2, before any work:

    error: --float-lm-head has no effect in this run: it takes effect with --weights int8 / int4

so that an option can never be accepted and then ignored. Conditions that only the inputs can decide (an export
folder without an EOS id, a checkpoint without a fused tensor) are checked by the tool once it has read them, with
`refuse_inert` and the same words. tests/test_options.py checks that every option of every parser has an entry.

"Takes effect" is structural: the option's feature runs in this run. A value that happens not to matter (a
save_steps past max_steps) is not refused; permissions (--force: replace OUT_DIR if it exists) always take effect.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, Optional, Set

__all__ = ["Effect", "ALWAYS", "PERMISSION", "given_options", "check_effects", "parse_checked", "refuse_inert",
           "option_strings", "markdown_table", "tool_modules", "audit_rows", "audit_markdown"]


@dataclass(frozen=True)
class Effect:
    when: str  # in words, after "takes effect ..." (docs/reliability.md's audit table)
    applies: Optional[Callable[[argparse.Namespace], bool]] = None  # None: always

    def holds(self, args) -> bool:
        return self.applies is None or bool(self.applies(args))


ALWAYS = Effect("always")
PERMISSION = Effect("always (a permission: replaces OUT when it exists)")


def option_strings(parser: argparse.ArgumentParser) -> Dict[str, str]:
    """{the option's name as the table spells it (its longest string, or the positional's metavar/dest): dest}."""
    out = {}
    for a in parser._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        name = max(a.option_strings, key=len) if a.option_strings else (a.metavar or a.dest)
        out[name if isinstance(name, str) else a.dest] = a.dest
    return out


def given_options(parser: argparse.ArgumentParser, argv) -> Set[str]:
    """The dests the user gave in argv (whatever the value, the default included): argv parsed once more with every
    default suppressed, so that only what argv sets is in the namespace. Call after parser.parse_args(argv) passed."""
    saved = [(a, a.default) for a in parser._actions]
    try:
        for a, _ in saved:
            a.default = argparse.SUPPRESS
        return set(vars(parser.parse_args(argv)))
    finally:
        for a, default in saved:
            a.default = default


def refuse_inert(option: str, effect: Effect) -> None:
    """Exit 2 with one line, as paddle_vha.cli.fail does (which this module cannot import: cli imports it): `option`
    was given, and it cannot take effect in this run."""
    import sys

    print(f"error: {option} has no effect in this run: it takes effect {effect.when}", file=sys.stderr)
    sys.exit(2)


def check_effects(parser: argparse.ArgumentParser, args, given: Iterable[str], effects: Dict[str, Effect]) -> None:
    """Refuse (refuse_inert) the first option in `given` whose Effect does not hold for `args`."""
    given = set(given)
    for name, dest in option_strings(parser).items():
        effect = effects.get(name)
        if effect is None:
            raise KeyError(f"{parser.prog}: option {name} has no entry in its TAKES_EFFECT table")
        if dest in given and not effect.holds(args):
            refuse_inert(name, effect)


def parse_checked(parser: argparse.ArgumentParser, argv, effects: Dict[str, Effect], check_ranges=None):
    """parser.parse_args(argv); then check_ranges(parser, args) (the tool's own range checks, usage errors); then every
    given option's Effect (refuse_inert). Returns (args, the given dests)."""
    import sys

    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if check_ranges is not None:
        check_ranges(parser, args)
    given = given_options(parser, argv)
    check_effects(parser, args, given, effects)
    return args, given


def markdown_table(rows) -> str:
    """rows: (tool, option, when) -> the audit table of docs/reliability.md."""
    lines = ["| tool | option | takes effect |", "| --- | --- | --- |"]
    lines += [f"| {tool} | `{option}` | {when} |" for tool, option, when in rows]
    return "\n".join(lines)


def tool_modules() -> list:
    """The command-line modules of paddle_vha/cli/ (every one a console script), by name."""
    import os

    folder = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return sorted(f[:-3] for f in os.listdir(folder) if f.endswith(".py") and f != "__init__.py")


def audit_rows() -> list:
    """(tool, option, takes effect) of every option of every tool: each paddle_vha/cli module's parser and its
    TAKES_EFFECT table in the parser's order, and tools/train.py's arguments (paddle_vha/train/option_effects.py)."""
    import importlib

    rows = []
    for name in tool_modules():
        if name == "train":
            from ...train.option_effects import markdown_rows

            rows += markdown_rows()
            continue
        mod = importlib.import_module(f"paddle_vha.cli.{name}")
        rows += [(name, option, mod.TAKES_EFFECT[option].when) for option in option_strings(mod.build_parser())]
    return rows


def audit_markdown() -> str:
    """docs/reliability.md's options audit table (tests/test_options.py checks the file holds it as printed here)."""
    return markdown_table(audit_rows())
