"""The admission webhooks' answers, as the API server reads them."""

from __future__ import annotations

import base64
import json

from tests.unit.k8s.test_jobs import job_document
from vipu.k8s import webhooks


def review(job: dict, operation: str = "CREATE") -> dict:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "r-1", "operation": operation, "namespace": "default", "object": job}}


def test_the_mutating_webhook_adds_only_the_missing_defaults():
    answer = webhooks.mutate(review(job_document()))
    response = answer["response"]
    assert (answer["kind"], response["uid"], response["allowed"], response["patchType"]) == ("AdmissionReview", "r-1", True, "JSONPatch")
    assert json.loads(base64.b64decode(response["patch"])) == [
        {"op": "add", "path": "/spec/numGcds", "value": 1},
        {"op": "add", "path": "/spec/restartPolicy", "value": {}},
        {"op": "add", "path": "/spec/restartPolicy/type", "value": "Never"},
        {"op": "add", "path": "/spec/restartPolicy/backOffLimit", "value": 3},
        {"op": "add", "path": "/spec/cleanPodPolicy", "value": "None"},
    ]
    complete = job_document(restartPolicy={"type": "Always", "backOffLimit": 1}, cleanPodPolicy="All", numGcds=2)
    assert "patch" not in webhooks.mutate(review(complete))["response"]


def test_the_backoff_limit_is_stored_in_the_seeds_spelling_whichever_was_given():
    def patch(**restart) -> list[dict]:
        response = webhooks.mutate(review(job_document(restartPolicy={"type": "Always", **restart}, cleanPodPolicy="All", numGcds=1)))
        return json.loads(base64.b64decode(response["response"].get("patch", "W10=")))

    assert patch(backoffLimit=1) == [{"op": "move", "from": "/spec/restartPolicy/backoffLimit",
                                      "path": "/spec/restartPolicy/backOffLimit"}]
    assert patch(backoffLimit=1, backOffLimit=1) == [{"op": "remove", "path": "/spec/restartPolicy/backoffLimit"}]
    assert patch(backoffLimit=1, backOffLimit=2) == []  # left for the validating webhook to refuse in one line


def test_the_validating_webhook_refuses_with_the_operators_reason():
    refused = webhooks.validate(review(job_document(modelReplicas="6")))["response"]
    assert refused["allowed"] is False and refused["status"]["code"] == 422
    assert refused["status"]["message"] == ("IPUJob ipujob-sample: modelReplicas x ipusPerModelReplica = 6 IPUs: "
                                            "a partition's size must be a power of two")
    assert webhooks.validate(review(job_document()))["response"] == {"uid": "r-1", "allowed": True}
    assert webhooks.validate(review({}, "DELETE"))["response"]["allowed"] is True
