"""The operator's reading of a job's drain notices from the proxy (`Operator._drains`); its
reconciliations against a real API server are in tests/functional/test_kubernetes.py."""

from __future__ import annotations

from kubernetes import client
from prometheus_client import CollectorRegistry

from vipu.k8s import jobs, operator
from vipu.k8s.operator import Operator, OperatorMetrics

JOB = jobs.parse({"apiVersion": "graphcore.ai/v1alpha1", "kind": "IPUJob", "metadata": {"name": "train", "namespace": "ml", "uid": "u-7"},
                  "spec": {"modelReplicas": "4", "ipusPerModelReplica": "1",
                           "launcher": {"command": ["train"]},
                           "workers": {"template": {"spec": {"containers": [{"name": "poplar", "image": "poplar"}]}}}}})
RUNNING = {"ipuPartitionCreated": True, "conditions": [{"type": "Running", "status": "True"}]}


def test_a_running_jobs_drains_are_read_with_its_uid_kept_a_moment_and_none_read_for_a_job_over_or_without_a_partition(monkeypatch):
    asked, answers = [], [(200, {"drains": ["agent ag1 is draining for cable repair"]}), (404, {"detail": "gone"}),
                          (503, {"detail": "no controller answers"})]

    def call(method, url, body=None, timeout=60.0):
        asked.append((method, url, timeout))
        return answers.pop(0)

    clock = [100.0]
    monkeypatch.setattr(operator.rest, "call", call)
    monkeypatch.setattr(operator.time, "monotonic", lambda: clock[0])
    reconciler = Operator(client.ApiClient(), jobs.Wiring("http://proxy/", "launcher"), 1.0, OperatorMetrics(CollectorRegistry()))

    assert reconciler._drains(JOB, RUNNING) == ["agent ag1 is draining for cable repair"]
    assert asked == [("GET", "http://proxy/partitions/p-ml-train/drains?uid=u-7", operator.DRAINS_TIMEOUT)]
    clock[0] += operator.DRAINS_FRESH_SECONDS / 2
    assert reconciler._drains(JOB, RUNNING) == ["agent ag1 is draining for cable repair"] and len(asked) == 1  # a burst asks once
    clock[0] += operator.DRAINS_FRESH_SECONDS
    assert reconciler._drains(JOB, RUNNING) == []  # its partition gone: nothing of it is drained
    clock[0] += operator.DRAINS_FRESH_SECONDS
    assert reconciler._drains(JOB, RUNNING) is None  # the proxy cannot say: the condition stays as it is
    assert len(asked) == 3
    over = {"ipuPartitionCreated": True, "conditions": [{"type": "Succeeded", "status": "True"}]}
    assert reconciler._drains(JOB, over) is None and reconciler._drains(JOB, {}) == [] and len(asked) == 3
