#!/bin/sh
# gen-stub-names.sh [MOD_RS] - regenerate stub-names.txt.
#
# cudarc (driver feature, dynamic loading) resolves hundreds of driver
# symbols eagerly in Lib::from_library and panics if any is missing. This
# script lists every symbol that function loads when cudarc is built with the
# cuda-13000 feature, drops the names the stand-in implements for real (the
# "CUresult cu...(" prototypes in cuda_subset.h) and writes the rest, sorted,
# to stub-names.txt next to this script. build.sh turns each name into a stub
# returning CUDA_ERROR_NOT_SUPPORTED.
#
# A load guarded by #[cfg(any(feature = ...))] is kept only when the list
# names "cuda-13000"; any other form of cfg is kept to be safe.
#
# MOD_RS defaults to cudarc 0.17.8's src/driver/sys/mod.rs in the cargo
# registry.
set -eu
export LC_ALL=C

here=$(cd "$(dirname "$0")" && pwd)

if [ $# -ge 1 ]; then
    mod_rs=$1
else
    mod_rs=
    for f in "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-0.17.8/src/driver/sys/mod.rs; do
        [ -f "$f" ] && mod_rs=$f
    done
    if [ -z "$mod_rs" ]; then
        echo "gen-stub-names.sh: cudarc-0.17.8 not found in the cargo registry;" \
             "run 'cargo fetch' or pass the path of src/driver/sys/mod.rs" >&2
        exit 1
    fi
fi

tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT

# Names the stand-in implements: every "CUresult cuXxx(" prototype.
sed -n 's/^CUresult \(cu[A-Za-z0-9_]*\)(.*/\1/p' "$here/cuda_subset.h" | sort -u >"$tmp"

awk '
    # Only the body of from_library, up to the construction of Self.
    /fn from_library/ { inside = 1; next }
    inside && /Ok\(Self/ { inside = 0 }
    !inside { next }

    # Collect a (possibly multi-line) cfg attribute.
    /#\[cfg\(/ { in_cfg = 1; cfg = "" }
    in_cfg {
        cfg = cfg $0
        if ($0 ~ /\)\]/) { in_cfg = 0; have_cfg = 1 }
        next
    }

    # A symbol load: __library.get(b"NAME\0").
    /\.get\(b"/ {
        name = $0
        sub(/.*\.get\(b"/, "", name)
        sub(/\\0.*/, "", name)
        keep = 1
        if (have_cfg && cfg ~ /^[ \t]*#\[cfg\(any\(/ && cfg !~ /"cuda-13000"/)
            keep = 0
        if (keep) print name
        have_cfg = 0
        next
    }

    # Any other statement ends the scope of a pending cfg.
    /;[ \t]*$/ { have_cfg = 0 }
' "$mod_rs" | sort -u | comm -23 - "$tmp" >"$here/stub-names.txt"

echo "wrote $(wc -l <"$here/stub-names.txt") names to $here/stub-names.txt" >&2
