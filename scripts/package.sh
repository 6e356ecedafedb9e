#!/usr/bin/env bash
# Release artefacts: the shim and the CLI built against glibc 2.17 (so they
# load in old CUDA base images), checked for that floor, then packed as a
# .deb (cargo-deb) and a tarball under target/package/. Installs the tools it
# needs (cargo-zigbuild and zig from PyPI into target/zig-venv, cargo-deb
# from crates.io) when missing. Also fills target/package/image/, the build
# context of deploy/Dockerfile.
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

if [ ! -x "$VENV/bin/cargo-zigbuild" ]; then
    echo "package.sh: installing cargo-zigbuild and zig into $VENV" >&2
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q cargo-zigbuild ziglang
fi
export PATH="$PWD/$VENV/bin:$PATH"
command -v cargo-deb >/dev/null || cargo install -q --locked cargo-deb

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

# The container image's build context (deploy/Dockerfile, for the DaemonSet).
rm -rf "$OUTDIR/image"
mkdir -p "$OUTDIR/image"
cp "$BUILT/vramcap" "$BUILT/libvramcap.so" deploy/Dockerfile deploy/node-setup.sh "$OUTDIR/image/"
ls -l "$OUTDIR"
