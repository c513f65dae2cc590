"""The embedded default: nodes are Linux namespaces on this machine (see tfcluster/localnode.py)."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import Field
from tfc_harness import strategies

from .. import aptproxy, baked, cgroup, image, localnode, store
from ..config import ROLES, Checked, RunSpec, whole_number_check
from ..errors import ConfigError
from ..paths import ClusterState, cache_root
from ..tfsupport import DefaultImage
from .base import Node, ProviderOptions, ProviderPlan, TerraformProvider, register

#: auto subnets are 10.231.<k>.0/24 with k from the cluster name; the local store uses 10.231.255.0/24
AUTO_BASE = "10.231"


def auto_subnet(cluster: str) -> str:
    return f"{AUTO_BASE}.{10 + zlib.crc32(cluster.encode()) % 240}.0/24"


def subnet_for(spec: RunSpec) -> str:
    value = spec.network.subnet
    return auto_subnet(spec.cluster) if value == "auto" else value


def _routes() -> list[tuple[str, str]]:
    out = subprocess.run(["ip", "-4", "-o", "route", "show"], capture_output=True, text=True).stdout
    routes = []
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0] != "default" and "dev" in parts:
            routes.append((parts[0], parts[parts.index("dev") + 1]))
    return routes


_THREADS_ALLOWED = "a whole number from 0 (TensorFlow's defaults) to 256 (unset: this node's share of the cores)"
_MEMORY_ALLOWED = f"a whole number of MiB from {cgroup.MIN_MB} to {cgroup.MAX_MB} (unset: no limit)"


class LocalOptions(ProviderOptions):
    """provider_options on local: what a user may set (the module's other options are tfcluster's own)."""

    node_memory_mb: Checked(whole_number_check(cgroup.MIN_MB, cgroup.MAX_MB, _MEMORY_ALLOWED)) | None = Field(
        None, description=f"memory of each node in MiB, {cgroup.MIN_MB}-{cgroup.MAX_MB}, like a VM's RAM: every "
                          "process of the node (its sshd and all that Ansible and training start there) is in one "
                          "memory cgroup with this limit and no swap, and one that allocates beyond it is "
                          "OOM-killed while the node lives on; fixed when the nodes are made (default: unset, no "
                          "limit; needs cgroup v1 or v2 with the memory controller)")

    task_threads: Checked(whole_number_check(0, 256, _THREADS_ALLOWED)) | None = Field(
        None, description="threads in the TensorFlow pools of a node's task (intra-op; inter-op the same but at "
                          "least 2: one deadlocks the parameter-server strategy); the nodes share this machine's "
                          "cores, so by default (unset) each task gets its share: the machine's cores divided "
                          "among the tasks that train (ps and a coordinating chief not counted), at least 1; 0: "
                          "TensorFlow's defaults (one thread per core, in every task)")


#: an inter-op pool of one thread deadlocks ParameterServerStrategy (seen: the chief made no step in 90 s, each
#: worker's one thread held by a step function waiting on another op), so inter-op keeps at least this many
MIN_INTER_OP = 2


def share_of_cores(cores: int, training_tasks: int) -> int:
    """One training task's share of ``cores`` cores: at least 1 thread."""
    return max(1, cores // max(1, training_tasks))


@register
class LocalProvider(TerraformProvider):
    name = "local"
    gone = "no node, namespace, bridge or node process remains"
    #: the base image (tfcluster.image): Debian 12, as the clouds' default images
    default_image = DefaultImage("Debian 12 (the local base image)", "3.11", image.IMAGE_USER)
    unsupported = {"gpus": "local nodes share this machine and have no GPUs",
                   "spot": "there is no market for namespaces"}
    options_model = LocalOptions
    max_nodes = 16

    @classmethod
    def uses_cloud_nodes(cls, spec: RunSpec) -> bool:
        return False

    @classmethod
    def check_groups(cls, specs: list[RunSpec]) -> None:
        """Each group's bridge takes its subnet: two groups whose names derive overlapping subnets (``auto``)
        cannot both be up (each one's check alone passes while neither is)."""
        nets = [(s.cluster, ipaddress.ip_network(subnet_for(s))) for s in specs]
        for i, (name, net) in enumerate(nets):
            other = next((o for o, n in nets[:i] if n.overlaps(net)), None)
            if other:
                raise ConfigError("network.subnet", specs[0].network.subnet,
                                  f"a subnet for each group of the sweep: groups {other} and {name} would both "
                                  f"take {net} (derived from their names); set network.subnet (the groups then "
                                  f"take the next ones), or another cluster name")

    def check(self, spec: RunSpec) -> None:
        super().check(spec)
        endpoint = spec.storage.endpoint
        store_ip = store.store_addr()[0]
        if endpoint != "auto" and urlsplit(endpoint).hostname != store_ip:
            raise ConfigError("storage.endpoint", endpoint,
                              f"'auto' or a URL on {store_ip} on the local provider (its nodes reach nothing else)")
        if spec.ssh.user not in ("", image.IMAGE_USER):
            raise ConfigError("ssh.user", spec.ssh.user,
                              f"'' or {image.IMAGE_USER} (the base image's user, with sudo) on the local provider")
        subnet = ipaddress.ip_network(subnet_for(spec))
        if subnet.num_addresses - 11 < spec.node_total:
            raise ConfigError("network.subnet", str(subnet), f"a network with room for {spec.node_total} nodes")
        own = localnode.bridge_name(spec.cluster)
        for net, dev in _routes():
            try:
                other = ipaddress.ip_network(net, strict=False)
            except ValueError:
                continue
            if dev != own and other.overlaps(subnet):
                derived = " (network.subnet auto: derived from the cluster's name; another name derives another, or " \
                    "set network.subnet)" if spec.network.subnet == "auto" else ""
                raise ConfigError("network.subnet", str(subnet),
                                  f"a network not already routed on this machine ({net} is on {dev}){derived}")
        self._check_memory(self.options_for(spec).node_memory_mb or "")
        for role in ROLES:
            if spec.count(role):
                self.image_for(spec, role)  # a bad nodes.<role>.image stops here

    # -- images (tfcluster.baked) -------------------------------------------------------------------------
    def image_for(self, spec: RunSpec, role: str) -> dict | None:
        """The baked image a role's nodes mount (its record), None for the bare base image. nodes.<role>.image:
        '' = the newest image matching the configuration's content key (None when none is built yet),
        'base' = the bare base image, or the name of a built image."""
        value = spec.nodes[role].image
        if value == baked.BASE:
            return None
        if not value:
            return baked.find(baked.local_inputs(spec, spec.nodes[role].gpus).key)
        found = baked.by_name(value)
        if found is None:
            names = [Path(d["dir"]).name for d in baked.built()]
            raise ConfigError(f"nodes.{role}.image", value,
                              f"'' (the newest image matching the roles, else the base image), '{baked.BASE}' "
                              "(the bare base image) or a built image (" + (", ".join(names) or "none built yet")
                              + "; 'make image' builds one)")
        return found

    def layers(self, spec: RunSpec) -> dict[str, str]:
        """Each role's image layer ('' = the bare base image). A cluster whose nodes exist keeps the layers
        they were made with: a node is never made anew under a live cluster."""
        made = {n["role"]: n.get("image_layer", "") for n in self._made_inputs() if "role" in n}
        if made:
            return {r: made.get(r, "") for r in ROLES}
        return {r: baked.layer(found) if spec.count(r) and (found := self.image_for(spec, r)) else ""
                for r in ROLES}

    def image_keys(self, spec: RunSpec) -> dict[str, str]:
        key = baked.local_inputs(spec).key
        return {role: key for role in ROLES if spec.count(role)}

    def inputs(self, spec: RunSpec, public_key: str) -> dict:
        return super().inputs(spec, public_key) | {"images": self.layers(spec)}

    def node_image(self, spec: RunSpec, role: str) -> str:
        """A role's image as ``plan`` shows it: the baked image it gets (or up bakes), or the bare base image."""
        if spec.nodes[role].image == baked.BASE:
            return str(self.default_image.name)
        found = self.image_for(spec, role)
        return Path(found["dir"]).name if found else f"{baked.local_inputs(spec).full_name} (to bake)"

    def _check_memory(self, memory: str) -> None:
        """node_memory_mb needs a memory cgroup controller, and is fixed once the nodes are made (their init
        joins the cgroup when it starts; a node is never made anew under a live cluster)."""
        if memory and cgroup.hierarchy() is None:
            raise ConfigError("provider_options.node_memory_mb", memory, f"unset ({cgroup.NO_CONTROLLER})")
        made = self._node_memory_made()
        if made and made != {memory}:
            was = ", ".join(sorted(f"'{m}'" if m else "unset" for m in made))
            raise ConfigError("provider_options.node_memory_mb", memory,
                              f"{was}, as when the nodes of cluster {self.state.cluster} were made (make down, "
                              "then make up, to change it)")

    def _node_memory_made(self) -> set[str]:
        """node_memory_mb ('' = none) of the nodes Terraform's state records (none: an empty set)."""
        return self._made("memory_mb")

    def _made_inputs(self) -> list[dict]:
        """The input of each node Terraform's state records (none: an empty list)."""
        try:
            resources = json.loads((self.state.terraform_dir / "terraform.tfstate").read_text())["resources"]
            found = [dict(inst["attributes"]["input"]["value"])
                     for res in resources if res["type"] == "terraform_data" and res["name"] == "node"
                     for inst in res["instances"]]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return []
        for n in found:  # the node's role, from its name <cluster>-<role>-<index>
            parts = str(n.get("name", "")).rsplit("-", 2)
            if len(parts) == 3:
                n["role"] = parts[1]
        return found

    def _made(self, field: str) -> set[str]:
        return {n.get(field, "") for n in self._made_inputs()}

    def task_threads(self, spec: RunSpec) -> dict:
        """Local nodes share this machine's cores: each task's pools get its share (see LocalOptions)."""
        asked = self.options_for(spec).task_threads
        if asked is None:
            tasks = strategies.training_task_count(spec.strategy, {r: spec.count(r) for r in ROLES})
            asked = share_of_cores(os.cpu_count() or 1, tasks)
        n = int(asked)
        return {"intra_op": n, "inter_op": max(MIN_INTER_OP, n)} if n else {}

    def warm_start(self, spec: RunSpec) -> bool:
        """Not on nodes with a memory limit (node_memory_mb): it stands for the memory a task may use, which a
        standing interpreter would take ~200 MB of."""
        return not self.options_for(spec).node_memory_mb

    def up(self, spec: RunSpec, public_key: str) -> list[Node]:
        from ..cluster import say

        image.ensure(log=say)  # once per recipe, shared by every cluster
        if not self._made_inputs():  # new nodes: bake the image they will mount first, if none matches yet
            for role in ROLES:
                if spec.count(role) and not spec.nodes[role].image and self.image_for(spec, role) is None:
                    baked.ensure_local(spec, log=say, gpus=spec.nodes[role].gpus)
        return super().up(spec, public_key)

    def provider_options(self, spec: RunSpec) -> dict[str, str]:
        """The module's options: tfcluster's own, and the user's (node_memory_mb) when given (task_threads is
        the tasks' own, passed when they start: :meth:`task_threads`)."""
        return self.options_for(spec).model_dump(exclude_none=True, exclude={"task_threads"}) | {
            "python": sys.executable,
            "state_dir": str(self.state.dir),
            "subnet": subnet_for(spec),
            "bridge": localnode.bridge_name(spec.cluster),
            "veth_prefix": localnode.veth_prefix(spec.cluster),
            "netns_prefix": localnode.netns_prefix(spec.cluster),
            "cgroup_parent": cgroup.cluster_path(spec.cluster),
            "image_root": str(image.rootfs(image.default_recipe())),
            "apt_cache_dir": str(cache_root() / "_aptcache"),
            "ssh_timeout": str(min(spec.ssh.timeout_seconds, 120)),
            "store_ip": store.store_addr()[0],
        }

    def wheelhouse_host(self, spec: RunSpec) -> str | None:
        return str(next(ipaddress.ip_network(subnet_for(spec)).hosts()))  # the bridge's address

    # -- plan ---------------------------------------------------------------------------------------------
    def plan(self, spec: RunSpec, scratch: ClusterState) -> ProviderPlan:
        """Terraform's plan of terraform/local (its resources: the bridge, the apt proxy, a namespace per node),
        after the subnet and the base image up would use."""
        planned = super().plan(spec, scratch)
        recipe = image.default_recipe()
        built = "built already" if image.is_built(recipe) else "not built yet: up builds it first (mmdebstrap, ~30 s)"
        planned.creates[:0] = [
            f"subnet {subnet_for(spec)}" + (" (network.subnet auto: from the cluster name)"
                                           if spec.network.subnet == "auto" else ""),
            f"base image {image.rootfs(recipe)}: {built}"]
        for role in ROLES:
            if not spec.count(role):
                continue
            if spec.nodes[role].image == baked.BASE:
                planned.creates.append(f"{role} nodes: the bare base image (configure installs everything)")
            elif found := self.image_for(spec, role):
                planned.creates.append(f"{role} nodes: baked image {Path(found['dir']).name} (configure only checks)")
            else:
                planned.creates.append(f"{role} nodes: baked image {baked.local_inputs(spec).full_name}: not built "
                                       "yet: up bakes it first on one builder node")
        return planned

    def describe_change(self, after: dict) -> str:
        """The module's terraform_data resources by what their input makes (tfcluster.localnode, aptproxy)."""
        given = after.get("input") or {}
        if "netns" in given:
            memory = f", memory cgroup {given['cgroup']} ({given['memory_mb']} MiB)" if given.get("memory_mb") else ""
            return (f": network namespace {given['netns']} at {given['ip']}/{given['prefix_len']} (veth {given['veth']}"
                    f"), sshd as {given['ssh_user']}, overlay in {given['node_dir']}{memory}")
        if "gateway_cidr" in given:
            return f": bridge {given['bridge']} with address {given['gateway_cidr']}"
        if "listen_ip" in given:
            return (f": apt proxy http://{given['listen_ip']}:{given['port']}/ on the bridge, for {given['clients']}, "
                    f"forwarding {', '.join(given['allowed_hosts'])} only")
        return super().describe_change(after)

    def node_type(self, spec: RunSpec, role: str) -> str:
        memory = self.options_for(spec).node_memory_mb
        return "namespace" + (f", {memory} MiB" if memory else "")

    def exposure(self, spec: RunSpec) -> list[str]:
        bridge, subnet = localnode.bridge_name(spec.cluster), subnet_for(spec)
        return [f"nodes on bridge {bridge} ({subnet}) without a default route: SSH (22/tcp) and TensorFlow gRPC "
                f"({spec.network.tf_port}/tcp) answer on the bridge only, to this machine and the cluster's nodes "
                "(network.allowed_ssh_cidrs is not used on local)",
                f"the nodes reach the bridge (the cluster's apt proxy) and the S3 store at {store.store_addr()[0]}, "
                "nothing else"]

    def leftovers(self) -> list[str]:
        found = super().leftovers()
        cluster = self.state.cluster
        for ns in localnode.list_netns():
            if ns.startswith(localnode.netns_prefix(cluster)):
                pids = localnode.netns_pids(ns)
                found.append(f"network namespace {ns}" + (f" with processes {pids}" if pids else ""))
        br = localnode.bridge_name(cluster)
        localnode.remove_guard(br)
        if localnode.link_exists(br):
            found.append(f"bridge {br}")
        for link in localnode.list_links(localnode.veth_prefix(cluster)):
            found.append(f"veth {link}")
        if self.state.node_root.exists() and any(self.state.node_root.iterdir()):
            found.append(f"node directories under {self.state.node_root}")
        pid = aptproxy.running_pid(self.state.dir)
        if pid:
            found.append(f"apt proxy process {pid}")
        found += [f"memory cgroup {path}" for path in cgroup.leftovers(cluster)]
        return found

    def force_cleanup(self) -> None:
        """Remove what Terraform does not know about (an `up` interrupted before state was written)."""
        cluster = self.state.cluster
        for ns in localnode.list_netns():
            if ns.startswith(localnode.netns_prefix(cluster)):
                localnode.kill_netns_processes(ns)
                subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        cgroup.remove(cgroup.cluster_path(cluster))
        for link in localnode.list_links(localnode.veth_prefix(cluster)):
            subprocess.run(["ip", "link", "del", link], capture_output=True)
        br = localnode.bridge_name(cluster)
        localnode.remove_guard(br)
        if localnode.link_exists(br):
            subprocess.run(["ip", "link", "del", br], capture_output=True)
        if self.state.node_root.exists():
            shutil.rmtree(self.state.node_root, ignore_errors=True)
        aptproxy.stop({"state_dir": str(self.state.dir)})
