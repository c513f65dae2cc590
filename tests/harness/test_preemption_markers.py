"""The preemption markers in S3 (:mod:`tfc_harness.preemption`): a serving task's mark, and the chief's clearing
of an earlier attempt's marks before it trains, which a store's passing refusal must not fail."""

from __future__ import annotations

from botocore.exceptions import ClientError
from harness_support import example_settings
from tfc_harness import preemption, s3io
from tfc_harness.settings import validate


class ThrottledOnce:
    """An S3 client whose first listing is refused with ``SlowDown``, as a busy store answers."""

    def __init__(self, client):
        self.client, self.refused = client, 0

    def get_paginator(self, name):
        paginator, outer = self.client.get_paginator(name), self

        class Pages:      # a paginator's pages make their requests when read
            def __init__(self, **kwargs):
                self.kwargs = kwargs

            def __iter__(self):
                if outer.refused == 0:
                    outer.refused += 1
                    raise ClientError({"Error": {"Code": "SlowDown", "Message": "injected"}}, "ListObjectsV2")
                return iter(paginator.paginate(**self.kwargs))

        class Once:
            def paginate(self, **kwargs):
                return Pages(**kwargs)

        return Once()

    def __getattr__(self, name):
        return getattr(self.client, name)


def settings_for(bucket: str, endpoint: str, tmp_path, role: str = "chief", index: int = 0):
    raw = example_settings(state_dir=str(tmp_path / f"{role}{index}"), role=role, index=index)
    raw["tf_config"]["task"] = {"type": role, "index": index}
    raw["s3"].update(endpoint=endpoint, bucket=bucket)
    return validate(raw)


def test_the_chief_clears_an_earlier_attempts_marks_through_a_throttled_listing(s3_client, bucket,
                                                                                moto_endpoint, tmp_path, capsys):
    worker = settings_for(bucket, moto_endpoint, tmp_path, role="worker", index=1)
    preemption.mark(s3_client, worker)
    prefix = preemption.marker_prefix(worker)
    assert list(s3io.list_keys(s3_client, bucket, prefix)) == [f"{prefix}worker-1"]
    client = ThrottledOnce(s3_client)
    preemption.clear(client, settings_for(bucket, moto_endpoint, tmp_path))
    assert client.refused == 1 and list(s3io.list_keys(s3_client, bucket, prefix)) == []
    assert "SlowDown" in capsys.readouterr().out        # the retry is logged
    preemption.clear(s3_client, settings_for(bucket, moto_endpoint, tmp_path))     # nothing to clear: fine
