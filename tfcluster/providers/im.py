"""The ``im`` provider: nodes from an Infrastructure Manager (IM 2.x) through its REST API.

``up`` renders ``radl/cluster.radl.j2`` from the run's configuration (tfcluster/radl_render.py), submits it
to IM with ``contextualize ()`` (tfcluster configures the nodes with its own playbooks afterwards), waits
for IM to report the infrastructure configured, and reads each VM's addresses back. The infrastructure id
is recorded in ``.tfcluster/<cluster>/im.json`` *before* anything is created (with a random token that is
also in the RADL's description), so ``down`` works from state alone, also after an interrupted ``up``.

``adopt_local: "true"`` is for tests and laptops: local-provider nodes are created first and IM adopts
them through its ``DeployedNode`` connector (one system per node, naming its address, the base image's user and
the run's private key). The key text goes to IM in the request body only: neither the RADL nor a log
line holding it is ever written here. Cloud VMs IM creates get only the run's public key (IM installs it;
tfcluster configures them itself): the private key goes to IM only under ``adopt_local``.

The auth file (``auth_file``) has one credential per line, IM's own format, e.g.::

    id = im; type = InfrastructureManager; username = USER; password = PASS
    id = site; type = OpenStack; host = https://keystone:5000; username = U; password = P; tenant = T
    id = dn; type = DeployedNode

Its content is sent in the ``Authorization`` header and never printed.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import BeforeValidator, Field

from .. import poll, radl_render
from ..config import ROLES, Checked, RunSpec, matching_check, refuse, whole_number_check
from ..errors import ConfigError, ProvisionError, TfclusterError
from ..paths import ClusterState
from ..radl_render import (
    cloud_id_check,
    cpu_check,
    http_url_check,
    memory_check,
    optional_image_url_check,
)
from .base import VM_HALT_MARGIN_MINUTES, Node, Provider, ProviderOptions, ProviderPlan, register
from .local import LocalProvider

DEFAULT_TIMEOUT = 900
POLL_S = 2.0
#: the least time a request of a wait that is almost over is given (it is still asked once more)
MIN_REQUEST_S = 5.0
_URL_RE = re.compile(r"^https?://[A-Za-z0-9.\-\[\]:]+(:\d{1,5})?(/[A-Za-z0-9._~/-]*)?$")
_KEY_RE = re.compile(r"-----BEGIN[^-]*-----.*?-----END[^-]*-----", re.S)
_SYSTEM_RE = re.compile(r"^(ps|worker|chief)(?:_(\d+))?$")
#: IM states after which waiting is pointless
_FAILED = ("failed", "unconfigured", "deleting", "off", "stopped")


def _mask(text: str) -> str:
    """Whatever IM answers, keep key material out of messages."""
    return _KEY_RE.sub("<key>", text)


def _truthy(value) -> bool:
    text = str(value).lower()
    if text in ("true", "yes", "1"):
        return True
    if text in ("", "false", "no", "0"):
        return False
    refuse("true or false")


_LOOPBACK_HOSTS = ("localhost", "::1")


def _im_url(value):
    """IM's REST endpoint: https, or plain http only on this machine (the request carries IM's and the
    clouds' credentials)."""
    url = matching_check(_URL_RE, "an http(s)://host[:port][/path] URL", optional=True)(value).rstrip("/")
    host = urlsplit(url).hostname or ""
    if url.startswith("http://") and not (host in _LOOPBACK_HOSTS or host.startswith("127.")):
        refuse("an https:// URL (requests to IM carry IM's and the clouds' credentials), or http:// on this "
               "machine only (127.0.0.1, localhost)")
    return url


def _auth_file(value):
    """'' (not given) or an existing, readable file that only its owner may read, as its absolute path."""
    if value in (None, ""):
        return ""
    path = Path(str(value)).expanduser()
    if not path.is_file() or not os.access(path, os.R_OK):
        refuse("an existing, readable IM auth file")
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        refuse(f"an IM auth file only its owner can read (mode is {oct(mode)}: chmod 600 it; it holds IM's and "
               "the clouds' credentials)")
    return str(path.resolve())


_Cpu = Annotated[int, BeforeValidator(cpu_check)]
_Memory = Checked(memory_check)


class ImOptions(ProviderOptions):
    """provider_options on im: IM's endpoint and credentials, and what the RADL document reads."""

    im_url: Checked(_im_url) | None = Field(
        None, description="IM REST endpoint, e.g. https://im.example.org:8800 (required)")
    auth_file: Checked(_auth_file) | None = Field(
        None, description="IM auth file, one credential per line (required; must exist and be readable; its "
                          "content is sent to IM only, never logged)")
    adopt_local: Annotated[bool, BeforeValidator(_truthy)] = Field(
        False, description="'true': create local-provider nodes first and let IM adopt them (DeployedNode), for "
                           "tests and laptops; the auth file then needs a 'type = DeployedNode' line")
    timeout: Annotated[int, BeforeValidator(whole_number_check(10, 86400, "seconds, an integer from 10 to 86400"))] \
        = Field(DEFAULT_TIMEOUT, description="seconds to wait for IM to report the infrastructure configured "
                                             f"(default {DEFAULT_TIMEOUT})")
    image_url: Checked(optional_image_url_check) | None = Field(
        None, description="disk.0.image.url of every node whose nodes.<role>.image is '' (e.g. ost://site/ID, "
                          "one://server/ID, aws://region/ami-ID)")
    cpu: _Cpu = Field(radl_render.DEFAULT_CPU, description=f"minimum vCPUs of every node (default "
                                                             f"{radl_render.DEFAULT_CPU})")
    memory: _Memory = Field(radl_render.DEFAULT_MEMORY, description="minimum memory of every node, an integer with "
                            f"a unit such as 4096M or 8G (default {radl_render.DEFAULT_MEMORY})")
    ps_cpu: _Cpu | None = Field(None, description="minimum vCPUs of the ps nodes (default: cpu)")
    worker_cpu: _Cpu | None = Field(None, description="minimum vCPUs of the worker nodes (default: cpu)")
    chief_cpu: _Cpu | None = Field(None, description="minimum vCPUs of the chief nodes (default: cpu)")
    ps_memory: _Memory | None = Field(None, description="minimum memory of the ps nodes (default: memory)")
    worker_memory: _Memory | None = Field(None, description="minimum memory of the worker nodes (default: memory)")
    chief_memory: _Memory | None = Field(None, description="minimum memory of the chief nodes (default: memory)")
    cloud_id: Checked(cloud_id_check) | None = Field(
        None, description="the id of the auth-file line to deploy to (deploy <system> <n> <cloud_id>); '' lets IM "
                          "choose")
    roles_url: Checked(http_url_check) | None = Field(
        None, description="for IM's own contextualization: base http(s) URL serving common.tar.gz, "
                          "tensorflow.tar.gz and tf_node.tar.gz (the roles/ of this repository)")
    wheelhouse_url: Checked(http_url_check) | None = Field(
        None, description="for IM's own contextualization: URL the nodes read the TensorFlow wheelhouse from "
                          "('' = each node installs from its package index)")

    def cpu_of(self, role: str) -> int:
        return getattr(self, f"{role}_cpu") or self.cpu

    def memory_of(self, role: str) -> str:
        return getattr(self, f"{role}_memory") or self.memory


def auth_types(path: Path) -> list[str]:
    """The credential types an auth file names (read only to check it; values are never returned)."""
    text = path.read_text()
    try:
        data = json.loads(text)
        return [str(d.get("type", "")) for d in data if isinstance(d, dict)]
    except ValueError:
        pass
    types = []
    for line in text.splitlines():
        m = re.search(r"(?:^|;)\s*type\s*=\s*['\"]?([A-Za-z]+)", line)
        if m and not line.lstrip().startswith("#"):
            types.append(m.group(1))
    return types


def auth_ids(path: Path, kind: str) -> list[str]:
    """The ids of the auth file's lines of one type."""
    ids = []
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#") or not re.search(rf"(?:^|;)\s*type\s*=\s*['\"]?{kind}\b", line):
            continue
        m = re.search(r"(?:^|;)\s*id\s*=\s*['\"]?([A-Za-z0-9_.-]+)", line)
        if m:
            ids.append(m.group(1))
    return ids


def keystone_v2_ids(path: Path) -> list[str]:
    """Ids of OpenStack lines that would authenticate with Keystone v2.0 (IM's default when a line names no
    ``auth_version``), which Keystone removed in Queens. Only the auth_version key is read, no secret."""
    bad = []
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("#") or not re.search(r"(?:^|;)\s*type\s*=\s*['\"]?OpenStack\b", line):
            continue
        m = re.search(r"(?:^|;)\s*auth_version\s*=\s*['\"]?([A-Za-z0-9_.]+)", line)
        if not m or m.group(1).lower().startswith("2"):
            ident = re.search(r"(?:^|;)\s*id\s*=\s*['\"]?([A-Za-z0-9_.-]+)", line)
            bad.append(ident.group(1) if ident else "(no id)")
    return bad


def auth_header(path: Path) -> str:
    """IM's Authorization header for an auth file: lines joined by a literal backslash-n.

    ``file(PATH)`` values are read here, on the client (as im_client does), not by the server.
    """
    text = path.read_text()
    try:
        data = json.loads(text)
        return json.dumps(data)  # IM accepts one JSON line too
    except ValueError:
        pass
    lines = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue

        def _file(m: re.Match) -> str:
            content = (path.parent / Path(m.group(1)).expanduser()).read_text()
            return content.replace("\n", "\\\\n")

        lines.append(re.sub(r"file\(([^)]+)\)", _file, line))
    return "\\n".join(lines)


class ImClient:
    """The few IM REST calls tfcluster needs (requests; auth header from the auth file)."""

    def __init__(self, url: str, auth_file: Path, timeout: float = 120.0):
        import requests

        self.url = url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers.update({"Authorization": auth_header(auth_file), "Accept": "application/json"})

    def _call(self, method: str, path: str, ok=(200,), **kwargs):
        import requests

        try:
            resp = self.session.request(method, f"{self.url}{path}", timeout=kwargs.pop("timeout", self.timeout),
                                        **kwargs)
        except requests.RequestException as exc:
            raise ProvisionError(f"IM at {self.url} did not answer {method} {path}: "
                                 f"{exc.__class__.__name__}") from None
        if resp.status_code not in ok:
            try:
                msg = resp.json().get("message", resp.text)
            except ValueError:
                msg = resp.text
            raise ProvisionError(f"IM at {self.url}: {method} {path}: HTTP {resp.status_code}: "
                                 f"{_mask(str(msg))[:800]}")
        return resp

    def version(self) -> str:
        resp = self._call("GET", "/version")
        try:
            return str(resp.json().get("version", resp.text.strip()))
        except ValueError:
            return resp.text.strip()

    def create(self, radl: str) -> str:
        resp = self._call("POST", "/infrastructures", params={"async": "true"}, data=radl.encode(),
                          headers={"Content-Type": "text/plain"})
        inf_id = resp.headers.get("InfID") or resp.json()["uri"].rstrip("/").rsplit("/", 1)[-1]
        return inf_id

    def list_ids(self) -> list[str]:
        body = self._call("GET", "/infrastructures").json()
        return [u["uri"].rstrip("/").rsplit("/", 1)[-1] for u in body.get("uri-list", [])]

    def state(self, inf_id: str) -> dict:
        return self._call("GET", f"/infrastructures/{inf_id}/state").json()["state"]

    def vm_ids(self, inf_id: str) -> list[str]:
        body = self._call("GET", f"/infrastructures/{inf_id}").json()
        return [u["uri"].rstrip("/").rsplit("/", 1)[-1] for u in body.get("uri-list", [])]

    def vm_info(self, inf_id: str, vm_id: str) -> list[dict]:
        return self._call("GET", f"/infrastructures/{inf_id}/vms/{vm_id}").json()["radl"]

    def contmsg(self, inf_id: str) -> str:
        body = self._call("GET", f"/infrastructures/{inf_id}/contmsg").json()
        return _mask(str(body.get("contmsg", "")))

    def radl(self, inf_id: str) -> str:
        return self._call("GET", f"/infrastructures/{inf_id}/radl", headers={"Accept": "text/plain"}).text

    def destroy(self, inf_id: str, timeout: float, on_wait=None) -> bool:
        """Destroy an infrastructure; False when IM does not know it (already gone).  IM refuses (HTTP 409)
        while it still adds the resources of an asynchronous create (launching the VMs: minutes on a cloud),
        which is where a ``down`` right after an interrupted ``up`` finds it: asked again every
        :data:`POLL_S` until ``timeout`` (``on_wait()`` is called once, for a progress line).  ``timeout`` is
        the whole wait's: each request may take what is left of it (IM answers a DELETE once it has destroyed
        the VMs), never a fresh ``timeout`` of its own."""
        codes: list[int] = []
        deadline = time.monotonic() + timeout

        def answered() -> bool:
            left = max(MIN_REQUEST_S, deadline - time.monotonic())
            codes.append(self._call("DELETE", f"/infrastructures/{inf_id}", ok=(200, 404, 409),
                                    timeout=left).status_code)
            if codes == [409] and on_wait:
                on_wait()
            return codes[-1] != 409

        if not poll.wait_until(answered, timeout, POLL_S):
            raise ProvisionError(f"IM at {self.url}: DELETE /infrastructures/{inf_id}: HTTP 409 for "
                                 f"{timeout:.0f}s: IM was still adding its resources (run down again)")
        return codes[-1] == 200


#: how long an infrastructure IM lists with an empty RADL is read again before it is judged not ours
RADL_FILL_WAIT_S = 10.0


def _filled_radl(client: ImClient, inf_id: str) -> str:
    """The infrastructure's RADL. An asynchronous create (as ``up`` makes) lists the infrastructure at once
    with an empty RADL, and fills it in a thread of IM's a moment later: an ``up`` interrupted right after
    its create, then ``down`` (or ``leftovers``) searching by token at once, read it empty under load (a CI
    run's IM test) and would have left the infrastructure, its VMs included. An empty one is read again
    until it fills or :data:`RADL_FILL_WAIT_S` passes."""
    texts: list[str] = []

    def filled() -> bool:
        texts.append(client.radl(inf_id))
        return bool(texts[-1].strip())

    poll.wait_until(filled, RADL_FILL_WAIT_S, interval=0.2)
    return texts[-1]


def nodes_from_vms(cluster: str, vms: list[tuple[str, list[dict]]], gpus: dict[str, int]) -> list[Node]:
    """Node records from IM's VM descriptions: ``[(vm_id, radl_json)]`` -> nodes named <cluster>-<role>-<i>.

    A system ``ps`` (cloud) numbers its VMs by IM's VM id; a system ``ps_3`` (an adopted node) is index 3.
    """
    by_role: dict[str, list[tuple[tuple[int, int], dict]]] = {r: [] for r in ROLES}
    for vm_id, radl in vms:
        nets = {d["id"]: str(d.get("outbound", "no")).lower() == "yes" for d in radl if d.get("class") == "network"}
        system = next((d for d in radl if d.get("class") == "system"), None)
        if system is None:
            raise ProvisionError(f"IM VM {vm_id} has no system description")
        m = _SYSTEM_RE.fullmatch(str(system.get("id", "")))
        if not m:
            raise ProvisionError(f"IM VM {vm_id} belongs to system {system.get('id')!r}, not one of this cluster's")
        public = private = ""
        i = 0
        while f"net_interface.{i}.connection" in system:
            ip = str(system.get(f"net_interface.{i}.ip") or "")
            if ip and nets.get(system[f"net_interface.{i}.connection"]):
                public = public or ip
            elif ip:
                private = private or ip
            i += 1
        if not (public or private):
            raise ProvisionError(f"IM VM {vm_id} ({system['id']}) has no address yet")
        rec = {"private_ip": private or public, "public_ip": public or private,
               "ssh_user": str(system.get("disk.0.os.credentials.username") or "root"), "ssh_port": 22}
        order = (int(m.group(2)) if m.group(2) is not None else 0, int(vm_id) if vm_id.isdigit() else 0)
        by_role[m.group(1)].append((order, rec))
    nodes = []
    for role in ROLES:
        for index, (_, rec) in enumerate(sorted(by_role[role], key=lambda x: x[0])):
            nodes.append(Node(name=f"{cluster}-{role}-{index}", role=role, index=index, gpus=gpus.get(role, 0),
                              **rec))
    return nodes


def _local_spec(spec: RunSpec) -> RunSpec:
    """The same cluster on the local provider (the nodes IM adopts)."""
    return spec.model_copy(update={"provider": "local", "provider_options": {}})


class _ImWatch:
    """One look at an infrastructure per call: prints its state when it changed (or every 30 s); True once
    IM reports it configured; a failed state raises with IM's contextualization messages."""

    def __init__(self, client: ImClient, inf_id: str):
        self.client, self.inf_id = client, inf_id
        self.start, self.last, self.last_print, self.state = time.monotonic(), "", 0.0, "unknown"

    def __call__(self) -> bool:
        st = self.client.state(self.inf_id)
        self.state = st.get("state", "unknown")
        counts: dict[str, int] = {}
        for vm_state in (st.get("vm_states") or {}).values():
            counts[vm_state] = counts.get(vm_state, 0) + 1
        line = f"IM infrastructure {self.inf_id}: {self.state}; VMs: " + \
            (", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "none yet")
        elapsed = time.monotonic() - self.start
        if line != self.last or elapsed - self.last_print >= 30:
            print(f"  {line} ({elapsed:.0f}s)", flush=True)
            self.last, self.last_print = line, elapsed
        if self.state in _FAILED:
            msg = self.client.contmsg(self.inf_id).strip().splitlines()[-15:]
            raise ProvisionError(f"IM infrastructure {self.inf_id} is {self.state}:\n  " + "\n  ".join(msg))
        return self.state == "configured"


def credentials_for_im(user: str, public_key: str, private_key: str,
                       adopted: list[radl_render.AdoptedNode] | None) -> radl_render.Credentials:
    """What IM is told about SSH: the user and the run's public key (the cloud VMs it creates get it through
    cloud-init, as IM does when a public key is given); the private key only for nodes IM adopts
    (``adopt_local``), whose access it checks. For cloud VMs IM has no use for it: tfcluster configures them
    itself (the RADL's contextualize is empty)."""
    return radl_render.Credentials(user, public_key, private_key if adopted else "")


@register
class ImProvider(Provider):
    name = "im"
    gone = ("IM no longer lists its infrastructure (with adopt_local, no local node, namespace, bridge or node "
            "process remains either)")
    options_model = ImOptions

    @classmethod
    def uses_cloud_nodes(cls, spec: RunSpec) -> bool:
        """Unless IM adopts local nodes (``adopt_local``; read before the options are checked)."""
        return str(spec.provider_options.get("adopt_local", "")).lower() not in ("true", "yes", "1")

    def __init__(self, state: ClusterState):
        super().__init__(state)
        self.record_path = state.dir / "im.json"

    # -- settings ---------------------------------------------------------------------------------
    def settings(self, spec: RunSpec) -> ImOptions:
        """The options, with what talking to IM needs (its URL and an auth file; rendering RADL needs neither)."""
        opts = self.options_for(spec)
        if not opts.im_url:
            raise ConfigError("provider_options.im_url", opts.im_url or "",
                              "the IM REST endpoint, e.g. http://127.0.0.1:8800")
        if not opts.auth_file:
            raise ConfigError("provider_options.auth_file", opts.auth_file or "", "the path of an IM auth file")
        return opts

    def check(self, spec: RunSpec) -> None:
        super().check(spec)
        opts = self.settings(spec)
        path = Path(opts.auth_file)
        types = auth_types(path)
        if "InfrastructureManager" not in types:
            raise ConfigError("provider_options.auth_file", str(path),
                              "an auth file with a 'type = InfrastructureManager' line (IM's own credentials)")
        v2 = keystone_v2_ids(path)
        if v2:
            raise ConfigError("provider_options.auth_file", str(path),
                              f"OpenStack lines with auth_version = 3.x_password and a domain (line id {v2[0]} names "
                              "none or 2.0: IM then speaks Keystone v2.0, which Keystone removed in Queens), e.g. "
                              "'id = site; type = OpenStack; host = https://keystone.example.org:5000; username = U; "
                              "password = P; tenant = PROJECT; domain = Default; auth_version = 3.x_password'")
        if opts.adopt_local:
            if "DeployedNode" not in types:
                raise ConfigError("provider_options.auth_file", str(path),
                                  "an auth file with a 'type = DeployedNode' line (adopt_local)")
            LocalProvider(self.state).check(_local_spec(spec))  # gpus, subnet: local nodes' rules
            placeholder = [radl_render.AdoptedNode(f"{spec.cluster}-{r}-{i}", r, i, f"192.0.2.{n + 1}")
                           for n, (r, i) in enumerate((r, i) for r in ROLES for i in range(spec.count(r)))]
            radl_render.render(spec, adopted=placeholder, credentials=radl_render.Credentials("root"))
        else:
            if not spec.network.allowed_ssh_cidrs:
                raise ConfigError("network.allowed_ssh_cidrs", [], "at least one IPv4 CIDR that may reach SSH on "
                                  "provider im (e.g. this controller's public address/32): nothing is open by default")
            user = spec.ssh.user or radl_render.DEFAULT_CLOUD_USER
            radl_render.render(spec, credentials=radl_render.Credentials(user))

    # -- state ------------------------------------------------------------------------------------
    def _record(self) -> dict:
        try:
            return json.loads(self.record_path.read_text())
        except (OSError, ValueError):
            return {}

    def _write_record(self, rec: dict) -> None:
        self.state.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.record_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(rec, indent=2) + "\n")
        tmp.replace(self.record_path)

    def _spec_options(self) -> dict:
        try:
            return json.loads(self.state.spec.read_text()).get("provider_options", {})
        except (OSError, ValueError, AttributeError):
            return {}

    def _adopt_local(self) -> bool:
        rec = self._record()
        if "adopt_local" in rec:
            return bool(rec["adopt_local"])
        opts = self._spec_options()
        if "adopt_local" in opts:
            return str(opts["adopt_local"]).lower() in ("true", "yes", "1")
        return self.state.terraform_dir.exists() or self.state.node_root.exists()

    def _client(self, rec: dict) -> ImClient:
        try:
            return ImClient(rec["im_url"], Path(rec["auth_file"]))
        except (OSError, KeyError) as exc:
            raise ProvisionError(f"cannot talk to IM for {self.record_path}: {exc.__class__.__name__}: "
                                 f"{exc}") from None

    # -- lifecycle --------------------------------------------------------------------------------
    def up(self, spec: RunSpec, public_key: str) -> list[Node]:
        s = self.settings(spec)
        client = ImClient(s.im_url, Path(s.auth_file))
        say(f"IM {client.version()} at {s.im_url}")
        local_nodes = LocalProvider(self.state).up(_local_spec(spec), public_key) if s.adopt_local else None
        adopted, user, options = self._adoption(spec, s, local_nodes)
        private_key = self.state.ssh_key.read_text()
        if not private_key.endswith("\n"):
            private_key += "\n"
        rec = self._record()
        if rec.get("inf_id") and self._reusable(client, rec, spec):
            say(f"IM infrastructure {rec['inf_id']} already provides this cluster")
            return self._wait_and_read(client, rec["inf_id"], spec, s.timeout, adopted)
        if rec.get("inf_id") or rec.get("token"):
            self.down_im(quiet=True)
        token = secrets.token_hex(8)
        radl = radl_render.render(spec, options, adopted=adopted, token=token,
                                  credentials=credentials_for_im(user, public_key, private_key, adopted))
        rec = {"cluster": spec.cluster, "im_url": s.im_url, "auth_file": s.auth_file,
               "adopt_local": s.adopt_local, "timeout": s.timeout, "token": token, "inf_id": None,
               "created": time.time()}
        self._write_record(rec)  # before IM creates anything: down can find it by its token
        inf_id = client.create(radl)
        del radl, private_key
        rec["inf_id"] = inf_id
        self._write_record(rec)
        say(f"IM infrastructure {inf_id}: submitted, {spec.node_total} nodes"
            + (" (adopting the local nodes)" if adopted else ""))
        return self._wait_and_read(client, inf_id, spec, s.timeout, adopted)

    @staticmethod
    def _adoption(spec: RunSpec, s: ImOptions, local_nodes: list[Node] | None
                  ) -> tuple[list[radl_render.AdoptedNode] | None, str, dict]:
        """What the RADL is rendered from besides the spec: the nodes IM adopts (adopt_local: the local
        nodes), the user IM logs in as, and the options (adopted systems go to the DeployedNode credential)."""
        options = dict(spec.provider_options)
        if local_nodes is None:
            return None, spec.ssh.user or radl_render.DEFAULT_CLOUD_USER, options
        adopted = [radl_render.AdoptedNode(n.name, n.role, n.index, n.private_ip) for n in local_nodes]
        # the adopted systems go to the DeployedNode credential, whatever else the auth file holds
        options.setdefault("cloud_id", (auth_ids(Path(s.auth_file), "DeployedNode") or [""])[0])
        return adopted, local_nodes[0].ssh_user, options  # the base image's user (sudo), as on a cloud image

    # -- plan -------------------------------------------------------------------------------------------
    def plan(self, spec: RunSpec, scratch: ClusterState) -> ProviderPlan:
        """The RADL ``up`` would submit, rendered as up renders it (scratch's keys stand in for the run's and
        are elided), with the local nodes' plan first under adopt_local. IM is not contacted."""
        s = self.settings(spec)
        local = LocalProvider(self.state).plan(_local_spec(spec), scratch) if s.adopt_local else None
        adopted, user, options = self._adoption(spec, s, local.known if local else None)
        public_key = scratch.ssh_key.with_suffix(".pub").read_text().strip()
        radl = radl_render.render(spec, options, adopted=adopted, credentials=credentials_for_im(
            user, public_key, scratch.ssh_key.read_text(), adopted))
        shown = _mask(radl).replace(public_key, "<the run's public key>")
        lines = [f"IM at {s.im_url}: not contacted; up submits the RADL below to it and waits up to {s.timeout}s "
                 "for the infrastructure to be configured"]
        if self._record().get("inf_id"):
            lines.append(f"recorded IM infrastructure {self._record()['inf_id']}: up reuses it if IM still lists it "
                         "with these nodes, else destroys it and submits the RADL below")
        if local:
            lines += ["the local nodes IM adopts (DeployedNode), made first:", *(f"  {line}" for line in local.creates)]
        lines.append("RADL (the run's SSH keys elided as <key> and <the run's public key>; up adds tfcluster_token, "
                     "a random id naming this run's infrastructure):")
        lines += [f"  {line}".rstrip() for line in shown.splitlines()]
        return ProviderPlan(local.nodes if local else self.plan_nodes(spec), lines, local.known if local else [])

    def node_type(self, spec: RunSpec, role: str) -> str:
        opts = self.options_for(spec)
        return spec.nodes[role].instance_type or f"any with >= {opts.cpu_of(role)} vCPUs, >= {opts.memory_of(role)}"

    def node_image(self, spec: RunSpec, role: str) -> str:
        return spec.nodes[role].image or self.options_for(spec).image_url or ""

    def exposure(self, spec: RunSpec) -> list[str]:
        if self.options_for(spec).adopt_local:
            return LocalProvider(self.state).exposure(_local_spec(spec))
        cidrs = ", ".join(spec.network.allowed_ssh_cidrs)
        return [f"public network: SSH (22/tcp) from {cidrs} only (RADL outports "
                f"{radl_render.outports(spec.network.allowed_ssh_cidrs)})",
                f"private network (no outbound): TensorFlow gRPC ({spec.network.tf_port}/tcp, no authentication) "
                "between the cluster's nodes only; it is not opened on the public network"]

    def _reusable(self, client: ImClient, rec: dict, spec: RunSpec) -> bool:
        try:
            if rec["inf_id"] not in client.list_ids():
                return False
            return len(client.vm_ids(rec["inf_id"])) == spec.node_total and rec.get("adopt_local") == \
                self.options_for(spec).adopt_local
        except ProvisionError:
            return False

    def _wait_and_read(self, client: ImClient, inf_id: str, spec: RunSpec, timeout: int,
                       adopted: list[radl_render.AdoptedNode] | None) -> list[Node]:
        watch = _ImWatch(client, inf_id)
        if not poll.wait_until(watch, timeout, POLL_S):
            raise ProvisionError(f"IM infrastructure {inf_id} not configured after {timeout}s (state {watch.state}); "
                                 f"see 'im_client getcontmsg {inf_id}'")
        vms = [(vm_id, client.vm_info(inf_id, vm_id)) for vm_id in client.vm_ids(inf_id)]
        nodes = nodes_from_vms(spec.cluster, vms, {r: spec.nodes[r].gpus for r in ROLES})
        want = {r: spec.count(r) for r in ROLES}
        got = {r: sum(1 for n in nodes if n.role == r) for r in ROLES}
        if got != want:
            raise ProvisionError(f"IM infrastructure {inf_id} has {got} nodes per role; the configuration asks "
                                 f"for {want}")
        if adopted:
            wanted = {(a.role, a.index): a.ip for a in adopted}
            for n in nodes:
                if wanted.get((n.role, n.index)) != n.private_ip:
                    raise ProvisionError(f"IM reports {n.name} at {n.private_ip}; the adopted node is at "
                                         f"{wanted.get((n.role, n.index))}")
        rec = self._record()
        rec["vms"] = {vm_id: n.name for (vm_id, _), n in zip(vms, nodes, strict=False)}
        self._write_record(rec)
        return nodes

    def _find_by_token(self, client: ImClient, token: str, cluster: str) -> list[str]:
        """Infrastructures of this IM user whose RADL carries this state's token (an interrupted up)."""
        found = []
        for inf_id in client.list_ids():
            try:
                text = _filled_radl(client, inf_id)
            except ProvisionError:
                continue
            if f"tfcluster_token = '{token}'" in text and f"tfcluster_cluster = '{cluster}'" in text:
                found.append(inf_id)
        return found

    def down_im(self, quiet: bool = False) -> None:
        """Destroy the recorded IM infrastructure (or the one the token finds); forget it once IM has."""
        rec = self._record()
        if not rec:
            return
        client = self._client(rec)
        ids = [rec["inf_id"]] if rec.get("inf_id") else \
            self._find_by_token(client, rec.get("token", ""), rec.get("cluster", self.state.cluster))
        for inf_id in ids:
            start = time.monotonic()
            gone_already = not client.destroy(
                inf_id, timeout=max(self._timeout(rec), 60),
                on_wait=None if quiet else lambda i=inf_id: say(f"IM infrastructure {i}: IM is still adding its "
                                                                "resources; destroying it once it has"))
            if not quiet:
                say(f"IM infrastructure {inf_id}: " + ("already gone" if gone_already else
                                                        f"destroyed in {time.monotonic() - start:.1f}s"))
        still = [i for i in ids if i in client.list_ids()]
        if still:
            raise ProvisionError(f"IM still lists infrastructure {', '.join(still)} after destroy")
        self.record_path.unlink(missing_ok=True)

    @staticmethod
    def _timeout(rec: dict) -> int:
        return int(rec.get("timeout", DEFAULT_TIMEOUT))

    def down(self) -> None:
        adopt = self._adopt_local()
        errors = []
        try:
            self.down_im()
        except TfclusterError as exc:
            errors.append(str(exc))
        if adopt:
            try:
                LocalProvider(self.state).down()
            except TfclusterError as exc:
                errors.append(str(exc))
        if errors:
            raise ProvisionError("; ".join(errors))

    def force_cleanup(self) -> None:
        if self._record():
            try:
                self.down_im(quiet=True)
            except TfclusterError:
                pass  # leftovers() reports it
        if self._adopt_local():
            LocalProvider(self.state).force_cleanup()

    def leftovers(self) -> list[str]:
        found = []
        rec = self._record()
        if rec:
            what = f"IM infrastructure {rec.get('inf_id') or '(id not recorded, token ' + rec.get('token', '?') + ')'}"
            try:
                client = self._client(rec)
                if rec.get("inf_id"):
                    if rec["inf_id"] in client.list_ids():
                        found.append(f"{what} still listed by IM at {rec['im_url']}")
                elif self._find_by_token(client, rec.get("token", ""), rec.get("cluster", self.state.cluster)):
                    found.append(f"{what} still listed by IM at {rec['im_url']}")
            except TfclusterError as exc:
                found.append(f"{what} recorded in {self.record_path}; IM could not be asked: {exc}")
        if self._adopt_local():
            found += LocalProvider(self.state).leftovers()
        return found

    def wheelhouse_host(self, spec: RunSpec) -> str | None:
        if self.options_for(spec).adopt_local:
            return LocalProvider(self.state).wheelhouse_host(_local_spec(spec))
        # Cloud nodes have a route to a package index: offline_nodes() is False, so tfcluster gives the
        # tensorflow role tensorflow_source "index" and prepares no wheelhouse at all (the image's Python
        # may differ from the controller's, for which the wheelhouse would be downloaded).
        return None

    def vm_halt_minutes(self, spec: RunSpec) -> int:
        """Cloud VMs halt after the run's deadline plus the margin; adopted local nodes never (shared kernel)."""
        if self.options_for(spec).adopt_local:
            return 0
        return spec.max_runtime_minutes + VM_HALT_MARGIN_MINUTES


def say(msg: str) -> None:
    print(f"==> {msg}", flush=True)
