"""Local provider nodes: what ``terraform/local`` runs in its create and destroy provisioners.

A node is a network namespace on the cluster's bridge (its own address), a UTS namespace (its own
hostname), a PID namespace (its processes see only each other; the host's are not in its ``/proc``) and a
mount namespace whose root is an overlay of the local base image (``tfcluster.image``: bare Debian 12, as a
cloud VM boots) with a per-node upper directory, so installs on one node touch neither the image nor the
other nodes. Its ``/dev`` is its own (a few character devices, its own ptys, no host disk or memory
device), its ``/sys`` is read-only, and its processes, root included, lack the capabilities a node never
needs (mounting, modules, raw I/O, tracing other processes, devices, the clock; :data:`DROPPED_CAPS`).
The host refuses to connect to the nodes' TensorFlow port (:data:`HOST_GUARD`, a rule in the host's own
namespace, out of the nodes' reach, like a cloud's security group), so no local user reaches it through
the bridge; on the node itself the tf_node role's firewall lets it answer only the cluster's members, as on
a cloud VM. As cloud-init does on a cloud VM, the node gets host keys of its own, the run's public key for
the image's non-root user (who has password-less sudo) and, the node having no route beyond its bridge,
the cluster's apt proxy. Its sshd is the node's first process (PID 1 in its PID namespace); everything
Ansible starts on it is a child of that sshd and lives in the same namespaces, and, when the node has a
memory limit (``provider_options.node_memory_mb``), in the same memory cgroup (``tfcluster.cgroup``).

Not isolated: the user namespace (root on a node is root on the host's kernel, kept in check by the
namespaces and the dropped capabilities; sshd's privilege separation needs real ids) and the kernel itself.

Called as ``python -m tfcluster.localnode ACTION JSON`` (ACTION: network-up, network-down, node-up,
node-down); the JSON object carries the module's inputs, so destroy works from Terraform state alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

from . import cgroup
from .errors import TfclusterError
from .image import user_ids
from .poll import wait_until

NETNS_PREFIX = "tfc_"
FAULT_ENV = "TFCLUSTER_FAULT_NODE_UP"  # test hook: "<node>:fail" or "<node>:nosshd"


class NodeError(RuntimeError):
    pass


def _short(text: str, n: int) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:n]


def bridge_name(cluster: str) -> str:
    """The cluster's bridge (interface names have at most 15 characters)."""
    return "tfb" + _short(cluster, 10)


def veth_prefix(cluster: str) -> str:
    """Host ends of the nodes' veth pairs: this prefix and the node's position in two hex digits."""
    return "tfv" + _short(cluster, 6)


def netns_prefix(cluster: str) -> str:
    """Namespaces of the cluster's nodes: this prefix and the node name; cluster names have no '_', so
    the prefix is unique per cluster."""
    return f"{NETNS_PREFIX}{cluster}_"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def link_exists(name: str) -> bool:
    return _ip("link", "show", "dev", name, check=False).returncode == 0


def list_netns() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def netns_pids(ns: str) -> list[int]:
    res = _ip("netns", "pids", ns, check=False)
    return [int(p) for p in res.stdout.split() if p.strip().isdigit()]


def list_links(prefix: str) -> list[str]:
    out = _ip("-o", "link", "show", check=False).stdout
    names = []
    for line in out.splitlines():
        name = line.split(":", 2)[1].strip().split("@")[0]
        if name.startswith(prefix):
            names.append(name)
    return names


# --------------------------------------------------------------------------------------------------
# network
def network_up(p: dict) -> None:
    br = p["bridge"]
    if not link_exists(br):
        _ip("link", "add", "name", br, "type", "bridge")
    addrs = _ip("-o", "addr", "show", "dev", br).stdout
    if f" {p['gateway_cidr']} " not in addrs + " ":
        _ip("addr", "replace", p["gateway_cidr"], "dev", br)
    _ip("link", "set", br, "up")
    rules = HOST_GUARD.format(table=guard_table(br), bridge=br, tf_port=int(p["tf_port"]))
    res = _nft(rules, "-f", "-")
    if res.returncode != 0:
        raise NodeError(f"bridge {br}: the host's guard of the TensorFlow port could not be loaded: "
                        f"{res.stderr.strip()}")


def network_down(p: dict) -> None:
    remove_guard(p["bridge"])
    if link_exists(p["bridge"]):
        _ip("link", "del", p["bridge"])


# --------------------------------------------------------------------------------------------------
# node
SSHD_CONFIG = """\
# tfcluster local node {name}: sshd is this node's first process.
ListenAddress {ip}
Port 22
HostKey /etc/ssh/tfcluster_host_ed25519_key
PidFile /run/tfcluster-sshd.pid
PermitRootLogin no
AllowUsers {ssh_user}
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
AuthorizedKeysFile .ssh/authorized_keys
StrictModes yes
PrintMotd no
MaxStartups 64:30:128
MaxSessions 64
ClientAliveInterval 15
ClientAliveCountMax 4
Subsystem sftp internal-sftp
"""

#: apt on a node goes through the cluster's proxy (tfcluster.aptproxy), as cloud-init's `apt: proxy` sets it
APT_PROXY_CONF = """\
// tfcluster local node: the node has no route beyond its bridge; the cluster's apt proxy fetches for it.
Acquire::http::Proxy "{apt_proxy}";
"""

#: capabilities no process on a node keeps, root included (dropped from the bounding set before sshd starts)
#: (net_admin stays: it acts on the node's own network namespace only, where the tf_node role loads its firewall)
DROPPED_CAPS = ("sys_admin", "sys_module", "sys_rawio", "sys_ptrace", "sys_boot", "sys_time", "mknod",
                "sys_resource", "syslog", "mac_admin", "mac_override", "bpf", "perfmon",
                "checkpoint_restore", "linux_immutable", "sys_pacct", "sys_tty_config", "wake_alarm",
                "block_suspend", "lease", "ipc_lock", "audit_control")

#: the character devices a node's /dev holds (bind-mounted from the host's), besides its own ptys
NODE_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")

INIT_SCRIPT = """\
set -eu
hostname "$TFC_NAME"
M="$TFC_DIR/merged"
mount -t overlay overlay -o "lowerdir=$TFC_IMAGE,upperdir=$TFC_DIR/upper,workdir=$TFC_DIR/work" "$M"
mount -t proc -o nosuid,nodev,noexec proc "$M/proc"
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$M/sys"
mount -t tmpfs -o mode=0755,nosuid,noexec tmpfs "$M/dev"
for d in $TFC_DEVICES; do touch "$M/dev/$d"; mount --bind "/dev/$d" "$M/dev/$d"; done
mkdir -p "$M/dev/pts" "$M/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620,gid=5,nosuid,noexec devpts "$M/dev/pts"
ln -s pts/ptmx "$M/dev/ptmx"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$M/dev/shm"
ln -s /proc/self/fd "$M/dev/fd"
ln -s /proc/self/fd/0 "$M/dev/stdin"; ln -s /proc/self/fd/1 "$M/dev/stdout"; ln -s /proc/self/fd/2 "$M/dev/stderr"
mount -t tmpfs -o mode=0755 tmpfs "$M/run"
mkdir -p "$M/run/sshd"
echo "node $TFC_NAME: root is an overlay of the base image $TFC_IMAGE (upper: $TFC_DIR/upper)"
cd /
if [ "${TFC_NOSSHD:-}" = 1 ]; then exec sleep infinity; fi
exec setpriv --bounding-set "$TFC_DROP_CAPS" chroot "$M" /usr/sbin/sshd -D -e -f /etc/ssh/tfcluster_sshd_config
"""

#: the host's guard (nftables, in the host's namespace, one table per cluster): the host itself, and so
#: every local user, gets a reset from the nodes' TensorFlow port; the nodes' own traffic is bridged and
#: never passes the host's output hook. SSH (Ansible) is untouched.
HOST_GUARD = """\
table inet {table}
delete table inet {table}
table inet {table} {{
  chain output {{
    type filter hook output priority 0; policy accept;
    oifname "{bridge}" tcp dport {tf_port} reject with tcp reset
  }}
}}
"""


def guard_table(bridge: str) -> str:
    """The host's nftables table guarding a cluster's bridge (:data:`HOST_GUARD`)."""
    return f"tfcluster_{bridge}"


def _nft(rules: str | None, *args: str) -> subprocess.CompletedProcess:
    if shutil.which("nft") is None:
        raise NodeError("the local provider needs nft (apt package nftables, installed by scripts/bootstrap.sh) "
                        "for the host's guard of the nodes' TensorFlow port")
    return subprocess.run(["nft", *args], input=rules, text=True, capture_output=True)


def guard_exists(bridge: str) -> bool:
    return shutil.which("nft") is not None and _nft(None, "list", "table", "inet", guard_table(bridge)).returncode == 0


def remove_guard(bridge: str) -> None:
    if guard_exists(bridge):
        _nft(None, "delete", "table", "inet", guard_table(bridge))


def _mkdir(path: Path, mode: int, owner: tuple[int, int] = (0, 0)) -> None:
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, mode)
    os.chown(path, *owner)


def _write(path: Path, text: str, mode: int, owner: tuple[int, int] = (0, 0)) -> None:
    path.write_text(text)
    os.chmod(path, mode)
    os.chown(path, *owner)


def _prepare_root(node_dir: Path, p: dict) -> None:
    """What cloud-init does on a cloud VM's first boot: hostname, host keys, the user's key, apt proxy."""
    image_root, upper, user = Path(p["image_root"]), node_dir / "upper", p["ssh_user"]
    if not (image_root / "usr" / "sbin" / "sshd").exists():
        raise NodeError(f"node {p['name']}: {image_root} is not a base image with sshd (see tfcluster.image)")
    if p.get("image_layer") and not Path(p["image_layer"]).is_dir():
        raise NodeError(f"node {p['name']}: its image layer {p['image_layer']} is not there (see tfcluster.baked)")
    for d in ("work", "merged"):
        (node_dir / d).mkdir(parents=True, exist_ok=True)
    _mkdir(upper, 0o755)
    _mkdir(upper / "etc", 0o755)
    ssh_dir = upper / "etc" / "ssh"
    _mkdir(ssh_dir, 0o755)
    key = ssh_dir / "tfcluster_host_ed25519_key"
    if not key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", p["name"], "-f", str(key)],
                       check=True, capture_output=True)
    _write(ssh_dir / "tfcluster_sshd_config", SSHD_CONFIG.format(**p), 0o644)
    uid, gid = user_ids(image_root, user)
    home = upper / "home" / user
    _mkdir(upper / "home", 0o755)
    _mkdir(home, 0o755, (uid, gid))
    _mkdir(home / ".ssh", 0o700, (uid, gid))
    _write(home / ".ssh" / "authorized_keys", p["ssh_public_key"].strip() + "\n", 0o600, (uid, gid))
    _write(upper / "etc" / "hostname", p["name"] + "\n", 0o644)
    _write(upper / "etc" / "hosts", f"127.0.0.1 localhost\n{p['ip']} {p['name']}\n", 0o644)
    if p.get("apt_proxy"):
        conf_dir = upper / "etc" / "apt" / "apt.conf.d"
        _mkdir(upper / "etc" / "apt", 0o755)
        _mkdir(conf_dir, 0o755)
        _write(conf_dir / "01tfcluster-proxy", APT_PROXY_CONF.format(apt_proxy=p["apt_proxy"]), 0o644)


def _ssh_banner(ip: str, port: int) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=1.0) as s:
            return s.recv(4).startswith(b"SSH")
    except OSError:
        return False


def _wait_port(ip: str, port: int, timeout: float, alive) -> bool:
    """Whether sshd answers within the timeout (False at once when the node's init has died)."""
    return bool(wait_until(lambda: _ssh_banner(ip, port), timeout, 0.1, give_up=lambda: not alive()))


def _fault_for(name: str) -> str:
    spec = os.environ.get(FAULT_ENV, "")
    for item in spec.split(","):
        node, _, kind = item.partition(":")
        if node == name:
            return kind or "fail"
    return ""


def node_up(p: dict) -> None:
    name, ns, node_dir = p["name"], p["netns"], Path(p["node_dir"])
    fault = _fault_for(name)
    if ns in list_netns() and netns_pids(ns):
        if _wait_port(p["ip"], 22, 2, lambda: True):
            print(f"node {name}: already up at {p['ip']}")
            return
        node_down(p)  # half-made: start over
    node_dir.mkdir(parents=True, exist_ok=True)
    _prepare_root(node_dir, p)
    memory_cgroup = _memory_cgroup(p)  # before the namespaces: a machine without memory cgroups fails here
    if ns not in list_netns():
        _ip("netns", "add", ns)
    veth, peer = p["veth"], p["veth"] + "p"
    if not link_exists(veth):
        _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", ns)
    _ip("link", "set", veth, "master", p["bridge"])
    _ip("link", "set", veth, "up")
    inside = ["ip", "-n", ns]
    for cmd in (["link", "set", "lo", "up"],):
        subprocess.run(inside + cmd, check=True, capture_output=True)
    links = subprocess.run(inside + ["-o", "link"], capture_output=True, text=True).stdout
    if f" {peer}@" in links or f" {peer}:" in links:
        subprocess.run(inside + ["link", "set", peer, "name", "eth0"], check=True, capture_output=True)
    subprocess.run(inside + ["addr", "replace", f"{p['ip']}/{p['prefix_len']}", "dev", "eth0"],
                   check=True, capture_output=True)
    subprocess.run(inside + ["link", "set", "eth0", "up"], check=True, capture_output=True)
    # No default route: a node reaches its own subnet and, through the host, the local S3 store only.
    # Nothing outside the bridge can get an answer from a node, whatever the host forwards.
    if p.get("store_ip"):
        subprocess.run(inside + ["route", "replace", f"{p['store_ip']}/32", "via", p["gateway_ip"]],
                       check=True, capture_output=True)
    if fault == "fail":
        raise NodeError(f"node {name}: injected failure ({FAULT_ENV})")

    proc = _start_init(p, fault, memory_cgroup)
    timeout = float(p.get("ssh_timeout", 20))
    if not _wait_port(p["ip"], 22, timeout, lambda: proc.poll() is None):
        log = (node_dir / "console.log").read_text(errors="replace")[-2000:]
        state = "its init exited" if proc.poll() is not None else f"no sshd answer in {timeout:.0f}s"
        raise NodeError(f"node {name} ({p['ip']}) did not come up: {state}\n{log}")
    limit = f", memory limit {p['memory_mb']} MiB" if p.get("memory_mb") else ""
    print(f"node {name}: up at {p['ip']} (netns {ns}{limit})")


def _memory_cgroup(p: dict) -> Path | None:
    """The node's memory cgroup, made now, when it has a memory limit (provider_options.node_memory_mb)."""
    return cgroup.create(p["cgroup"], int(p["memory_mb"])) if p.get("memory_mb") else None


def lower_dirs(p: dict) -> str:
    """The overlay's read-only layers, top first: the baked image's layer (tfcluster.baked), if any, then
    the base image."""
    return ":".join(d for d in (p.get("image_layer", ""), p["image_root"]) if d)


def _start_init(p: dict, fault: str, memory_cgroup: Path | None) -> subprocess.Popen:
    """Start the node's init (INIT_SCRIPT, ending in sshd) in its namespaces and, if any, its memory cgroup."""
    node_dir = Path(p["node_dir"])
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "TFC_NAME": p["name"], "TFC_DIR": str(node_dir),
           "TFC_IMAGE": lower_dirs(p), "TFC_DEVICES": " ".join(NODE_DEVICES),
           "TFC_DROP_CAPS": ",".join(f"-{c}" for c in DROPPED_CAPS),
           "TFC_NOSSHD": "1" if fault == "nosshd" else ""}
    join = (lambda: cgroup.enter(memory_cgroup)) if memory_cgroup else None
    with open(node_dir / "console.log", "ab") as console:
        try:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", p["netns"], "unshare", "--mount", "--uts", "--pid", "--fork",
                 "--propagation", "private", "/bin/sh", "-c", INIT_SCRIPT],
                stdin=subprocess.DEVNULL, stdout=console, stderr=console, env=env,
                start_new_session=True, close_fds=True, preexec_fn=join)
        except subprocess.SubprocessError as exc:  # from preexec_fn: the cgroup refused the process
            raise NodeError(f"node {p['name']}: its init could not join the memory cgroup {memory_cgroup}: "
                            f"{exc}") from None
    (node_dir / "init.pid").write_text(f"{proc.pid}\n")
    return proc


def kill_netns_processes(ns: str, grace: float = 5.0) -> int:
    """End every process in a namespace: TERM, then KILL after the grace period. Returns how many."""
    pids = netns_pids(ns)
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for pid in netns_pids(ns):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if wait_until(lambda: not netns_pids(ns), wait, 0.05):
            return len(pids)
    raise NodeError(f"namespace {ns}: processes {netns_pids(ns)} survived SIGKILL")


def node_down(p: dict) -> None:
    ns, node_dir = p["netns"], Path(p["node_dir"])
    if ns in list_netns():
        n = kill_netns_processes(ns)
        _ip("netns", "del", ns, check=False)
        print(f"node {p['name']}: stopped {n} process(es), namespace removed")
    if link_exists(p["veth"]):
        _ip("link", "del", p["veth"], check=False)
    if p.get("cgroup") and cgroup.remove(p["cgroup"]):
        print(f"node {p['name']}: memory cgroup {p['cgroup']} removed")
    if node_dir.exists():
        shutil.rmtree(node_dir, ignore_errors=True)


ACTIONS = {"network-up": network_up, "network-down": network_down, "node-up": node_up,
           "node-down": node_down}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] not in ACTIONS:
        print(f"usage: python -m tfcluster.localnode {{{','.join(ACTIONS)}}} JSON", file=sys.stderr)
        return 2
    try:
        ACTIONS[argv[0]](json.loads(argv[1]))
    except (NodeError, TfclusterError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or ""
        print(f"tfcluster.localnode {argv[0]}: {exc} {detail}".strip(), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
