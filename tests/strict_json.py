"""A JSON reader for the studies' outputs that refuses NaN / Infinity (a diverged run must be null, never a number)."""
import json


def strict_json(path):
    """Parse `path`, raising AssertionError on a non-strict JSON constant (NaN, Infinity)."""
    def bad(x):
        raise AssertionError(f"non-strict JSON constant {x} in {path}")
    with open(path) as f:
        return json.load(f, parse_constant=bad)
