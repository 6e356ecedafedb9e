#!/usr/bin/env python3
"""check-deploy.py: the Kubernetes files in deploy/, checked without a cluster.

1. Every manifest validates, strictly (unknown fields are errors), against
   the Kubernetes schemas of the oldest and newest versions we document,
   offline, with kubernetes-validate (pinned; installed from PyPI into
   target/k8s-venv when missing).
2. A node is played out in a temporary directory from the manifests
   themselves; every container runs as the user its securityContext names,
   with only the capabilities it adds (setpriv), so a manifest that asks
   for too little fails here:
   - the image is assembled from target/package/image/ as deploy/Dockerfile's
     COPY lines say (scripts/package.sh fills that directory);
   - the DaemonSet's init container installs the library on the node;
   - two pods are made from deploy/pod-example.yaml (two names, two UIDs):
     their emptyDir volumes where the kubelet puts them (mode 777, as it
     makes them), their init container's command run with its mounts, and
     their main container run as the stand-in client with the pod's
     environment ($(VAR) references expanded as the kubelet does) and
     mounts; each holds memory;
   - the DaemonSet's exporter runs with its arguments and mounts (only the
     listen address changed to a free loopback port) and is scraped: each
     pod's samples must carry its directory (with its UID), pod, namespace
     and container, the exact bytes and the cap;
   - the init container runs again (an upgrade): the node's library is
     replaced by rename;
   - the clients end: their samples go.

Usage: scripts/check-deploy.py, as root (it runs containers as other users),
after scripts/package.sh and tests/standin/build.sh target/standin-package.
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
MANIFESTS = [
    "deploy/daemonset.yaml",
    "deploy/pod-example.yaml",
    "deploy/device-plugin.yaml",
    "deploy/pod-gpu-memory.yaml",
]
IMAGE_CONTEXT = os.path.join(ROOT, "target", "package", "image")
STANDIN = os.path.join(ROOT, "target", "standin-package")
KUBELET_PODS = "/var/lib/kubelet/pods"
# The two pods made from the example: name, namespace, UID, bytes held.
PODS = [
    ("capped-train", "default", "6a1f0c2e-3b4d-4e5f-8a9b-0c1d2e3f4a5b", 300 << 20),
    ("capped-train-2", "ml", "0d9e8f7a-6b5c-4d3e-9f2a-1b0c9d8e7f6a", 500 << 20),
]


def fail(msg):
    print(f"check-deploy: {msg}", file=sys.stderr)
    sys.exit(1)


def venv_python():
    py = os.path.join(VENV, "bin", "python")
    marker = os.path.join(VENV, "installed")
    if not os.path.exists(marker) or open(marker).read().strip() != VALIDATOR:
        print(f"check-deploy: installing {VALIDATOR} into {VENV}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", "--no-cache-dir", VALIDATOR], check=True)
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


def container_env(container, fields):
    env = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = expand(e["value"], env)
        else:
            path = e["valueFrom"]["fieldRef"]["fieldPath"]
            if path not in fields:
                fail(f"env {e['name']}: no stand-in value for fieldRef {path}")
            env[e["name"]] = fields[path]
    return env


class Container:
    """A container of a pod played out on the node directory: its mounts
    (mountPath -> node path), its image's root, its user and capabilities."""

    def __init__(self, spec, container, node, image, pod_uid=None):
        self.node, self.image, self.name = node, image, container["name"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        self.mounts = []
        for m in container.get("volumeMounts", []):
            v = volumes[m["name"]]
            if "hostPath" in v:
                host = node + v["hostPath"]["path"]
                kind = v["hostPath"].get("type", "")
                if kind == "DirectoryOrCreate":
                    os.makedirs(host, exist_ok=True)
                if kind == "Directory" and not os.path.isdir(host):
                    fail(f"hostPath {v['hostPath']['path']} (type Directory) is missing for {self.name}")
                if kind == "File" and not os.path.isfile(host):
                    fail(f"hostPath {v['hostPath']['path']} (type File) is missing for {self.name}")
            elif "emptyDir" in v:
                if pod_uid is None:
                    fail(f"emptyDir {m['name']} outside a pod")
                host = f"{node}{KUBELET_PODS}/{pod_uid}/volumes/kubernetes.io~empty-dir/{m['name']}"
                if not os.path.isdir(host):
                    os.makedirs(host)
                    os.chmod(host, 0o777)  # as the kubelet makes emptyDirs
            else:
                fail(f"volume {m['name']}: only hostPath and emptyDir volumes are played out")
            self.mounts.append((m["mountPath"], host))
        self.mounts.sort(key=lambda t: -len(t[0]))
        sc = dict(spec.get("securityContext", {}))
        sc.update(container.get("securityContext", {}))
        self.uid = sc.get("runAsUser")
        self.gid = sc.get("runAsGroup", self.uid)
        if self.uid is None:
            fail(f"container {self.name}: set runAsUser (the image's user is not played out)")
        if sc.get("runAsNonRoot") and self.uid == 0:
            fail(f"container {self.name}: runAsNonRoot with runAsUser 0")
        caps = sc.get("capabilities", {})
        if caps.get("drop") != ["ALL"]:
            fail(f"container {self.name}: drop ALL capabilities, then add what it needs")
        self.caps = [c.lower() for c in caps.get("add", [])]
        self.no_new_privs = sc.get("allowPrivilegeEscalation") is False

    def to_node(self, path):
        """Where a path the container sees is, on this machine."""
        for mount, host in self.mounts:
            if path == mount or path.startswith(mount.rstrip("/") + "/"):
                return host + path[len(mount) :]
        return self.image + path

    def wrap(self, cmd):
        """cmd as this container's user, with only its capabilities."""
        bounding = ",".join(["-all"] + [f"+{c}" for c in self.caps])
        w = ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups"]
        w += [f"--bounding-set={bounding}", "--inh-caps=-all"]
        if self.no_new_privs:
            w.append("--no-new-privs")
        return w + cmd


def check_restricted(pod):
    """The Pod Security "restricted" level's rules that a pod spec can break
    on its own (https://kubernetes.io/docs/concepts/security/pod-security-standards/)."""
    spec = pod["spec"]
    bad = []
    for v in spec.get("volumes", []):
        allowed = {"name", "emptyDir", "configMap", "secret", "projected", "downwardAPI",
                   "persistentVolumeClaim", "ephemeral", "csi"}
        if set(v) - allowed:
            bad.append(f"volume {v['name']} is of a type restricted forbids")
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            bad.append(key)
    psc = spec.get("securityContext", {})
    for c in spec.get("initContainers", []) + spec["containers"]:
        sc = c.get("securityContext", {})
        if not (sc.get("runAsNonRoot", psc.get("runAsNonRoot"))):
            bad.append(f"{c['name']}: runAsNonRoot is not true")
        if sc.get("allowPrivilegeEscalation") is not False:
            bad.append(f"{c['name']}: allowPrivilegeEscalation is not false")
        if sc.get("capabilities", {}).get("drop") != ["ALL"] or set(sc.get("capabilities", {}).get("add", [])) - {"NET_BIND_SERVICE"}:
            bad.append(f"{c['name']}: capabilities are not drop ALL")
        seccomp = sc.get("seccompProfile", psc.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            bad.append(f"{c['name']}: no RuntimeDefault seccomp profile")
        if sc.get("privileged") or c.get("ports") and any(p.get("hostPort") for p in c["ports"]):
            bad.append(f"{c['name']}: privileged or host port")
    if bad:
        fail("deploy/pod-example.yaml does not meet the restricted Pod Security level: " + "; ".join(bad))


def build_image(root):
    """The image's files, as deploy/Dockerfile's COPY lines place them."""
    entry = None
    with open(os.path.join(ROOT, "deploy", "Dockerfile")) as f:
        for line in f:
            words = line.split()
            if words[:1] == ["COPY"]:
                target = root + words[2]
                os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.copy2(os.path.join(IMAGE_CONTEXT, words[1]), target)
            if words[:1] == ["ENTRYPOINT"]:
                entry = re.findall(r'"([^"]+)"', line)
    if not entry:
        fail("deploy/Dockerfile has no ENTRYPOINT")
    for d, _, files in os.walk(root):
        os.chmod(d, 0o755)
    return entry


def run_setup(c, init):
    """The DaemonSet's init container: its script, HOST mapped onto the
    node directory (after checking that its mounts are where HOST says)."""
    host = container_env(init, {}).get("HOST", "/host")
    for mount, node_path in c.mounts:
        if mount != host + node_path[len(c.node) :]:
            fail(f"init container mounts {node_path[len(c.node):]} at {mount}, not under HOST={host}")
    env = dict(os.environ, HOST=c.node, SRC=c.image + "/opt/vramcap")
    r = subprocess.run(c.wrap([c.to_node(init["command"][0])]), env=env, capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"node-setup failed ({r.returncode}): {r.stderr}")
    print(r.stdout, end="")


def main():
    if os.geteuid() != 0:
        fail("run as root: containers are played out as their own users and capabilities (setpriv)")
    for p in [IMAGE_CONTEXT, os.path.join(STANDIN, "bin", "client")]:
        if not os.path.exists(p):
            fail(f"{p} is missing: run scripts/package.sh and tests/standin/build.sh target/standin-package first")
    py = venv_python()
    if os.path.realpath(sys.prefix) != os.path.realpath(VENV):
        os.execv(py, [py, os.path.abspath(__file__)] + sys.argv[1:])
    validate()

    ds = one(load("deploy/daemonset.yaml"), "DaemonSet")
    pod_manifest = one(load("deploy/pod-example.yaml"), "Pod")
    spec = ds["spec"]["template"]["spec"]
    check_restricted(pod_manifest)

    tmp = tempfile.mkdtemp(prefix="vramcap-deploy-")
    os.chmod(tmp, 0o755)  # containers run as other users
    clients, exporter = [], None
    try:
        image = os.path.join(tmp, "image")
        node = os.path.join(tmp, "node")
        os.makedirs(node + KUBELET_PODS)
        entry = build_image(image)

        (init,) = spec["initContainers"]
        setup = Container(spec, init, node, image)
        run_setup(setup, init)
        node_lib = node + "/opt/vramcap/lib/libvramcap.so"
        if open(node_lib, "rb").read() != open(image + "/opt/vramcap/lib/libvramcap.so", "rb").read():
            fail("the node's library is not the image's")

        # Two pods from the example.
        for name, namespace, uid, held in PODS:
            pspec = pod_manifest["spec"]
            fields = {"metadata.name": name, "metadata.namespace": namespace, "metadata.uid": uid}
            for ic in pspec.get("initContainers", []):
                c = Container(pspec, ic, node, image, uid)
                cmd = [c.to_node(a) if a.startswith("/") else a for a in ic["command"]]
                r = subprocess.run(c.wrap(cmd), capture_output=True, text=True, env=container_env(ic, fields))
                if r.returncode != 0:
                    fail(f"pod {name}: init container {ic['name']} failed ({r.returncode}): {r.stderr}")
            (main_ctr,) = pspec["containers"]
            c = Container(pspec, main_ctr, node, image, uid)
            env = container_env(main_ctr, fields)
            lib = c.to_node(env["LD_PRELOAD"])
            if not os.path.isfile(lib) or not lib.startswith(node) or open(lib, "rb").read() != open(
                image + "/opt/vramcap/lib/libvramcap.so", "rb"
            ).read():
                fail(f"pod {name}: LD_PRELOAD={env['LD_PRELOAD']} is not the library on a volume of the pod")
            env["LD_PRELOAD"] = lib
            env["VRAMCAP_STATS_DIR"] = c.to_node(env["VRAMCAP_STATS_DIR"])
            env["LD_LIBRARY_PATH"] = os.path.join(STANDIN, "lib")
            env["PATH"] = "/usr/bin:/bin"
            client = subprocess.Popen(
                c.wrap([os.path.join(STANDIN, "bin", "client"), "procaddr", "init", "alloc", str(held), "wait"]),
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            clients.append(client)
            for line in client.stdout:
                if line.strip() == "wait":
                    break
            else:
                fail(f"pod {name}: the client ended early ({client.wait()}): {client.stderr.read()}")
            d = env["VRAMCAP_STATS_DIR"]
            st = os.stat(d)
            if stat.S_IMODE(st.st_mode) != 0o700 or st.st_uid != c.uid:
                fail(f"pod {name}: {d} has mode {stat.S_IMODE(st.st_mode):o} and uid {st.st_uid}, expected 700 and {c.uid}")

        # The exporter, with the DaemonSet's arguments, user and capabilities.
        (exp,) = spec["containers"]
        ec = Container(spec, exp, node, image)
        args = list(exp["args"])
        i = args.index("--listen")
        port = exp["ports"][0]["containerPort"]
        if args[i + 1] != f":{port}":
            fail(f"the exporter listens on {args[i + 1]}, the port declared is {port}")
        if ds["spec"]["template"]["metadata"]["annotations"].get("prometheus.io/port") != str(port):
            fail("the scrape annotation's port is not the exporter's")
        args[i + 1] = "127.0.0.1:0"
        args = [ec.to_node(a) if a.startswith("/") else a for a in args]
        exporter = subprocess.Popen(
            ec.wrap([image + entry[0]] + entry[1:] + args),
            env={"PATH": "/usr/bin:/bin"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        first = exporter.stderr.readline()
        m = re.match(r"vramcap exporter listening on (http://\S+/metrics)$", first.strip())
        if not m:
            fail(f"unexpected exporter start: {first!r}")
        url = m.group(1)

        def scrape():
            with urllib.request.urlopen(url, timeout=10) as r:
                return r.read().decode()

        container = pod_manifest["spec"]["containers"][0]
        limit = {"8GiB": 8 << 30}.get(container_env(container, {"metadata.name": "", "metadata.namespace": ""}).get("VRAMCAP_LIMIT"))
        if limit is None:
            fail("update check-deploy.py for the example's VRAMCAP_LIMIT")

        def expect_pods(text):
            for (name, namespace, uid, held), client in zip(PODS, clients):
                # The exporter was given the node directory's paths.
                want_dir = f"{node}{KUBELET_PODS}/{uid}/volumes/kubernetes.io~empty-dir/vramcap-pages/{container['name']}"
                for metric, value in [
                    ("vramcap_gpu_memory_used_bytes", held),
                    ("vramcap_gpu_memory_limit_bytes", limit),
                ]:
                    labels = (
                        f'group="",dir="{want_dir}",pod="{name}",namespace="{namespace}",container="{container["name"]}"'
                    )
                    pat = rf'^{metric}\{{gpu="0",UUID="[^"]*",pid="\d+",command="[^"]*",{re.escape(labels)}\}} {value}$'
                    if not re.search(pat, text, re.M):
                        fail(f"no {metric} {value} with {labels}:\n{text}")
            if "vramcap_pages_skipped 0" not in text:
                fail(f"the exporter skipped files:\n{text}")

        expect_pods(scrape())

        # An upgrade: the node's library is replaced, not rewritten.
        before = os.stat(node_lib).st_ino
        run_setup(setup, init)
        if os.stat(node_lib).st_ino == before:
            fail("node-setup rewrote the library in place instead of replacing it")

        for client in clients:
            client.stdin.write("\n")
            client.stdin.flush()
            _, err = client.communicate(timeout=60)
            if client.returncode != 0:
                fail(f"a pod's client failed ({client.returncode}): {err}")
        if "vramcap_gpu_memory_used_bytes{" in scrape():
            fail("ended containers are still exported")
        if exporter.poll() is not None:
            fail("the exporter ended")
    finally:
        if exporter is not None:
            exporter.kill()
            exporter.wait()
        for client in clients:
            if client.poll() is None:
                client.kill()
                client.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        "check-deploy: manifests valid; node set up; two pods capped as their users and exported "
        "by pod through the exporter's own user and capabilities; upgrade by rename: ok"
    )


if __name__ == "__main__":
    main()
