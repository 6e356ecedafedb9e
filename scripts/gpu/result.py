"""What the check_*.py scripts share: their result, printed whatever
happened, and the size and hard stop of their allocation loops.

A check fills a dict and hands its body to run(), which prints the dict at
the end as `RESULT {json}` (for people) and `RESULTKV key=value ...` (its
numbers, booleans as 0/1 and None as `none`; what the suite in tests/ parses), and
returns the exit status: 0 when the body ran to its end (res["completed"]
is then true), 3 when it raised Missing (the module or the GPU backend is
not there), 1 on any other error (its traceback goes to stderr).

The scripts run as `python3 scripts/gpu/check_x.py`, so this directory is on
sys.path and `import result` finds this file.
"""
import json
import traceback

CHUNK = 256 << 20  # what each step of an allocation loop allocates


def parse_args(ap, loop="the allocation loop"):
    """Adds --max-bytes (the hard stop of the loop, default 6 GiB) to the
    argparse parser ap, and parses the command line."""
    ap.add_argument("--max-bytes", type=int, default=6 << 30,
                    help="hard stop for %s (bytes)" % loop)
    return ap.parse_args()


class Missing(Exception):
    """The module or the GPU backend is not there: exit status 3."""


def one_line(e):
    """`Type: message` with the message's white space folded to single spaces."""
    return "%s: %s" % (type(e).__name__, " ".join(str(e).split()))


def _flat(d, prefix, none):
    out = []
    for k in sorted(d):
        v = d[k]
        if isinstance(v, bool):
            v = int(v)
        if isinstance(v, (int, float)) or (none and v is None):
            out.append("%s%s=%s" % (prefix, k, "none" if v is None else v))
    return out


def emit(res, nested=None):
    """Prints the two result lines. nested=(KEY, PREFIX): the numbers of the
    dict res[KEY] are added to RESULTKV as PREFIX + their keys."""
    print("RESULT " + json.dumps(res, sort_keys=True, default=str), flush=True)
    flat = _flat(res, "", True)
    if nested is not None and isinstance(res.get(nested[0]), dict):
        flat += _flat(res[nested[0]], nested[1], False)
    print("RESULTKV " + " ".join(flat), flush=True)


def run(res, body, error=one_line, nested=None):
    """Runs body(res), records the outcome in res ("rc", "completed",
    "error": error(exception), at most 600 characters), emits res and
    returns the exit status."""
    rc = 1
    try:
        body(res)
        res["completed"] = True
        rc = 0
    except Missing as e:
        res["error"] = str(e)
        rc = 3
    except Exception as e:  # noqa: BLE001
        res["error"] = error(e)[:600]
        traceback.print_exc()
        rc = 1
    finally:
        res["rc"] = rc
        emit(res, nested)
    return rc
