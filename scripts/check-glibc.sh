#!/usr/bin/env bash
# check-glibc.sh FLOOR FILE... — fails when a file needs a glibc symbol
# version newer than FLOOR (e.g. 2.17), listing the offending symbols.
set -euo pipefail
floor=$1
shift
bad=0
for f in "$@"; do
    newest=$(objdump -T "$f" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1)
    if [ "$(printf '%s\n%s\n' "$floor" "$newest" | sort -V | tail -1)" != "$floor" ]; then
        echo "check-glibc: $f needs glibc $newest, newer than the floor $floor:" >&2
        objdump -T "$f" | grep -E "GLIBC_(${newest//./\\.})\b" >&2 || true
        bad=1
    else
        echo "check-glibc: $f needs glibc $newest or newer (floor $floor): ok"
    fi
done
exit $bad
