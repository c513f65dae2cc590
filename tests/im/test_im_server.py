"""The provider's IM client against a real IM 2.x server (own venv, SQLite, 127.0.0.1).

DeployedNode systems at loopback addresses with an empty ``contextualize ()``: IM only records them, so
no node is needed to exercise create, state, VM descriptions, the state record, leftovers and destroy.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.im.test_radl import spec_for
from tfcluster import radl_render
from tfcluster.errors import ProvisionError
from tfcluster.paths import ClusterState
from tfcluster.providers.im import ImClient, ImProvider


def test_server_listens_on_loopback_only(im_server):
    cfg = (im_server["dir"] / "im.cfg").read_text()
    assert "REST_ADDRESS = 127.0.0.1" in cfg and f"DATA_DB = {im_server['dir'] / 'inf.dat'}" in cfg
    assert im_server["url"].startswith("http://127.0.0.1:")
    port = im_server["url"].rsplit(":", 1)[1]
    listening = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True).stdout
    addresses = {line.split()[3].rsplit(":", 1)[0] for line in listening.splitlines() if line.strip()}
    assert addresses == {"127.0.0.1"}, listening


def test_create_read_leftovers_destroy(im_server, auth_file, ssh_keypair, tmp_path, capsys):
    private, public = ssh_keypair
    spec = spec_for(1, 2, 1, options={"im_url": im_server["url"], "auth_file": str(auth_file),
                                      "adopt_local": "true", "image_url": ""})
    state = ClusterState("tfct-im", root=tmp_path)
    provider = ImProvider(state)
    client = ImClient(im_server["url"], auth_file)
    assert client.version().startswith("2.")
    adopted = [radl_render.AdoptedNode(f"tfct-im-{r}-{i}", r, i, f"127.0.0.{10 + n}")
               for n, (r, i) in enumerate([("ps", 0), ("worker", 0), ("worker", 1), ("chief", 0)])]
    radl = radl_render.render(spec, {**spec.provider_options, "cloud_id": "dn"}, adopted=adopted,
                              token="feedfacefeedface",
                              credentials=radl_render.Credentials("root", public, private))
    provider._write_record({"cluster": "tfct-im", "im_url": im_server["url"], "auth_file": str(auth_file),
                            "adopt_local": False, "timeout": 60, "token": "feedfacefeedface", "inf_id": None})
    inf_id = client.create(radl)

    # an up interrupted before the id was recorded: the token in the RADL finds it
    assert provider._find_by_token(client, "feedfacefeedface", "tfct-im") == [inf_id]
    assert any("still listed by IM" in x for x in provider.leftovers())

    rec = json.loads(provider.record_path.read_text())
    rec["inf_id"] = inf_id
    provider._write_record(rec)
    nodes = provider._wait_and_read(client, inf_id, spec, 60, adopted)
    assert [(n.name, n.role, n.index, n.private_ip, n.ssh_user, n.ssh_port) for n in nodes] == [
        ("tfct-im-ps-0", "ps", 0, "127.0.0.10", "root", 22),
        ("tfct-im-worker-0", "worker", 0, "127.0.0.11", "root", 22),
        ("tfct-im-worker-1", "worker", 1, "127.0.0.12", "root", 22),
        ("tfct-im-chief-0", "chief", 0, "127.0.0.13", "root", 22),
    ]
    assert f"IM infrastructure {inf_id}: configured" in capsys.readouterr().out
    assert provider.leftovers() == [f"IM infrastructure {inf_id} still listed by IM at {im_server['url']}"]

    provider.down_im()
    assert inf_id not in client.list_ids()
    assert not provider.record_path.exists()
    assert provider.leftovers() == []
    provider.down_im()  # idempotent: nothing recorded, nothing to do
    assert not client.destroy(inf_id, timeout=30)  # IM no longer knows it

    # the key went to IM in the request body only: not into our state, not into IM's log
    key_line = private.splitlines()[1]
    for path in Path(tmp_path).rglob("*"):
        if path.is_file():
            assert key_line not in path.read_text(errors="replace"), path
    assert key_line not in (im_server["dir"] / "im.log").read_text(errors="replace")


def test_errors_do_not_echo_credentials(im_server, tmp_path):
    auth = tmp_path / "auth.dat"
    auth.write_text("id = dn; type = DeployedNode; password = NOT-FOR-LOGS\n")  # no IM credentials
    client = ImClient(im_server["url"], auth)
    with pytest.raises(ProvisionError) as err:
        client.list_ids()
    assert "NOT-FOR-LOGS" not in str(err.value)
    with pytest.raises(ProvisionError) as err:
        ImClient("http://127.0.0.1:9", auth).version()
    assert "did not answer" in str(err.value) and "NOT-FOR-LOGS" not in str(err.value)


def test_operator_commands_with_im_client(im_server, auth_file, ssh_keypair, tmp_path):
    """The README's im_client commands against the same server: create, list, getstate, getcontmsg, destroy -y."""
    client_bin = Path(im_server["venv"]) / "bin" / "im_client"
    if not client_bin.exists():
        pytest.skip(f"no im_client in {client_bin.parent}")
    private, public = ssh_keypair  # a throwaway key: this RADL file exists only in the test's tmp dir
    spec = spec_for(1, 1, 1, options={"image_url": ""})
    adopted = [radl_render.AdoptedNode(f"tfct-im-{r}-0", r, 0, f"127.0.0.{20 + n}")
               for n, r in enumerate(("ps", "worker", "chief"))]
    radl_file = tmp_path / "cluster.radl"
    radl_file.write_text(radl_render.render(spec, adopted=adopted,
                                            credentials=radl_render.Credentials("root", public, private)))

    def im_client(*args):
        res = subprocess.run([str(client_bin), "-a", str(auth_file), "-r", im_server["url"], *args], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
        assert res.returncode == 0, res.stdout + res.stderr
        return res.stdout

    out = im_client("create", str(radl_file))
    inf_id = re.search(r"successfully created with ID: (\S+)", out).group(1)
    assert inf_id in im_client("list")
    assert "The infrastructure is in state: configured" in im_client("getstate", inf_id)
    assert "Contextualization disabled" in im_client("getcontmsg", inf_id)
    assert "successfully destroyed" in im_client("destroy", "-y", inf_id)
    assert inf_id not in ImClient(im_server["url"], auth_file).list_ids()


def test_an_interrupted_up_is_found_and_destroyed_at_once(im_server, auth_file, ssh_keypair, tmp_path):
    """An up interrupted right after its asynchronous create, its id not recorded: down at once finds it by
    the token (IM may still read its RADL empty) and destroys it (IM may still refuse while adding it)."""
    private, public = ssh_keypair
    spec = spec_for(1, 1, 1, options={"im_url": im_server["url"], "auth_file": str(auth_file),
                                      "adopt_local": "true", "image_url": ""}, cluster="tfct-im2")
    provider = ImProvider(ClusterState("tfct-im2", root=tmp_path))
    client = ImClient(im_server["url"], auth_file)
    adopted = [radl_render.AdoptedNode(f"tfct-im2-{r}-0", r, 0, f"127.0.0.{30 + n}")
               for n, r in enumerate(("ps", "worker", "chief"))]
    radl = radl_render.render(spec, {**spec.provider_options, "cloud_id": "dn"}, adopted=adopted,
                              token="cafecafecafecafe", credentials=radl_render.Credentials("root", public, private))
    provider._write_record({"cluster": "tfct-im2", "im_url": im_server["url"], "auth_file": str(auth_file),
                            "adopt_local": False, "timeout": 60, "token": "cafecafecafecafe", "inf_id": None})
    inf_id = client.create(radl)
    provider.down_im()
    assert inf_id not in client.list_ids()
    assert not provider.record_path.exists()
