#!/bin/sh
# node-setup.sh: run by the vramcap DaemonSet's init container on every GPU
# node. Puts the shim and the CLI under the node's /opt/vramcap and makes
# the node's /run/vramcap/pods, where every capped container's shim creates
# its own statistics directory.
#
#   HOST  where the node's filesystem is mounted (default /host): the init
#         container mounts the node's /opt/vramcap and /run/vramcap there
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

# World-writable and sticky, like /tmp: each container's shim makes its own
# directory here (mode 700, owned by the container's user), and only that
# user or root can remove it.
mkdir -p "$HOST/run/vramcap/pods"
chmod 1777 "$HOST/run/vramcap/pods"

echo "node-setup: installed $("$dest/bin/vramcap" --version) in $dest; pages go under $HOST/run/vramcap/pods"
