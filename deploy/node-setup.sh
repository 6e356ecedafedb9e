#!/bin/sh
# node-setup.sh: run by the vramcap DaemonSet's init container on every GPU
# node. Puts the shim and the CLI under the node's /opt/vramcap, for the
# node's own use (`vramcap top` on the node, `vramcap run` of programs
# started there) and for pods that take the library from the node instead
# of from the image (docs/kubernetes.md).
#
#   HOST  where the node's /opt/vramcap is mounted, as HOST/opt/vramcap
#         (default /host)
#   SRC   where the image holds the files (default /opt/vramcap)
#
# Files are replaced by rename, never rewritten in place: a process that has
# the old library mapped keeps it whole, and a pod that starts meanwhile
# sees either the old file or the new one.
set -eu
HOST=${HOST:-/host}
SRC=${SRC:-/opt/vramcap}
dest=$HOST/opt/vramcap

for f in lib/libvramcap.so bin/vramcap; do
    if [ ! -f "$SRC/$f" ]; then
        echo "node-setup: $SRC/$f is missing from the image" >&2
        exit 1
    fi
done
mkdir -p "$dest/bin" "$dest/lib"
for f in lib/libvramcap.so bin/vramcap; do
    tmp=$dest/$f.new.$$
    cp "$SRC/$f" "$tmp"
    chmod 0755 "$tmp"
    mv -f "$tmp" "$dest/$f"
done
echo "node-setup: installed $("$dest/bin/vramcap" --version) in $dest"
