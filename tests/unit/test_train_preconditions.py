"""What `train` checks before it touches the nodes, beyond the configuration: the local store it needs is
running (after `make clean FORCE=1` with a cluster up it is not: one line saying how to go on, not a storage
client's retries)."""

from __future__ import annotations

import pytest

from tfcluster import config, store, training
from tfcluster.errors import TfclusterError
from tfcluster.paths import ClusterState


def test_train_without_the_local_store_says_how_to_start_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TFCLUSTER_HOME", str(tmp_path))
    spec = config.resolve({"cluster": "tfct-pre"})
    monkeypatch.setattr(store, "is_running", lambda: False)
    with pytest.raises(TfclusterError, match=r"the local S3 store at http://\S+ is not running \('make clean' "
                                             r"stops it.*'.venv/bin/python -m tfcluster store start' starts it "
                                             r"again \(empty\)"):
        training._check_can_train(spec, ClusterState("tfct-pre"))
