#!/usr/bin/env bash
# Release artefacts: the shim and the CLI built against glibc 2.17 (so they
# load in old CUDA base images), checked for that floor, then packed as a
# .deb (cargo-deb), a tarball and a wheel (maturin, tagged manylinux 2.17)
# under target/package/, with SHA256SUMS over all of them. Installs the
# tools it needs into the build directory when missing: cargo-zigbuild, zig
# and maturin from PyPI into target/zig-venv, cargo-deb from crates.io into
# target/tools. Also fills target/package/image/, the build context of
# deploy/Dockerfile.
#
#   scripts/package.sh          # build, check, pack
#   GLIBC_FLOOR=2.17 (default)
set -euo pipefail
cd "$(dirname "$0")/.."
FLOOR=${GLIBC_FLOOR:-2.17}
TRIPLE=x86_64-unknown-linux-gnu
VENV=target/zig-venv
OUTDIR=target/package
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)

if [ ! -x "$VENV/bin/cargo-zigbuild" ] || [ ! -x "$VENV/bin/maturin" ]; then
    echo "package.sh: installing cargo-zigbuild, zig and maturin into $VENV" >&2
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --no-cache-dir cargo-zigbuild ziglang 'maturin>=1.5,<2'
fi
TOOLS=target/tools
if [ ! -x "$TOOLS/bin/cargo-deb" ]; then
    echo "package.sh: installing cargo-deb into $TOOLS" >&2
    cargo install -q --locked --root "$TOOLS" cargo-deb
fi
export PATH="$PWD/$VENV/bin:$PWD/$TOOLS/bin:$PATH"

VRAMCAP_ZIG_LINKER=1 cargo zigbuild --release --locked -p vramcap -p vramcap-shim --target "$TRIPLE.$FLOOR"
BUILT=target/$TRIPLE/release
bash scripts/check-glibc.sh "$FLOOR" "$BUILT/libvramcap.so" "$BUILT/vramcap"

mkdir -p "$OUTDIR"
cargo deb -p vramcap --no-build --target "$TRIPLE" --output "$OUTDIR/vramcap_${VERSION}_amd64.deb"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
name=vramcap-$VERSION-x86_64-linux-gnu
mkdir -p "$stage/$name/bin" "$stage/$name/lib/vramcap"
cp "$BUILT/vramcap" "$stage/$name/bin/"
cp "$BUILT/libvramcap.so" "$stage/$name/lib/vramcap/"
cp README.md "$stage/$name/"
tar -C "$stage" -czf "$OUTDIR/$name.tar.gz" "$name"

# The wheel: maturin builds the CLI for manylinux 2.17 with zig and packs
# it with python/vramcap, into which the shim built above goes (see
# python/build_backend/vramcap_build.py).
rm -f "$OUTDIR"/vramcap-*.whl
cp "$BUILT/libvramcap.so" python/vramcap/libvramcap.so
maturin build --quiet --release --locked --zig --compatibility manylinux2014 \
    --target "$TRIPLE" --out "$OUTDIR"

# The container image's build context (deploy/Dockerfile, for the DaemonSet).
rm -rf "$OUTDIR/image"
mkdir -p "$OUTDIR/image"
cp "$BUILT/vramcap" "$BUILT/libvramcap.so" deploy/Dockerfile deploy/node-setup.sh "$OUTDIR/image/"

(cd "$OUTDIR" && sha256sum ./*.deb ./*.tar.gz ./*.whl image/* | sed 's| \./| |' >SHA256SUMS)
ls -l "$OUTDIR"
cat "$OUTDIR/SHA256SUMS"
