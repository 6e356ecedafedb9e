#!/usr/bin/env python3
"""check-device-plugin.py: `vramcap device-plugin` against a stand-in kubelet.

The stand-in kubelet is written here from the kubelet's device-plugin API
(crates/cli/proto/deviceplugin/v1beta1/api.proto, the official file, compiled
by grpcio-tools into target/kubelet-venv), not from the plugin's code. The
plugin runs as a separate process over the stand-in NVML (two GPUs of
4 GiB, tests/standin/) and is checked for:

1. registration: the Register request, field by field;
2. GetDevicePluginOptions, and ListAndWatch's list for the two GPUs (IDs
   and health exact);
3. GetPreferredAllocation keeping requests on one GPU (the fullest that
   fits), honouring must-include IDs;
4. Allocate: the response field by field, the operator's cap file and the
   statistics directory it made; an ID it never advertised is refused;
5. a GPU lost (the stand-in NVML's STANDIN_NVML_LOST_FILE): its units turn
   Unhealthy in ListAndWatch, and Healthy again when it is back; a critical
   Xid error (STANDIN_NVML_XID_FILE) makes a GPU's units Unhealthy, an
   application's Xid does not;
6. a kubelet restart (its socket made anew, the plugin's removed): the
   plugin registers again and serves;
7. a container-like process with exactly the environment and mounts
   Allocate returned, in a private mount namespace: the stand-in client
   under no LD_PRELOAD at all (the shim comes from /etc/ld.so.preload) is
   capped at the 1 GiB it was given, and so are children that unset
   VRAMCAP_LIMIT, raise it to 100% or set VRAMCAP_DISABLE=1.

8. a second plugin with the same state directory is refused; 9. a GPU
   lost at start is left out and the others served; 10. the directories
   of ended allocations are swept;
11. 10,000 fuzzed requests (undecodable bytes to every method; Allocate
   with bad, unknown, repeated, huge and countless IDs and countless
   containers; GetPreferredAllocation with any lists and sizes;
   ListAndWatch streams opened and never read): each is answered, with a
   gRPC error of one short line when it is refused, the plugin lives on
   and a correct Allocate still works; and the plugin stops promptly at
   SIGTERM with the kubelet's ListAndWatch stream open.

Usage: scripts/check-device-plugin.py, as root (step 7 needs a mount
namespace), after `cargo build` (target/debug/vramcap and libvramcap.so).
Installs grpcio and grpcio-tools (pinned) into target/kubelet-venv when
missing. Exits non-zero with one line naming the first difference.
"""

import os
import queue
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time

from check_report import reporters

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, "target", "kubelet-venv")
GEN = os.path.join(VENV, "gen")
PINS = ["grpcio==1.76.0", "grpcio-tools==1.76.0"]
PROTO_DIR = os.path.join(ROOT, "crates", "cli", "proto")
PROTO = os.path.join(PROTO_DIR, "deviceplugin", "v1beta1", "api.proto")
PODRES_PROTO = os.path.join(PROTO_DIR, "podresources", "v1", "api.proto")
STANDIN = os.path.join(ROOT, "target", "standin-plugin")
CLI = os.path.join(ROOT, "target", "debug", "vramcap")
SHIM = os.path.join(ROOT, "target", "debug", "libvramcap.so")
UUID0 = "GPU-5ca1ab1e-0000-4000-8000-000000000000"
UUID1 = "GPU-5ca1ab1e-0000-4000-8000-000000000001"
GIB = 1 << 30
UNIT = 256 << 20
UNITS = 12  # (4 GiB - 1 GiB reserve) / 256 MiB
LIB_IN_CONTAINER = "/opt/vramcap/lib/libvramcap.so"


fail, step, want = reporters("check-device-plugin")


def ensure_venv():
    py = os.path.join(VENV, "bin", "python")
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
    probe = subprocess.run([py, "-c", "import grpc, grpc_tools"], capture_output=True)
    if probe.returncode != 0:
        subprocess.run([py, "-m", "pip", "install", "-q", "--no-cache-dir", *PINS], check=True)
    os.makedirs(GEN, exist_ok=True)
    subprocess.run(
        [py, "-m", "grpc_tools.protoc", f"-I{PROTO_DIR}", f"--python_out={GEN}",
         f"--grpc_python_out={GEN}", PROTO, PODRES_PROTO],
        check=True,
    )
    return py


def main():
    if os.geteuid() != 0:
        fail("must run as root (step 7 needs a private mount namespace)")
    for p in (CLI, SHIM):
        if not os.path.exists(p):
            fail(f"{p} is missing: run cargo build -p vramcap -p vramcap-shim first")
    py = ensure_venv()
    if sys.executable != py and os.environ.get("CHECK_DEVICE_PLUGIN_IN_VENV") != "1":
        env = dict(os.environ, CHECK_DEVICE_PLUGIN_IN_VENV="1")
        sys.exit(subprocess.run([py, os.path.abspath(__file__)], env=env).returncode)
    subprocess.run(["sh", os.path.join(ROOT, "tests", "standin", "build.sh"), STANDIN], check=True)
    sys.path.insert(0, GEN)
    run_checks()
    step("all checks passed")


def run_checks():
    import grpc
    from concurrent import futures

    from deviceplugin.v1beta1 import api_pb2 as pb
    from deviceplugin.v1beta1 import api_pb2_grpc as rpc
    from podresources.v1 import api_pb2 as prpb
    from podresources.v1 import api_pb2_grpc as prrpc

    work = tempfile.mkdtemp(prefix="vramcap-plugin-")
    plugin_dir = os.path.join(work, "device-plugins")
    state_dir = os.path.join(work, "state")
    lost = os.path.join(work, "lost")
    os.makedirs(plugin_dir)
    kubelet_sock = os.path.join(plugin_dir, "kubelet.sock")
    plugin_sock = os.path.join(plugin_dir, "vramcap-gpu-memory.sock")
    registrations = queue.Queue()

    class Registration(rpc.RegistrationServicer):
        def Register(self, request, context):
            # As the kubelet does, reach the plugin at the endpoint it named:
            # a plugin that registers before it serves fails here.
            try:
                stub = rpc.DevicePluginStub(connect(grpc, os.path.join(plugin_dir, request.endpoint)))
                stub.GetDevicePluginOptions(pb.Empty(), timeout=5)
            except grpc.RpcError as e:
                registrations.put(f"the plugin did not answer at its endpoint: {e.code()}")
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, "plugin not serving")
            registrations.put(request)
            return pb.Empty()

    def start_kubelet():
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        rpc.add_RegistrationServicer_to_server(Registration(), server)
        server.add_insecure_port(f"unix://{kubelet_sock}")
        server.start()
        return server

    # The kubelet's PodResources API: the units a pod's container holds.
    held = {"ids": units(UUID0, range(8, 12))}

    class PodResources(prrpc.PodResourcesListerServicer):
        def List(self, request, context):
            devices = [prpb.ContainerDevices(resource_name="vramcap.io/gpu-memory",
                                             device_ids=held["ids"])] if held["ids"] else []
            return prpb.ListPodResourcesResponse(pod_resources=[prpb.PodResources(
                name="train", namespace="default",
                containers=[prpb.ContainerResources(name="train", devices=devices)])])

    podres = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    prrpc.add_PodResourcesListerServicer_to_server(PodResources(), podres)
    podres_sock = os.path.join(work, "pod-resources.sock")
    podres.add_insecure_port(f"unix://{podres_sock}")
    podres.start()

    kubelet = start_kubelet()
    env = plugin_env(work)
    log = open(os.path.join(work, "plugin.log"), "w")
    plugin = subprocess.Popen(
        [CLI, "device-plugin", "--plugin-dir", plugin_dir, "--state-dir", state_dir,
         "--library", SHIM, "--library-in-container", LIB_IN_CONTAINER,
         "--health-interval", "0.1", "--pod-resources", podres_sock,
         "--sweep-interval", "0.2", "--sweep-grace", "0.001"],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        checks(pb, rpc, grpc, registrations, plugin_sock, kubelet_sock, state_dir, lost,
               lambda: kubelet, start_kubelet, work, held)
        fuzz(pb, rpc, grpc, plugin_sock, plugin)
        # SIGTERM while the kubelet's ListAndWatch stream is open, as it
        # always is: the plugin must still stop, promptly.
        watcher = rpc.DevicePluginStub(connect(grpc, plugin_sock)).ListAndWatch(pb.Empty(), timeout=60)
        next(watcher)
    except SystemExit:
        log.flush()
        with open(os.path.join(work, "plugin.log")) as f:
            sys.stderr.write("--- the plugin's output ---\n" + f.read())
        raise
    finally:
        plugin.terminate()
        started = time.time()
        try:
            plugin.wait(10)
        except subprocess.TimeoutExpired:
            plugin.kill()
            plugin.wait()
    want("the plugin's exit status at SIGTERM with a stream open", plugin.returncode, 0)
    if time.time() - started > 5:
        fail(f"the plugin took {time.time() - started:.1f} s to stop at SIGTERM")
    want("the plugin's socket after it stopped", os.path.exists(plugin_sock), False)
    shutil.rmtree(work, ignore_errors=True)


def plugin_env(work):
    """The plugin's environment: the stand-in NVML of two 4 GiB GPUs."""
    env = dict(
        os.environ,
        LD_LIBRARY_PATH=os.path.join(STANDIN, "lib"),
        STANDIN_DEVICES="2",
        STANDIN_TOTAL_MIB="4096",
        STANDIN_NVML_LOST_FILE=os.path.join(work, "lost"),
        STANDIN_NVML_XID_FILE=os.path.join(work, "xid"),
    )
    for k in list(env):
        if k.startswith("VRAMCAP_") or k == "LD_PRELOAD":
            del env[k]
    return env


def connect(grpc, sock):
    """A channel to the plugin as the kubelet opens it (grpc-go sends the
    authority "localhost" for a Unix socket; grpc-core would send the
    percent-encoded path, which no HTTP/2 server has to accept)."""
    return grpc.insecure_channel(f"unix://{sock}", options=[("grpc.default_authority", "localhost")])


def registered(registrations, what):
    try:
        r = registrations.get(timeout=30)
    except queue.Empty:
        fail(f"{what}: no Register request within 30 s")
    if isinstance(r, str):
        fail(f"{what}: {r}")
    return r


def units(uuid, ns):
    return [f"{uuid}::{n}" for n in ns]


def health_by_gpu(gpu0, gpu1):
    """Every unit's (ID, health): GPU 0's all gpu0, GPU 1's all gpu1."""
    return [(i, gpu0) for i in units(UUID0, range(UNITS))] + [(i, gpu1) for i in units(UUID1, range(UNITS))]


def gone_within(path, seconds, what):
    deadline = time.time() + seconds
    while os.path.exists(path):
        if time.time() > deadline:
            fail(f"{what}: {path} is still there after {seconds} s")
        time.sleep(0.05)


def checks(pb, rpc, grpc, registrations, plugin_sock, kubelet_sock, state_dir, lost,
           kubelet, start_kubelet, work, held):
    # 1. registration
    r = registered(registrations, "registration")
    want("Register.version", r.version, "v1beta1")
    want("Register.endpoint", r.endpoint, "vramcap-gpu-memory.sock")
    want("Register.resource_name", r.resource_name, "vramcap.io/gpu-memory")
    want("Register.options.pre_start_required", r.options.pre_start_required, False)
    want("Register.options.get_preferred_allocation_available",
         r.options.get_preferred_allocation_available, True)
    step("1. registration: as the API says")

    channel = connect(grpc, plugin_sock)
    stub = rpc.DevicePluginStub(channel)

    # 2. options and the device list
    o = stub.GetDevicePluginOptions(pb.Empty(), timeout=10)
    want("GetDevicePluginOptions", (o.pre_start_required, o.get_preferred_allocation_available),
         (False, True))
    watch = stub.ListAndWatch(pb.Empty(), timeout=60)
    first = next(watch)
    all_ids = units(UUID0, range(UNITS)) + units(UUID1, range(UNITS))
    want("ListAndWatch IDs", [d.ID for d in first.devices], all_ids)
    want("ListAndWatch health", {d.health for d in first.devices}, {"Healthy"})
    want("ListAndWatch topology", [d.HasField("topology") for d in first.devices][:1], [False])
    step(f"2. ListAndWatch: {len(all_ids)} units, {UNITS} per GPU, all Healthy")

    # 3. preferred allocation
    taken = set(units(UUID0, range(8)))
    avail = [i for i in all_ids if i not in taken]

    def prefer(size, must=()):
        req = pb.PreferredAllocationRequest(container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=avail, must_include_deviceIDs=list(must),
                allocation_size=size)])
        resp = stub.GetPreferredAllocation(req, timeout=10)
        want("GetPreferredAllocation responses", len(resp.container_responses), 1)
        return list(resp.container_responses[0].deviceIDs)

    want("preferred 4 (GPU 0 has 4 free, GPU 1 12)", prefer(4), units(UUID0, range(8, 12)))
    want("preferred 6 (only GPU 1 fits)", prefer(6), units(UUID1, range(6)))
    want("preferred 2 with GPU 1's unit 7", prefer(2, [f"{UUID1}::7"]),
         [f"{UUID1}::0", f"{UUID1}::7"])
    step("3. GetPreferredAllocation: one GPU, the fullest that fits, must-include kept")

    # 4. allocate
    ids = units(UUID0, range(8, 12))
    resp = stub.Allocate(pb.AllocateRequest(container_requests=[
        pb.ContainerAllocateRequest(devices_ids=ids)]), timeout=10)
    want("Allocate responses", len(resp.container_responses), 1)
    c = resp.container_responses[0]
    want("Allocate envs", dict(c.envs), {
        "NVIDIA_VISIBLE_DEVICES": UUID0,
        "VRAMCAP_LIMIT": f"1B,{UUID0}=1024MiB",
        "VRAMCAP_STATS_DIR": "/run/vramcap/stats",
    })
    mounts = [(m.container_path, m.host_path, m.read_only) for m in c.mounts]
    alloc = [h for (cp, h, _) in mounts if cp == "/run/vramcap/stats"]
    if len(alloc) != 1:
        fail(f"Allocate mounts: no statistics directory in {mounts}")
    adir = os.path.dirname(alloc[0])
    if os.path.dirname(adir) != os.path.join(state_dir, "alloc"):
        fail(f"Allocate: the allocation directory {adir} is not under {state_dir}/alloc")
    want("Allocate mounts", mounts, [
        (LIB_IN_CONTAINER, SHIM, True),
        ("/etc/ld.so.preload", os.path.join(state_dir, "ld.so.preload"), True),
        ("/run/vramcap/operator-limit", os.path.join(adir, "operator-limit"), True),
        ("/run/vramcap/stats", os.path.join(adir, "stats"), False),
    ])
    want("Allocate devices", list(c.devices), [])
    want("Allocate annotations", dict(c.annotations), {})
    want("Allocate cdi_devices", list(c.cdi_devices), [])
    with open(os.path.join(adir, "operator-limit")) as f:
        want("the operator's cap file", f.read().splitlines()[-1], f"1B,{UUID0}=1024MiB")
    st = os.stat(os.path.join(adir, "operator-limit"))
    want("the operator's cap file's owner and mode", (st.st_uid, stat.S_IMODE(st.st_mode)), (0, 0o644))
    want("the allocation directory's mode", stat.S_IMODE(os.stat(adir).st_mode), 0o700)
    with open(os.path.join(state_dir, "ld.so.preload")) as f:
        want("ld.so.preload", f.read(), LIB_IN_CONTAINER + "\n")
    want("the statistics directory's mode",
         stat.S_IMODE(os.stat(os.path.join(adir, "stats")).st_mode), 0o1777)
    # The same units again (the next pod): a directory of its own.
    again = stub.Allocate(pb.AllocateRequest(container_requests=[
        pb.ContainerAllocateRequest(devices_ids=ids)]), timeout=10).container_responses[0]
    other = [m.host_path for m in again.mounts if m.container_path == "/run/vramcap/stats"]
    if other == alloc:
        fail(f"a second Allocate of the same units got the same directory {alloc}")
    # The sweep: the kubelet holds these units for one container, the
    # later allocation; the earlier one's directory goes, the later stays.
    gone_within(adir, 10, "the directory of an allocation the same units went to again")
    if not os.path.isdir(os.path.dirname(other[0])):
        fail("the sweep removed the directory of the allocation the kubelet still holds")
    c = again
    try:
        stub.Allocate(pb.AllocateRequest(container_requests=[
            pb.ContainerAllocateRequest(devices_ids=["nvidia0"])]), timeout=10)
        fail("Allocate of an ID never advertised succeeded")
    except grpc.RpcError as e:
        want("Allocate of a foreign ID: code", e.code(), grpc.StatusCode.INVALID_ARGUMENT)
        if "is not a vramcap unit ID" not in e.details():
            fail(f"Allocate of a foreign ID: {e.details()!r} does not say why")
    step("4. Allocate: envs, mounts, cap file and statistics directory exact; a foreign ID refused; "
         "the same units again get a directory of their own, and the earlier one is swept")

    # 5. health
    with open(lost, "w") as f:
        f.write("1\n")
    update = next(watch)
    want("ListAndWatch after GPU 1 was lost",
         [(d.ID, d.health) for d in update.devices], health_by_gpu("Healthy", "Unhealthy"))
    os.remove(lost)
    update = next(watch)
    want("ListAndWatch after GPU 1 came back", {d.health for d in update.devices}, {"Healthy"})
    # An application's Xid (13) on GPU 1 changes nothing; a critical one (79,
    # fallen off the bus) on GPU 0 makes its units Unhealthy for good.
    with open(os.path.join(work, "xid"), "w") as f:
        f.write("1 13\n0 79\n")
    update = next(watch)
    want("ListAndWatch after Xid 13 on GPU 1 and Xid 79 on GPU 0",
         [(d.ID, d.health) for d in update.devices], health_by_gpu("Unhealthy", "Healthy"))
    step("5. health: a lost GPU's units Unhealthy, Healthy again when it is back; "
         "a critical Xid makes them Unhealthy, an application's does not")

    # 6. a kubelet restart
    channel.close()
    kubelet().stop(0).wait()
    for p in (kubelet_sock, plugin_sock):
        if os.path.exists(p):
            os.remove(p)
    start_kubelet()
    r = registered(registrations, "re-registration after the kubelet restarted")
    want("Register.endpoint again", r.endpoint, "vramcap-gpu-memory.sock")
    deadline = time.time() + 10
    while not os.path.exists(plugin_sock) and time.time() < deadline:
        time.sleep(0.05)
    stub = rpc.DevicePluginStub(connect(grpc, plugin_sock))
    want("ListAndWatch after the restart", len(next(stub.ListAndWatch(pb.Empty(), timeout=10)).devices),
         2 * UNITS)
    step("6. kubelet restart: registered again and serving")

    # 7. the container
    container(c, work)
    step("7. container: capped at 1 GiB without LD_PRELOAD, whatever VRAMCAP_LIMIT or VRAMCAP_DISABLE say; "
         "its other GPU at one byte")

    # 8. a second plugin on the node is refused
    second = subprocess.run(
        [CLI, "device-plugin", "--plugin-dir", os.path.dirname(plugin_sock), "--state-dir", state_dir],
        env=plugin_env(work), capture_output=True, text=True, timeout=30)
    want("a second plugin's exit status", second.returncode, 2)
    if "another vramcap device-plugin runs" not in second.stderr:
        fail(f"a second plugin did not say why it stopped: {second.stderr.strip()!r}")
    step("8. a second plugin with the same state directory is refused in one line")

    # 9. a GPU lost at start: the plugin serves the others (and --gpu)
    lost_dir = os.path.join(work, "lost-start")
    os.makedirs(lost_dir)
    with open(lost, "w") as f:
        f.write("1\n")
    env = plugin_env(work)
    p = subprocess.Popen(
        [CLI, "device-plugin", "--plugin-dir", lost_dir, "--state-dir", os.path.join(lost_dir, "state"),
         "--gpu", UUID0], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in p.stdout:
        lines.append(line.rstrip())
        if "trying again" in line:
            break
    p.terminate()
    p.wait(10)
    os.remove(lost)
    if f"vramcap device-plugin: {UUID1}: NVML cannot read its memory: not advertised" not in lines \
            or f"vramcap device-plugin: {UUID0}: {4 * GIB} bytes, {UNITS} units of {UNIT} bytes" not in lines:
        fail(f"a plugin started with GPU 1 lost: {lines}")
    want("its exit status at SIGTERM", p.returncode, 0)
    step("9. a GPU lost at start is left out; the others are served")

    # 10. the pod ends: its allocation's directory goes too
    held["ids"] = []
    last = [m.host_path for m in c.mounts if m.container_path == "/run/vramcap/stats"][0]
    gone_within(os.path.dirname(last), 10, "the directory of an allocation that ended")
    step("10. the directory of an allocation the kubelet no longer holds is swept")


def fuzz(pb, rpc, grpc, plugin_sock, plugin):
    """11. 10,000 malformed or hostile requests, then a correct Allocate."""
    import random
    from collections import Counter

    rnd = random.Random(32)
    channel = connect(grpc, plugin_sock)
    stub = rpc.DevicePluginStub(channel)
    unary = ["GetDevicePluginOptions", "Allocate", "GetPreferredAllocation", "PreStartContainer"]
    raw = {m: channel.unary_unary(f"/v1beta1.DevicePlugin/{m}") for m in unary}
    good = units(UUID1, range(UNITS))

    def an_id():
        k = rnd.randrange(12)
        if k < 3:
            return rnd.choice(good)
        if k == 3:
            return f"{UUID0}::{rnd.choice([UNITS, 10**6, 2**64 - 1, 2**64, -1])}"
        if k == 4:
            return f"GPU-{rnd.getrandbits(32):08x}::0"
        if k == 5:
            return rnd.choice(["", "::", "::0", "nvidia0", f"{UUID1}::01", f"{UUID1}::+1", f"{UUID1}:: 1"])
        if k == 6:
            return "".join(chr(rnd.choice([0, 7, 10, 13, 27, 0x202e, 0xfffd, rnd.randrange(32, 0x3000)]))
                           for _ in range(rnd.randrange(1, 40)))
        if k == 7:
            return f"{UUID1}::{rnd.randrange(UNITS)}\n{UUID0}::0"
        return "".join(rnd.choice("GPU-0123456789abcdef:") for _ in range(rnd.randrange(1, 60)))

    def request(i):
        """One fuzzed call: (what, a function that makes it)."""
        k = i % 10
        if k == 0:
            m = rnd.choice(unary)
            size = rnd.choice([0, 1, 7, 64, 1000, 200_000]) if i % 1000 else 3_000_000
            body = bytes(rnd.getrandbits(8) for _ in range(min(size, 2000))) * max(1, size // 2000)
            return f"{m} of {len(body)} random bytes", lambda: raw[m](body, timeout=30)
        if k in (1, 2, 3):
            ids = [an_id() for _ in range(rnd.randrange(0, 6))]
            req = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])
            return f"Allocate of {ids!r:.200}", lambda: stub.Allocate(req, timeout=30)
        if k == 4:
            shape = (i // 10) % 4
            if shape == 0:
                ids = [f"{UUID1}::0" + "9" * rnd.choice([100, 10_000, 1_000_000])]
            elif shape == 1:
                ids = [an_id() for _ in range(rnd.choice([1000, 50_000]))]
            elif shape == 2:
                ids = [rnd.choice(good)] * rnd.choice([2, 1000])
            else:
                ids = ["x" * 4000] * 500
            req = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])
            return f"Allocate of {len(ids)} IDs, the first {len(ids[0])} long", \
                lambda: stub.Allocate(req, timeout=30)
        if k == 5:
            n = rnd.choice([0, 2, 100]) if (i // 10) % 50 else 5000
            req = pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=[rnd.choice(good)]) for _ in range(n)])
            return f"Allocate of {n} containers", lambda: stub.Allocate(req, timeout=30)
        if k in (6, 7):
            avail = [an_id() for _ in range(rnd.choice([0, 3, 30, 3000]))]
            must = [an_id() for _ in range(rnd.choice([0, 1, 5]))]
            size = rnd.choice([-2**31, -1, 0, 1, 5, 12, 2**31 - 1])
            req = pb.PreferredAllocationRequest(container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=avail, must_include_deviceIDs=must, allocation_size=size)
            ] * rnd.choice([0, 1, 3]))
            return f"GetPreferredAllocation of {len(avail)} IDs, size {size}", \
                lambda: stub.GetPreferredAllocation(req, timeout=30)
        if k == 8:
            req = pb.PreStartContainerRequest(devices_ids=[an_id() for _ in range(rnd.randrange(4))])
            return "PreStartContainer", lambda: stub.PreStartContainer(req, timeout=30)
        return "GetDevicePluginOptions", lambda: stub.GetDevicePluginOptions(pb.Empty(), timeout=30)

    codes = Counter()
    streams = []
    started = time.time()
    for i in range(10_000):
        if i % 50 == 0 and len(streams) < 200:
            # A client that opens a stream and never reads it.
            streams.append(stub.ListAndWatch(pb.Empty(), timeout=600))
        what, call = request(i)
        try:
            call()
            codes["OK"] += 1
        except grpc.RpcError as e:
            code = e.code()
            codes[code.name] += 1
            details = e.details() or ""
            if code not in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.INTERNAL,
                            grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.OUT_OF_RANGE):
                fail(f"fuzzed request {i} ({what}): answered {code.name}: {details[:300]!r}")
            if "\n" in details or len(details) > 1024 or not details:
                fail(f"fuzzed request {i} ({what}): {code.name} is not one short line: "
                     f"{len(details)} characters, {details[:300]!r}")
        if plugin.poll() is not None:
            fail(f"the plugin ended ({plugin.returncode}) after fuzzed request {i} ({what})")
    for s in streams:
        s.cancel()
    ids = units(UUID1, range(4))
    resp = stub.Allocate(pb.AllocateRequest(container_requests=[
        pb.ContainerAllocateRequest(devices_ids=ids)]), timeout=10)
    want("Allocate after the fuzzing", dict(resp.container_responses[0].envs)["VRAMCAP_LIMIT"],
         f"1B,{UUID1}=1024MiB")
    channel.close()
    step(f"11. 10,000 fuzzed requests in {time.time() - started:.0f} s "
         f"({', '.join(f'{k} {v}' for k, v in sorted(codes.items()))}), {len(streams)} streams never read: "
         "every one answered, refusals in one short line; a correct Allocate still works")


def container(c, work):
    """Runs the stand-in client with exactly c's environment and mounts."""
    etc = os.path.join(work, "etc")
    shutil.copytree("/etc", etc, symlinks=True)
    if os.path.exists(os.path.join(etc, "ld.so.preload")):
        os.remove(os.path.join(etc, "ld.so.preload"))
    open(os.path.join(etc, "ld.so.preload"), "w").close()
    # As a runtime does, every mount is in place before the container's
    # first process; ld.so.preload last, since every process after it
    # loads the shim (which then reads the operator's cap file).
    ordered = sorted(c.mounts, key=lambda m: m.container_path == "/etc/ld.so.preload")
    binds = []
    for m in ordered:
        binds.append(f'bind "{m.host_path}" "{m.container_path}" {"ro" if m.read_only else "rw"}')
    client = os.path.join(STANDIN, "bin", "client")
    script = f"""
set -e
bind() {{
    if [ -d "$1" ]; then mkdir -p "$2"; else mkdir -p "$(dirname "$2")"; [ -e "$2" ] || touch "$2"; fi
    mount --bind "$1" "$2"
    if [ "$3" = ro ]; then mount -o remount,bind,ro "$2"; fi
}}
mount --bind "{etc}" /etc
mount -t tmpfs none /run
mount -t tmpfs none /opt
{chr(10).join(binds)}
echo '--- no LD_PRELOAD at all'
env -u LD_PRELOAD "{client}" procaddr init info fill 256M
echo '--- children that unset VRAMCAP_LIMIT, raise it, or disable the shim'
env -u LD_PRELOAD -u VRAMCAP_LIMIT "{client}" procaddr init info
env -u LD_PRELOAD VRAMCAP_LIMIT=100% "{client}" procaddr init info
env -u LD_PRELOAD VRAMCAP_DISABLE=1 "{client}" procaddr init info
echo '--- the GPU it was not given (its own NVIDIA_VISIBLE_DEVICES=all)'
env -u LD_PRELOAD "{client}" procaddr init ctx 1 info alloc 1M || true
"""
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "LD_LIBRARY_PATH": os.path.join(STANDIN, "lib"),
        "STANDIN_DEVICES": "2",
        "STANDIN_TOTAL_MIB": "4096",
        **dict(c.envs),
    }
    out = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                         env=env, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        fail(f"the container-like run failed ({out.returncode}): {out.stderr.strip()}")
    lines = [l for l in out.stdout.splitlines()]
    want("the container's output", lines, [
        "--- no LD_PRELOAD at all",
        "init -> 0",
        f"info -> 0 free={GIB} total={GIB}",
        f"fill {256 << 20} -> 4 allocs {GIB} bytes rc=2",
        "--- children that unset VRAMCAP_LIMIT, raise it, or disable the shim",
        "init -> 0",
        f"info -> 0 free={GIB} total={GIB}",
        "init -> 0",
        f"info -> 0 free={GIB} total={GIB}",
        "init -> 0",
        f"info -> 0 free={GIB} total={GIB}",
        "--- the GPU it was not given (its own NVIDIA_VISIBLE_DEVICES=all)",
        "init -> 0",
        "ctx 1 -> 0",
        "info -> 0 free=1 total=1",
        f"alloc {1 << 20} -> 2",
    ])


if __name__ == "__main__":
    main()
