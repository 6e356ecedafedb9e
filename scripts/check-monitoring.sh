#!/usr/bin/env bash
# check-monitoring.sh — validates the Grafana dashboard and the Prometheus
# alerting rules in deploy/ offline, with promtool (the Prometheus project's
# own rule checker and PromQL parser): the rule file is checked and its unit
# tests run, every PromQL expression of the dashboard (panel targets and
# template variable queries, Grafana's variables replaced by harmless
# values) is parsed, every vramcap_* name in these files is one of
# docs/statistics.md's metric table, and rate()/increase() only take its
# counters.
#
# promtool comes from Debian's prometheus package, downloaded with
# `apt-get download` and unpacked into target/tools/prometheus (nothing is
# installed into the system); PROMTOOL=/path/to/promtool uses another one.
set -euo pipefail
cd "$(dirname "$0")/.."

dashboard=deploy/grafana/vramcap-dashboard.json
rules=deploy/prometheus/vramcap-alerts.yaml
rule_tests=deploy/prometheus/vramcap-alerts.test.yaml
tools=target/tools/prometheus

fail() {
    echo "check-monitoring: $*" >&2
    exit 1
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Downloads Debian's prometheus package and unpacks it into $tools.
fetch_promtool() {
    command -v apt-get >/dev/null ||
        fail "promtool is needed and apt-get is missing (to download Debian's prometheus package); set PROMTOOL=/path/to/promtool instead"
    command -v dpkg-deb >/dev/null ||
        fail "promtool is needed and dpkg-deb is missing (to unpack Debian's prometheus package); install dpkg or set PROMTOOL=/path/to/promtool"
    mkdir -p "$tmp/deb"
    # The _apt user cannot write into a private temporary directory; apt
    # then downloads as the caller, which is what is wanted here.
    if ! (cd "$tmp/deb" && apt-get download -qq prometheus) >"$tmp/apt.log" 2>&1; then
        # No candidate version: the package lists are missing (a fresh
        # container). Anything else is a real failure.
        if apt-cache policy prometheus 2>/dev/null | grep -q 'Candidate: [^(]'; then
            fail "apt-get download prometheus failed: $(grep -m1 '^E:' "$tmp/apt.log" || tail -n1 "$tmp/apt.log")"
        fi
        [ "$(id -u)" = 0 ] ||
            fail "apt's package lists are missing and updating them needs root: run 'sudo apt-get update', or set PROMTOOL=/path/to/promtool"
        echo "check-monitoring: apt-get update (no package lists)"
        apt-get update -qq >"$tmp/apt.log" 2>&1 ||
            fail "apt-get update failed: $(grep -m1 '^E:' "$tmp/apt.log" || tail -n1 "$tmp/apt.log")"
        (cd "$tmp/deb" && apt-get download -qq prometheus) >"$tmp/apt.log" 2>&1 ||
            fail "apt-get download prometheus failed: $(grep -m1 '^E:' "$tmp/apt.log" || tail -n1 "$tmp/apt.log")"
    fi
    local deb
    deb=$(find "$tmp/deb" -name 'prometheus_*.deb' | head -n1)
    [ -n "$deb" ] || fail "apt-get download prometheus left no prometheus_*.deb"
    # Unpacked beside the final place and renamed, so that an interrupted
    # run never leaves a half-unpacked tree to be reused.
    rm -rf "$tools.new"
    mkdir -p "$tools.new"
    dpkg-deb -x "$deb" "$tools.new"
    [ -x "$tools.new/usr/bin/promtool" ] || fail "$(basename "$deb") has no usr/bin/promtool"
    rm -rf "$tools"
    mv "$tools.new" "$tools"
}

if [ -n "${PROMTOOL:-}" ]; then
    promtool=$PROMTOOL
else
    promtool=$tools/usr/bin/promtool
    if ! "$promtool" --version >/dev/null 2>&1; then
        fetch_promtool
    fi
fi
version=$("$promtool" --version 2>&1 | head -n1) || fail "$promtool does not run: $version"
echo "check-monitoring: promtool: $version ($promtool)"

# Runs promtool with these arguments; its output goes to stderr if it fails.
run_promtool() {
    "$promtool" "$@" >"$tmp/promtool.log" 2>&1 || {
        cat "$tmp/promtool.log" >&2
        fail "promtool $* failed"
    }
}

python3 -m json.tool "$dashboard" >/dev/null 2>"$tmp/json.log" ||
    fail "$dashboard is not valid JSON: $(cat "$tmp/json.log")"
echo "check-monitoring: json: $dashboard is valid JSON"

run_promtool check rules "$rules"
echo "check-monitoring: rules: $rules: $(grep -o '[0-9]* rules found' "$tmp/promtool.log") (promtool check rules)"

run_promtool test rules "$rule_tests"
echo "check-monitoring: rule tests: $rule_tests pass (promtool test rules)"

# The dashboard's expressions as recording rules (a JSON document is YAML),
# one per panel target and template variable query, named after where they
# are so that promtool's errors point at them.
python3 - "$dashboard" "$tmp/dashboard-rules.yaml" >"$tmp/count" <<'PY'
import json
import re
import sys

dashboard_path, out_path = sys.argv[1], sys.argv[2]
with open(dashboard_path, encoding="utf-8") as f:
    dashboard = json.load(f)

# Grafana's variables: $name, ${name}, ${name:format}, [[name]].
VARIABLE = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\$(\w+)|\[\[(\w+)(?::[^\]]*)?\]\]")
DURATIONS = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}
NUMBERS = {"__interval_ms": "60000", "__range_ms": "3600000", "__range_s": "3600"}


def substitute(expr):
    def value(m):
        name = m.group(1) or m.group(2) or m.group(3)
        return DURATIONS.get(name) or NUMBERS.get(name) or "x"

    return VARIABLE.sub(value, expr)


def panels(items):
    for p in items:
        yield p
        yield from panels(p.get("panels", []))


rules = []


def add(where, expr):
    if not isinstance(expr, str) or not expr.strip():
        sys.exit(f"check-monitoring: {dashboard_path}: {where} has no expression")
    rules.append({"record": "dashboard:" + re.sub(r"\W", "_", where), "expr": substitute(expr)})


for p in panels(dashboard.get("panels", [])):
    for t in p.get("targets", []):
        add(f"panel_{p.get('id')}_{t.get('refId')}", t.get("expr"))

LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:(.*\S)\s*,\s*)?([A-Za-z_]\w*)\s*\)\s*$", re.S)
QUERY_RESULT = re.compile(r"^\s*query_result\((.*)\)\s*$", re.S)
for v in dashboard.get("templating", {}).get("list", []):
    if v.get("type") != "query":
        continue
    q = v.get("query")
    if isinstance(q, dict):
        q = q.get("query")
    where = f"variable_{v.get('name')}"
    if not isinstance(q, str):
        sys.exit(f"check-monitoring: {dashboard_path}: {where} has no query")
    m = LABEL_VALUES.match(q)
    if m:
        if m.group(1):
            add(where, m.group(1))
        continue
    m = QUERY_RESULT.match(q)
    add(where, m.group(1) if m else q)

with open(out_path, "w", encoding="utf-8") as f:
    json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, f, indent=1)
print(len(rules))
PY
run_promtool check rules "$tmp/dashboard-rules.yaml"
echo "check-monitoring: dashboard PromQL: $(cat "$tmp/count") expressions of $dashboard parse (promtool check rules)"

# Every vramcap_* name in the files is a metric of docs/statistics.md's
# table, and what rate(), irate() and increase() take is a counter there.
python3 - docs/statistics.md "$dashboard" "$rules" "$rule_tests" <<'PY'
import re
import sys

readme, files = sys.argv[1], sys.argv[2:]
table = {}
with open(readme, encoding="utf-8") as f:
    for line in f:
        m = re.match(r"\| `(vramcap_\w+)` \| (\w+) \|", line)
        if m:
            table[m.group(1)] = m.group(2)
if not table:
    sys.exit(f"check-monitoring: no metric table in {readme}")

used, problems = set(), []
for path in files:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    for name in sorted(set(re.findall(r"\bvramcap_\w+", text))):
        used.add(name)
        if name not in table:
            problems.append(f"{path}: {name} is not in {readme}'s metric table")
    for fn, name in re.findall(r"\b(rate|irate|increase)\(\s*(vramcap_\w+)", text):
        if table.get(name, "counter") != "counter":
            problems.append(f"{path}: {fn}({name}): {name} is a {table[name]}, not a counter")
for p in sorted(set(problems)):
    print(f"check-monitoring: {p}", file=sys.stderr)
if problems:
    sys.exit(1)
print(f"check-monitoring: metric names: the {len(used)} vramcap_* names used are in {readme}'s table of {len(table)}; rate/increase take counters only")
PY

echo "check-monitoring: ok"
