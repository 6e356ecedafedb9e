"""What the check-*.py scripts say: a step done, a failure (exit 1), and a
value that must be as expected, each line prefixed with the script's name."""

import sys


def reporters(name):
    """fail(msg), step(msg) and want(what, got, expected) for script NAME."""

    def fail(msg):
        print(f"{name}: {msg}", file=sys.stderr)
        sys.exit(1)

    def step(msg):
        print(f"{name}: {msg}", flush=True)

    def want(what, got, expected):
        if got != expected:
            fail(f"{what}: got {got!r}, expected {expected!r}")

    return fail, step, want
