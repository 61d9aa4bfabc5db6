"""Reaching the Kubernetes API server: in a pod through its service account, elsewhere by KUBECONFIG."""

from __future__ import annotations

import os

from kubernetes import client, config


def api_client() -> client.ApiClient:
    if os.environ.get("KUBERNETES_SERVICE_HOST") and not os.environ.get("KUBECONFIG"):
        config.load_incluster_config()
    else:
        config.load_kube_config()
    return client.ApiClient()


def namespace_of_this_pod(default: str = "default") -> str:
    """The namespace a pod runs in (POD_NAMESPACE, or its service account's), else `default`."""
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as file:
            return file.read().strip() or default
    except OSError:
        return default
