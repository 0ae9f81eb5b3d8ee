"""The simulator's client raises the operator client's error type (`nodewright.kube.resources.ApiError`)."""

from __future__ import annotations

import json

from nodewright.kube import resources
from nodewright.sim.kubeapi import ApiError


def test_a_refusal_is_the_kube_error_with_the_status_decoded() -> None:
    status = {"kind": "Status", "reason": "Invalid", "message": "spec.packages: bad", "code": 422}
    err = ApiError(422, "POST", "/apis/x", json.dumps(status))
    assert isinstance(err, resources.ApiError)
    assert (err.status, err.reason, err.message) == (422, "Invalid", "spec.packages: bad")
    assert err.body == json.dumps(status)  # the text, as the simulator's callers read it
    assert str(err).startswith("POST /apis/x: HTTP 422: ")


def test_a_body_that_is_not_a_status_keeps_its_text() -> None:
    err = ApiError(502, "GET", "/api/v1/nodes", "bad gateway")
    assert (err.reason, err.message, err.body) == ("InternalError", "bad gateway", "bad gateway")
