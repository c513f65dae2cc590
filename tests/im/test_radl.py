"""RADL rendering: cluster shapes pass the radl parser's parse and check(); bad values stop before IM."""

from __future__ import annotations

import re
import subprocess

import pytest
import requests
import yaml
from radl.radl_parse import parse_radl

from tests.conftest import PYTHON, REPO, run_cli
from tfcluster import radl_render
from tfcluster.config import resolve
from tfcluster.errors import ConfigError, ProvisionError
from tfcluster.paths import ClusterState
from tfcluster.providers.im import ImProvider, auth_header, nodes_from_vms

IMAGE = "ost://cloud.example.org:5000/3f1c-image"


def spec_for(ps=1, workers=1, chief=1, gpus=(0, 0, 0), **extra):
    options = {"im_url": "http://127.0.0.1:9", "image_url": IMAGE}
    options.update(extra.pop("options", {}))
    values = {"cluster": "tfct-im", "provider": "im", "provider_options": options,
              "nodes.ps.count": ps, "nodes.worker.count": workers, "nodes.chief.count": chief,
              "nodes.ps.gpus": gpus[0], "nodes.worker.gpus": gpus[1], "nodes.chief.gpus": gpus[2],
              "network.allowed_ssh_cidrs": ["203.0.113.0/24"], "storage.bucket": "my-team-runs"}
    values.update(extra)
    return resolve(overrides=values)


def deploys(parsed) -> dict[str, int]:
    return {d.id: d.vm_number for d in parsed.deploys}


@pytest.mark.parametrize("shape,gpus", [((1, 1, 1), (0, 0, 0)), ((2, 4, 1), (0, 0, 0)), ((1, 2, 1), (0, 1, 2))])
def test_cluster_shapes_parse_and_check(shape, gpus):
    spec = spec_for(*shape, gpus=gpus)
    text = radl_render.render(spec, credentials=radl_render.Credentials("cloudadm"))
    parsed = parse_radl(text)
    assert parsed.check()
    assert deploys(parsed) == dict(zip(("ps", "worker", "chief"), shape, strict=True))
    assert {s.name for s in parsed.systems} == {"ps", "worker", "chief"}
    assert parsed.description.getValue("tfcluster_cluster") == "tfct-im"
    for role, n_gpus in zip(("ps", "worker", "chief"), gpus, strict=True):
        system = parsed.get_system_by_name(role)
        assert system.getValue("disk.0.image.url") == IMAGE
        assert system.getValue("net_interface.0.connection") == "public"
        assert system.getValue("net_interface.1.connection") == "private"
        if n_gpus:
            assert system.getFeature("gpu.count").value == n_gpus
            assert system.getValue("gpu.vendor") == "NVIDIA"
        else:
            assert system.getFeature("gpu.count") is None
    # the public network opens SSH only, and only to the configured sources; the private one is internal
    public, private = parsed.get_network_by_id("public"), parsed.get_network_by_id("private")
    assert public.isPublic() and not private.isPublic()
    ports = public.getOutPorts()
    assert [(p.port_init, p.port_end, p.protocol, p.range, p.remote_cidr) for p in ports] == [
        (22, 22, "tcp", False, "203.0.113.0/24")]
    assert public.getValue("outports") == "203.0.113.0/24-22/tcp-22/tcp"
    # tfcluster's own mode: IM only provides nodes
    assert parsed.contextualize.items == {}
    # configure sections only apply the project's roles (gpu_driver on GPU roles)
    for role, n_gpus in zip(("ps", "worker", "chief"), gpus, strict=True):
        recipe = parsed.get_configure_by_name(role).recipes
        expected = ["common", "gpu_driver", "tensorflow", "tf_node"] if n_gpus else ["common", "tensorflow", "tf_node"]
        assert re.findall(r"- role: (\S+)", recipe) == expected
        assert "tasks:" not in recipe
        assert f"tf_role: {role}" in recipe


def test_gpu_role_gets_its_gpu_count_and_the_role_chooses_the_package():
    """The package rule has one home (the tensorflow role's vars): the RADL passes the GPU count only."""
    text = radl_render.render(spec_for(gpus=(0, 1, 0)), contextualize="im")
    parsed = parse_radl(text)
    assert "tf_gpus: 1\n" in parsed.get_configure_by_name("worker").recipes
    assert "tf_gpus: 0\n" in parsed.get_configure_by_name("ps").recipes
    assert "tensorflow_package" not in text


def test_im_contextualize_mode_applies_one_configure_per_role():
    spec = spec_for(2, 3, 1, options={"roles_url": "https://example.org/tfcluster-roles",
                                      "wheelhouse_url": "https://example.org/wheels/"})
    parsed = parse_radl(radl_render.render(spec, contextualize="im"))
    assert parsed.check()
    items = parsed.contextualize.items
    assert sorted((i.system, i.configure) for i in items.values()) == [
        ("chief", "chief"), ("ps", "ps"), ("worker", "worker")]
    worker = str(parsed.get_system_by_name("worker"))
    for role in ("common", "tensorflow", "tf_node"):
        assert f"ansible.roles.https://example.org/tfcluster-roles/{role}.tar.gz|{role}" in worker
    assert "tensorflow_wheelhouse_url: 'https://example.org/wheels'" in parsed.get_configure_by_name("ps").recipes


def test_images_come_from_the_configuration_only():
    template = (radl_render.RADL_DIR / radl_render.TEMPLATE).read_text()
    assert not re.search(r"(ost|one|aws|gce|azr|docker)://", template), "a literal image id in the template"
    per_role = spec_for(**{"nodes.worker.image": "one://one.example.org/42"})
    parsed = parse_radl(radl_render.render(per_role))
    assert parsed.get_system_by_name("worker").getValue("disk.0.image.url") == "one://one.example.org/42"
    assert parsed.get_system_by_name("ps").getValue("disk.0.image.url") == IMAGE
    sized = spec_for(options={"memory": "8G", "worker_memory": "16384M", "cpu": "4", "chief_cpu": "8"},
                     **{"nodes.worker.instance_type": "m5.xlarge"})
    parsed = parse_radl(radl_render.render(sized))
    w, c = parsed.get_system_by_name("worker"), parsed.get_system_by_name("chief")
    assert (w.getFeature("memory.size").value, w.getFeature("memory.size").unit) == (16384, "M")
    assert w.getValue("instance_type") == "m5.xlarge"
    assert c.getFeature("cpu.count").value == 8 and c.getFeature("memory.size").unit == "G"


def test_adopted_nodes_carry_address_user_and_key(ssh_keypair):
    private, public = ssh_keypair
    spec = spec_for(1, 2, 1, options={"image_url": ""})
    nodes = [radl_render.AdoptedNode(f"tfct-im-{r}-{i}", r, i, f"10.231.77.{11 + n}")
             for n, (r, i) in enumerate([("ps", 0), ("worker", 0), ("worker", 1), ("chief", 0)])]
    text = radl_render.render(spec, adopted=nodes, token="0123abcd0123abcd",
                              credentials=radl_render.Credentials("root", public, private))
    parsed = parse_radl(text)
    assert parsed.check()
    assert deploys(parsed) == {"ps_0": 1, "worker_0": 1, "worker_1": 1, "chief_0": 1}
    w1 = parsed.get_system_by_name("worker_1")
    assert w1.getValue("net_interface.0.ip") == "10.231.77.13"
    assert w1.getValue("net_interface.0.connection") == "private"
    assert w1.getValue("disk.0.os.credentials.username") == "root"
    assert w1.getValue("disk.0.os.credentials.private_key") == private and private.endswith("\n")
    assert w1.getValue("disk.0.image.url").startswith("local://tfct-im/")
    assert parsed.description.getValue("tfcluster_token") == "0123abcd0123abcd"
    assert parsed.contextualize.items == {}
    assert "tfct-im-worker-1" not in repr(radl_render.Credentials("root", public, private))


@pytest.mark.parametrize("field,values,expected_field", [
    ("provider_options.image_url", {"provider_options": {"image_url": "ost://site/1' and cpu.count = 64 and x = '"}},
     "provider_options.image_url"),
    ("nodes.worker.image", {"nodes.worker.image": "ost://site/image id"}, "nodes.worker.image"),
    ("provider_options.memory", {"provider_options": {"memory": "lots"}}, "provider_options.memory"),
    ("provider_options.worker_memory", {"provider_options": {"worker_memory": "8 potatoes"}},
     "provider_options.worker_memory"),
    ("provider_options.cpu", {"provider_options": {"cpu": "two"}}, "provider_options.cpu"),
    ("provider_options.roles_url", {"provider_options": {"roles_url": "https://x/'y"}}, "provider_options.roles_url"),
    ("network.allowed_ssh_cidrs", {"network.allowed_ssh_cidrs": ["2001:db8::/32"]}, "network.allowed_ssh_cidrs"),
    ("nodes.ps.instance_type", {"nodes.ps.instance_type": "m5'x"}, "nodes.ps.instance_type"),
])
def test_malformed_values_are_config_errors(field, values, expected_field):
    options = {"im_url": "http://127.0.0.1:9", "image_url": IMAGE}
    options.update(values.pop("provider_options", {}))
    spec = spec_for(options=options, **values)
    with pytest.raises(ConfigError) as err:
        radl_render.render(spec)
    assert err.value.field == expected_field


def test_newline_in_an_image_is_refused_by_the_configuration():
    with pytest.raises(ConfigError) as err:
        spec_for(options={"image_url": "ost://a/1\nsystem evil ()"})
    assert err.value.field == "provider_options.image_url"
    with pytest.raises(ConfigError):
        spec_for(**{"nodes.ps.image": "ost://a/1\n"})


def test_a_key_that_could_break_out_of_its_string_is_refused():
    spec = spec_for()
    for bad in ("-----BEGIN OPENSSH PRIVATE KEY-----\nabc'\n-----END OPENSSH PRIVATE KEY-----\n",
                "-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n-----END OPENSSH PRIVATE KEY-----"):
        with pytest.raises(ProvisionError) as err:
            radl_render.render(spec, credentials=radl_render.Credentials("root", "", bad))
        assert "abc" not in str(err.value)


def test_validate_rejects_a_broken_document():
    with pytest.raises(ProvisionError):
        radl_render.validate("system a (\n cpu.count >= 1 and net_interface.0.connection = 'nowhere'\n)\ndeploy a 1\n")


# -- the provider's checks: refused before any IM call -----------------------------------------------
@pytest.fixture
def no_im_calls(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("IM was called before the configuration was validated")

    monkeypatch.setattr(requests.Session, "request", refuse)


def test_provider_check_refuses_bad_values_before_im(tmp_path, auth_file, no_im_calls):
    state = ClusterState("tfct-im", root=tmp_path)
    provider = ImProvider(state)
    good = {"im_url": "http://127.0.0.1:9", "auth_file": str(auth_file), "image_url": IMAGE}
    provider.check(spec_for(options=good))  # a valid cloud spec passes without talking to IM
    cases = [
        ({"memory": "12 parsecs"}, {}, "provider_options.memory"),
        ({"image_url": "ost://x/'"}, {}, "provider_options.image_url"),
        ({"auth_file": str(tmp_path / "missing")}, {}, "provider_options.auth_file"),
        ({"im_url": ""}, {}, "provider_options.im_url"),
        ({"im_url": "ftp://im"}, {}, "provider_options.im_url"),
        ({"adopt_local": "perhaps"}, {}, "provider_options.adopt_local"),
        ({"timeout": "soon"}, {}, "provider_options.timeout"),
        ({"region": "x"}, {}, "provider_options.region"),
        ({}, {"network.allowed_ssh_cidrs": []}, "network.allowed_ssh_cidrs"),
    ]
    for opts, extra, field in cases:
        with pytest.raises(ConfigError) as err:
            provider.check(spec_for(options={**good, **opts}, **extra))
        assert err.value.field == field, (opts, extra, err.value)
    assert not state.dir.exists()


def test_adopt_local_needs_a_deployednode_line(tmp_path, no_im_calls):
    auth = tmp_path / "auth.dat"
    auth.write_text("id = im; type = InfrastructureManager; username = u; password = SECRETPASS\n")
    auth.chmod(0o600)
    spec = spec_for(options={"auth_file": str(auth), "adopt_local": "true", "image_url": ""})
    with pytest.raises(ConfigError) as err:
        ImProvider(ClusterState("tfct-im", root=tmp_path)).check(spec)
    assert err.value.field == "provider_options.auth_file" and "DeployedNode" in err.value.allowed
    assert "SECRETPASS" not in str(err.value)


def test_adopted_nodes_are_held_to_the_local_providers_rules(tmp_path, no_im_calls):
    """Under adopt_local the nodes are local ones: no GPUs (refused before IM is asked, naming the field)."""
    auth = tmp_path / "auth.dat"
    auth.write_text("id = im; type = InfrastructureManager; username = u; password = p\n"
                    "id = local; type = DeployedNode\n")
    auth.chmod(0o600)
    spec = spec_for(options={"auth_file": str(auth), "adopt_local": "true", "image_url": ""}, gpus=(0, 1, 0))
    with pytest.raises(ConfigError) as err:
        ImProvider(ClusterState("tfct-im", root=tmp_path)).check(spec)
    assert err.value.field == "nodes.worker.gpus" and "no GPUs" in err.value.allowed, err.value


def test_cli_up_refuses_a_bad_value_with_exit_2(home, tmp_path, auth_file):
    cfg = tmp_path / "bad.yml"
    cfg.write_text(f"cluster: tfct-im\nprovider: im\nnetwork: {{allowed_ssh_cidrs: ['203.0.113.0/24']}}\n"
                   "storage: {bucket: my-team-runs}\n"
                   f"provider_options: {{im_url: 'http://127.0.0.1:9', auth_file: '{auth_file}', "
                   f"image_url: '{IMAGE}', worker_memory: 'much'}}\n")
    res = run_cli("up", "--config", str(cfg), home=home)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "provider_options.worker_memory: got 'much'" in res.stderr
    assert not (home / "tfct-im").exists()


def test_auth_header_format(tmp_path):
    cert = tmp_path / "cert.pem"
    cert.write_text("LINE1\nLINE2\n")
    auth = tmp_path / "auth.dat"
    auth.write_text("# comment\n\nid = im; type = InfrastructureManager; username = u; password = p\n"
                    "id = one; type = OpenNebula; host = h:2633; token = file(cert.pem)\n")
    header = auth_header(auth)
    assert "\n" not in header
    assert header == ("id = im; type = InfrastructureManager; username = u; password = p\\n"
                      "id = one; type = OpenNebula; host = h:2633; token = LINE1\\\\nLINE2\\\\n")


def test_nodes_from_im_vm_descriptions():
    nets = [{"class": "network", "id": "public", "outbound": "yes"}, {"class": "network", "id": "private"}]

    def vm(system, **feats):
        return nets + [{"class": "system", "id": system, **feats}]

    cloud = [
        ("3", vm("worker", **{"net_interface.0.connection": "public", "net_interface.0.ip": "198.51.100.3",
                              "net_interface.1.connection": "private", "net_interface.1.ip": "10.0.0.3",
                              "disk.0.os.credentials.username": "cloudadm"})),
        ("1", vm("worker", **{"net_interface.0.connection": "public", "net_interface.0.ip": "198.51.100.1",
                              "net_interface.1.connection": "private", "net_interface.1.ip": "10.0.0.1",
                              "disk.0.os.credentials.username": "cloudadm"})),
        ("0", vm("ps", **{"net_interface.0.connection": "public", "net_interface.0.ip": "198.51.100.9",
                          "net_interface.1.connection": "private", "net_interface.1.ip": "10.0.0.9"})),
        ("2", vm("chief_0", **{"net_interface.0.connection": "private", "net_interface.0.ip": "10.0.0.2"})),
    ]
    nodes = nodes_from_vms("tfct-im", cloud, {"worker": 1})
    assert [(n.name, n.private_ip, n.public_ip, n.ssh_user, n.gpus) for n in nodes] == [
        ("tfct-im-ps-0", "10.0.0.9", "198.51.100.9", "root", 0),
        ("tfct-im-worker-0", "10.0.0.1", "198.51.100.1", "cloudadm", 1),
        ("tfct-im-worker-1", "10.0.0.3", "198.51.100.3", "cloudadm", 1),
        ("tfct-im-chief-0", "10.0.0.2", "10.0.0.2", "root", 0),
    ]
    with pytest.raises(ProvisionError):
        nodes_from_vms("tfct-im", [("0", vm("gateway", **{"net_interface.0.connection": "private"}))], {})


def test_operator_render_for_im_client(tmp_path):
    """python -m tfcluster.radl_render prints a document IM configures by itself (no keys in it)."""
    cfg = tmp_path / "cluster.yml"
    cfg.write_text(f"cluster: tfct-im\nprovider: im\nnetwork: {{allowed_ssh_cidrs: ['198.51.100.7/32']}}\n"
                   "storage: {bucket: my-team-runs}\n"
                   f"provider_options: {{image_url: '{IMAGE}', wheelhouse_url: 'https://example.org/w/'}}\n")
    res = subprocess.run([PYTHON, "-m", "tfcluster.radl_render", "--config", str(cfg)], cwd=REPO,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    parsed = parse_radl(res.stdout)
    assert parsed.check() and len(parsed.contextualize.items) == 3
    assert "private_key" not in res.stdout and "public_key" not in res.stdout
    assert parsed.get_system_by_name("chief").getValue("disk.0.os.credentials.username") == "cloudadm"


def test_cloud_nodes_without_ssh_sources_are_refused_not_opened():
    spec = spec_for(**{"network.allowed_ssh_cidrs": []})
    with pytest.raises(ConfigError) as err:
        radl_render.render(spec)
    assert err.value.field == "network.allowed_ssh_cidrs" and "no open default" in str(err.value)


# -- issue 8 item 8: what IM's own contextualization needs from the configure sections ------------------

INVENTORY_VARS = {"tf_role", "tf_index", "tf_port", "tf_cluster_spec", "tf_node_count", "tf_gpus", "tf_storage"}


def _recipe(parsed, role: str) -> dict:
    (play,) = yaml.safe_load(parsed.get_configure_by_name(role).recipes)
    return play


def test_configure_sections_set_only_variables_their_roles_declare_and_what_they_assert():
    parsed = parse_radl(radl_render.render(spec_for(gpus=(0, 2, 0)), contextualize="im"))
    for role in ("ps", "worker", "chief"):
        play = _recipe(parsed, role)
        applied = [r["role"] for r in play["roles"]]
        declared = set(INVENTORY_VARS)
        for name in applied:
            specs = yaml.safe_load((REPO / "roles" / name / "meta" / "argument_specs.yml").read_text())
            declared |= set(specs["argument_specs"]["main"]["options"])
        assert set(play["vars"]) <= declared, set(play["vars"]) - declared
        v = play["vars"]
        # tf_node's main entry point is its standing part: the run's harness bundle comes with tfcluster's start
        assert not [name for name in v if "bundle" in name], v
        # no wheelhouse URL: the tensorflow role installs from the node's package index
        assert (v["tensorflow_source"], v["tensorflow_wheelhouse_url"]) == ("index", "")
        assert v["tf_gpus"] == (2 if role == "worker" else 0)
        assert v["tf_storage"] is (role != "ps")   # a ps task never uses object storage: no keys for it
        assert ("gpu_driver" in applied) is (role == "worker")
        assert applied.index("common") < applied.index("tensorflow") < applied.index("tf_node")


def test_a_wheelhouse_url_selects_the_wheelhouse_source_and_gpu_driver_is_served_with_the_roles():
    spec = spec_for(gpus=(0, 1, 0), options={"wheelhouse_url": "https://example.org/w/",
                                            "roles_url": "https://example.org/roles"})
    parsed = parse_radl(radl_render.render(spec, contextualize="im"))
    v = _recipe(parsed, "ps")["vars"]
    assert (v["tensorflow_source"], v["tensorflow_wheelhouse_url"]) == ("wheelhouse", "https://example.org/w")
    assert "ansible.roles.https://example.org/roles/gpu_driver.tar.gz|gpu_driver" in str(
        parsed.get_system_by_name("worker"))


def test_the_command_line_prints_the_radl_and_says_what_empty_options_mean(tmp_path):
    cfg = tmp_path / "cluster.yml"
    cfg.write_text(f"cluster: tfct-im\nprovider: im\nnetwork: {{allowed_ssh_cidrs: ['198.51.100.7/32']}}\n"
                   "storage: {bucket: my-team-runs}\n"
                   f"provider_options: {{image_url: '{IMAGE}'}}\n")
    res = subprocess.run([PYTHON, "-m", "tfcluster.radl_render", "--config", str(cfg)], cwd=REPO,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert [r["role"] for r in _recipe(parse_radl(res.stdout), "ps")["roles"]] == ["common", "tensorflow", "tf_node"]
    assert "wheelhouse_url is empty" in res.stderr  # the note says what the empty value means


# -- item 7: IM's OpenStack connector defaults to Keystone v2.0, gone since Queens ---------------------

@pytest.mark.parametrize(("line", "refused"), [
    ("id = site; type = OpenStack; host = https://k.example.org:5000; username = u; password = SECRETPASS; "
     "tenant = t", True),
    ("id = site; type = OpenStack; host = https://k.example.org:5000; username = u; password = SECRETPASS; "
     "tenant = t; auth_version = 2.0_password", True),
    ("id = site; type = OpenStack; host = https://k.example.org:5000; username = u; password = SECRETPASS; "
     "tenant = t; domain = Default; auth_version = 3.x_password", False),
    ("# id = old; type = OpenStack; username = u; password = SECRETPASS", False),
])
def test_openstack_auth_lines_need_keystone_v3(tmp_path, no_im_calls, line, refused):
    auth = tmp_path / "auth.dat"
    auth.write_text("id = im; type = InfrastructureManager; username = u; password = SECRETPASS\n" + line + "\n")
    auth.chmod(0o600)
    spec = spec_for(options={"auth_file": str(auth)})
    provider = ImProvider(ClusterState("tfct-im", root=tmp_path))
    if not refused:
        provider.check(spec)
        return
    with pytest.raises(ConfigError) as err:
        provider.check(spec)
    assert err.value.field == "provider_options.auth_file" and "auth_version = 3.x_password" in err.value.allowed
    assert "line id site" in err.value.allowed and "SECRETPASS" not in str(err.value)


def test_readme_auth_example_passes_the_check(tmp_path, no_im_calls):
    readme = (REPO / "README.md").read_text()
    block = readme.split("The auth file is IM's own format, one credential per line:\n```\n")[1].split("```")[0]
    assert "auth_version = 3.x_password" in block and "domain = " in block
    auth = tmp_path / "auth.dat"
    auth.write_text(block)
    auth.chmod(0o600)    # as the README says to keep it
    ImProvider(ClusterState("tfct-im", root=tmp_path)).check(spec_for(options={"auth_file": str(auth)}))


def test_a_cluster_saved_with_the_retired_harness_bundle_option_still_loads_and_a_new_file_is_told(tmp_path):
    """provider_options.harness_bundle is gone (the run's start copies the bundle): the spec of an IM cluster
    brought up before still loads (its `down` must work), while a cluster file that sets it is refused."""
    import json

    from tfcluster.cluster import load_spec
    from tfcluster.errors import ConfigError
    from tfcluster.paths import ClusterState

    state = ClusterState("tfct-im", root=tmp_path)
    state.dir.mkdir(parents=True)
    saved = spec_for().to_dict()
    saved["provider_options"]["harness_bundle"] = "harness.tar.gz"   # a cluster file that had set it
    state.spec.write_text(json.dumps(saved))
    loaded = load_spec(state)
    assert loaded is not None and loaded.provider_options["image_url"] == IMAGE
    assert "harness_bundle" not in loaded.provider_options
    assert radl_render.render(loaded)      # the provider takes the loaded spec's options
    with pytest.raises(ConfigError, match="provider_options.harness_bundle"):
        radl_render.render(spec_for(options={"harness_bundle": "harness.tar.gz"}))
