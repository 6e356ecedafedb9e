#!/usr/bin/env python3
"""check-deploy.py: the Kubernetes files in deploy/, checked without a cluster.

1. Every manifest validates, strictly (unknown fields are errors), against
   the Kubernetes schemas of the oldest and newest versions we document,
   offline, with kubernetes-validate (pinned; installed from PyPI into
   target/k8s-venv when missing).
2. A node is played out in a temporary directory, from the manifests
   themselves (nothing below repeats a path the manifests hold):
   - the image is assembled from target/package/image/ as deploy/Dockerfile's
     COPY lines say (scripts/package.sh fills that directory);
   - the DaemonSet's init container runs with its HOST and its hostPath
     mounts mapped into the node directory;
   - the example pod's container runs the stand-in client (as user nobody
     when this runs as root, as a non-root container would) with the pod's
     environment, $(VAR) references expanded the way the kubelet does, and
     its mounts mapped; it holds 300 MiB;
   - the DaemonSet's exporter runs with the DaemonSet's arguments (only the
     listen address changed to a free loopback port) and is scraped: the
     sample must carry the pod's name, namespace and container and the
     exact bytes and cap;
   - the init container runs again while the client has the library mapped
     (an upgrade): the library is replaced by rename, the client keeps
     working and is still exported;
   - the client ends: its samples go.

Usage: scripts/check-deploy.py (after scripts/package.sh and
tests/standin/build.sh target/standin-package).
"""

import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, "target", "k8s-venv")
VALIDATOR = "kubernetes-validate==1.37.0"
K8S_VERSIONS = ["1.29.0", "1.37.0"]
MANIFESTS = ["deploy/daemonset.yaml", "deploy/pod-example.yaml"]
IMAGE_CONTEXT = os.path.join(ROOT, "target", "package", "image")
STANDIN = os.path.join(ROOT, "target", "standin-package")
# What the downward API would give the example pod.
FIELDS = {
    "metadata.name": None,  # the pod's own name, from the manifest
    "metadata.namespace": "default",
    "metadata.uid": "6a1f0c2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b",
}


def fail(msg):
    print(f"check-deploy: {msg}", file=sys.stderr)
    sys.exit(1)


def venv_python():
    py = os.path.join(VENV, "bin", "python")
    marker = os.path.join(VENV, "installed")
    if not os.path.exists(marker) or open(marker).read().strip() != VALIDATOR:
        print(f"check-deploy: installing {VALIDATOR} into {VENV}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", VALIDATOR], check=True)
        with open(marker, "w") as f:
            f.write(VALIDATOR + "\n")
    return py


def validate():
    tool = os.path.join(VENV, "bin", "kubernetes-validate")
    for version in K8S_VERSIONS:
        r = subprocess.run(
            [tool, "--strict", "-k", version] + MANIFESTS,
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        print(r.stdout, end="")
        if r.returncode != 0 or "passed" not in r.stdout:
            fail(f"manifests do not validate against Kubernetes {version}:\n{r.stdout}{r.stderr}")


def load(path):
    import yaml  # from the venv (kubernetes-validate depends on it)

    with open(os.path.join(ROOT, path)) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def one(docs, kind):
    found = [d for d in docs if d.get("kind") == kind]
    if len(found) != 1:
        fail(f"expected one {kind}, found {len(found)}")
    return found[0]


def expand(value, env):
    """$(VAR) as the kubelet expands it: defined earlier -> its value;
    $$ -> $; anything else stays as written."""

    def sub(m):
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", sub, value)


def container_env(container, pod_name):
    env = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = expand(e["value"], env)
        else:
            field = e["valueFrom"]["fieldRef"]["fieldPath"]
            if field not in FIELDS:
                fail(f"env {e['name']}: no stand-in value for fieldRef {field}")
            env[e["name"]] = FIELDS[field] or pod_name
    return env


class Mounts:
    """A container's view of the node: mountPath -> node path (hostPath
    volumes only, longest mountPath first)."""

    def __init__(self, spec, container, node):
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        self.map = []
        for m in container.get("volumeMounts", []):
            v = volumes[m["name"]]
            if "hostPath" not in v:
                fail(f"volume {m['name']}: only hostPath volumes are played out")
            self.map.append((m["mountPath"], node + v["hostPath"]["path"], v["hostPath"].get("type", "")))
        self.map.sort(key=lambda t: -len(t[0]))

    def to_node(self, path):
        for mount, host, _ in self.map:
            if path == mount or path.startswith(mount.rstrip("/") + "/"):
                return host + path[len(mount):]
        fail(f"{path} is on no hostPath mount of the container")

    def check_types(self):
        for mount, host, kind in self.map:
            if kind == "File" and not os.path.isfile(host):
                fail(f"hostPath {host} (type File) is missing for {mount}")
            if kind == "Directory" and not os.path.isdir(host):
                fail(f"hostPath {host} (type Directory) is missing for {mount}")
            if kind == "DirectoryOrCreate":
                os.makedirs(host, exist_ok=True)


def build_image(root):
    """The image's files, as deploy/Dockerfile's COPY lines place them."""
    entry = None
    with open(os.path.join(ROOT, "deploy", "Dockerfile")) as f:
        for line in f:
            words = line.split()
            if words[:1] == ["COPY"]:
                src, dst = words[1], words[2]
                target = root + dst
                os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.copy2(os.path.join(IMAGE_CONTEXT, src), target)
            if words[:1] == ["ENTRYPOINT"]:
                entry = re.findall(r'"([^"]+)"', line)
    if not entry:
        fail("deploy/Dockerfile has no ENTRYPOINT")
    return entry


def as_nobody(cmd):
    if os.geteuid() == 0:
        return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] + cmd
    return cmd


def main():
    for p in [IMAGE_CONTEXT, os.path.join(STANDIN, "bin", "client")]:
        if not os.path.exists(p):
            fail(f"{p} is missing: run scripts/package.sh and tests/standin/build.sh target/standin-package first")
    py = venv_python()
    if os.path.realpath(sys.prefix) != os.path.realpath(VENV):
        os.execv(py, [py, os.path.abspath(__file__)] + sys.argv[1:])
    validate()

    ds_docs = load("deploy/daemonset.yaml")
    ds = one(ds_docs, "DaemonSet")
    pod = one(load("deploy/pod-example.yaml"), "Pod")
    spec = ds["spec"]["template"]["spec"]

    tmp = tempfile.mkdtemp(prefix="vramcap-deploy-")
    os.chmod(tmp, 0o755)  # the client runs as nobody
    try:
        image = os.path.join(tmp, "image")
        node = os.path.join(tmp, "node")
        os.makedirs(node)
        entry = build_image(image)

        # The init container.
        (init,) = spec["initContainers"]
        init_env = container_env(init, "")
        init_mounts = Mounts(spec, init, node)
        init_mounts.check_types()
        host = init_env.get("HOST", "/host")
        for mount, hostpath, _ in init_mounts.map:
            if mount != host + hostpath[len(node):]:
                fail(f"init container mounts {hostpath[len(node):]} at {mount}, not under HOST={host}")
        setup = image + init["command"][0]

        def run_setup():
            env = dict(os.environ, HOST=node, SRC=image + "/opt/vramcap")
            r = subprocess.run([setup], env=env, capture_output=True, text=True)
            if r.returncode != 0:
                fail(f"node-setup failed ({r.returncode}): {r.stderr}")
            print(r.stdout, end="")

        run_setup()
        pages_dir = node + "/run/vramcap/pods"
        mode = stat.S_IMODE(os.stat(pages_dir).st_mode)
        if mode != 0o1777:
            fail(f"{pages_dir} has mode {mode:o}, expected 1777")

        # The pod's container, with the pod's environment and mounts.
        (ctr,) = pod["spec"]["containers"]
        env = container_env(ctr, pod["metadata"]["name"])
        mounts = Mounts(pod["spec"], ctr, node)
        mounts.check_types()
        lib = mounts.to_node(env["LD_PRELOAD"])
        with open(lib, "rb") as a, open(image + "/opt/vramcap/lib/libvramcap.so", "rb") as b:
            if a.read() != b.read():
                fail(f"{lib} is not the image's library")
        stats_dir = mounts.to_node(env["VRAMCAP_STATS_DIR"])
        want_dir = f"{pages_dir}/{FIELDS['metadata.uid']}_{ctr['name']}"
        if stats_dir != want_dir:
            fail(f"the pod's statistics directory is {stats_dir}, expected {want_dir}")
        cenv = {k: v for k, v in os.environ.items() if not k.startswith(("VRAMCAP_", "POD_", "LD_"))}
        cenv.pop("CONTAINER_NAME", None)
        cenv.update(env)
        cenv["LD_PRELOAD"] = lib
        cenv["VRAMCAP_STATS_DIR"] = stats_dir
        cenv["LD_LIBRARY_PATH"] = os.path.join(STANDIN, "lib")
        client = subprocess.Popen(
            as_nobody([os.path.join(STANDIN, "bin", "client"), "procaddr", "init", "alloc", "300M", "wait"]),
            env=cenv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for line in client.stdout:
            if line.strip() == "wait":
                break
        else:
            fail(f"the pod's client ended early: {client.wait()} {client.stderr.read()}")
        st = os.stat(stats_dir)
        if stat.S_IMODE(st.st_mode) != 0o700 or (os.geteuid() == 0 and st.st_uid != 65534):
            fail(f"{stats_dir}: mode {stat.S_IMODE(st.st_mode):o} uid {st.st_uid}, expected 700 and the container's user")

        # The exporter, with the DaemonSet's arguments.
        (exp,) = spec["containers"]
        exp_mounts = Mounts(spec, exp, node)
        args = list(exp["args"])
        i = args.index("--listen")
        if args[i + 1] != f":{exp['ports'][0]['containerPort']}":
            fail(f"the exporter listens on {args[i + 1]}, the port declared is {exp['ports'][0]['containerPort']}")
        args[i + 1] = "127.0.0.1:0"
        args = [exp_mounts.to_node(a) if a.startswith("/") else a for a in args]
        annotations = ds["spec"]["template"]["metadata"]["annotations"]
        if annotations.get("prometheus.io/port") != str(exp["ports"][0]["containerPort"]):
            fail("the scrape annotation's port is not the exporter's")
        exporter = subprocess.Popen(
            [image + entry[0]] + entry[1:] + args,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            first = exporter.stderr.readline()
            m = re.match(r"vramcap exporter listening on (http://\S+/metrics)$", first.strip())
            if not m:
                fail(f"unexpected exporter start: {first!r}")
            url = m.group(1)

            def scrape():
                with urllib.request.urlopen(url, timeout=10) as r:
                    return r.read().decode()

            labels = (
                f'pod="{pod["metadata"]["name"]}",namespace="{FIELDS["metadata.namespace"]}",'
                f'container="{ctr["name"]}"'
            )
            limit = {"8GiB": 8 << 30}.get(env["VRAMCAP_LIMIT"])
            if limit is None:
                fail(f"update check-deploy.py for VRAMCAP_LIMIT={env['VRAMCAP_LIMIT']}")

            def expect_pod(text):
                for metric, value in [
                    ("vramcap_gpu_memory_used_bytes", 300 << 20),
                    ("vramcap_gpu_memory_limit_bytes", limit),
                ]:
                    pat = rf'^{metric}\{{gpu="0",UUID="[^"]*",pid="{client.pid}",[^}}]*{re.escape(labels)}\}} {value}$'
                    if not re.search(pat, text, re.M):
                        fail(f"no {metric} {value} with {labels} for pid {client.pid}:\n{text}")

            expect_pod(scrape())

            # An upgrade while the pod runs: the library is replaced, not
            # rewritten; the client is unharmed and still exported.
            before = os.stat(lib).st_ino
            run_setup()
            if os.stat(lib).st_ino == before:
                fail("node-setup rewrote the library in place instead of replacing it")
            expect_pod(scrape())

            client.stdin.write("\n")
            client.stdin.flush()
            out, err = client.communicate(timeout=60)
            if client.returncode != 0:
                fail(f"the pod's client failed after the upgrade ({client.returncode}): {err}")
            if "vramcap_gpu_memory_used_bytes{" in scrape():
                fail("the ended container is still exported")
            if exporter.poll() is not None:
                fail("the exporter ended")
        finally:
            exporter.kill()
            exporter.wait()
            if client.poll() is None:
                client.kill()
                client.wait()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("check-deploy: manifests valid; node set up, pod capped and exported by pod, upgrade by rename: ok")


if __name__ == "__main__":
    main()
