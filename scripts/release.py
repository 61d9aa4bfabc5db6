"""Documents made from the release's sources, so that they cannot drift from them.

    python scripts/release.py chart-docs [--check]     the chart's README.md and values.schema.json,
                                                       from values.yaml and its "# --" descriptions
    python scripts/release.py crd-reference OUT.md     the IPUJob reference, from the CRD's schema

With --check, chart-docs writes nothing and exits 1 naming the file that differs from what it
would write (a test runs it so). scripts/release calls both.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "gc-ipu-operator-helm-chart"
CRD = ROOT / "deploy" / "crds" / "graphcore.ai_ipujobs.yaml"

# Values whose defaults are empty maps or lists but that take anything Kubernetes does there.
FREE_FORM = {"global.imagePullSecrets", "podAnnotations", "podSecurityPolicyContext", "securityContext", "resources",
             "nodeSelector", "tolerations", "affinity", "controller.serviceAccount.annotations",
             "admissionWebhooks.service.annotations", "admissionWebhooks.patch.podAnnotations",
             "admissionWebhooks.patch.nodeSelector", "admissionWebhooks.patch.tolerations", "monitoring.serviceMonitor.labels",
             "monitoring.prometheusRule.labels", "monitoring.grafanaDashboards.labels"}
CHOICES = {"pullPolicy": ["Always", "IfNotPresent", "Never"], "failurePolicy": ["Fail", "Ignore"],
           "type": ["ClusterIP", "NodePort", "LoadBalancer"], "dnsPolicy": ["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"]}
INTEGERS_IN_RANGE = {"vipuServerPort": (1, 65535), "proxyPort": (1, 65535), "service.port": (1, 65535),
                     "admissionWebhooks.port": (1, 65535), "admissionWebhooks.service.servicePort": (1, 65535),
                     "admissionWebhooks.timeoutSeconds": (1, 30), "admissionWebhooks.patch.runAsUser": (1, 2147483647)}


def described_values(text: str) -> dict[str, str]:
    """Each value's dotted path and the "# --" line above it, in the file's order."""
    described: dict[str, str] = {}
    path: list[tuple[int, str]] = []
    pending = ""
    for line in text.splitlines():
        comment = re.match(r"\s*# -- (.*)", line)
        if comment:
            pending = comment.group(1)
            continue
        key = re.match(r"(\s*)([A-Za-z][\w]*):", line)
        if not key:
            continue
        indent = len(key.group(1))
        path = [(depth, name) for depth, name in path if depth < indent] + [(indent, key.group(2))]
        if pending:
            described[".".join(name for _, name in path)] = pending
            pending = ""
    return described


def _schema(value, path: str) -> dict:
    """The JSON schema of one value: its default's type; objects closed unless free-form."""
    name = path.rsplit(".", 1)[-1]
    if path in FREE_FORM:
        return {"type": "array"} if isinstance(value, list) else {"type": "object"}
    if isinstance(value, dict):
        return {"type": "object", "additionalProperties": False,
                "properties": {key: _schema(inner, f"{path}.{key}" if path else key) for key, inner in value.items()}}
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        low, high = INTEGERS_IN_RANGE.get(path, (0, None))
        return {"type": "integer", "minimum": low, **({"maximum": high} if high else {})}
    if isinstance(value, list):
        return {"type": "array"}
    if name in CHOICES:
        return {"type": "string", "enum": [*CHOICES[name], *([""] if value == "" else [])]}
    return {"type": "string"}


def values_schema(values: dict) -> dict:
    schema = _schema(values, "")
    return {"$schema": "http://json-schema.org/draft-07/schema#", "title": "gc-ipu-operator-helm-chart values", **schema}


def _default(values: dict, path: str) -> str:
    node = values
    for part in path.split("."):
        node = node[part]
    return f"`{json.dumps(node)}`" if node not in ("", None) else '`""`'


def chart_readme(values_text: str) -> str:
    values = yaml.safe_load(values_text)
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    rows = "\n".join(f"| `{path}` | {text} | {_default(values, path)} |" for path, text in described_values(values_text).items())
    return f"""# {chart["name"]}

{chart["description"]}. Its images default to the release's own, tagged with the chart's appVersion.

This file is made from `values.yaml` by `scripts/release.py chart-docs`; edit the descriptions
there. Any value not listed here is refused by the chart's `values.schema.json`, so a misspelt
`--set` is an error, not a silently ignored option. The seed's two spellings that differ from its
own table (`vipuCLusterName` in its install command, `controllers.serviceAccount.name` in the table)
are taken as aliases.

Install (the CRD first, then the chart, with the release's images loaded on the nodes):

    kubectl apply -f CRDs/graphcore.ai_ipujobs.yaml
    helm install gc gc-ipu-operator-helm-chart-VERSION.tgz --set vipuServerAddr=HOST --set vipuServerPort=PORT \\
        --set vipuClusterName=CLUSTER

## Values

| Value | Description | Default |
|---|---|---|
{rows}
"""


def chart_docs(check: bool) -> int:
    values_text = (CHART / "values.yaml").read_text()
    wanted = {CHART / "README.md": chart_readme(values_text),
              CHART / "values.schema.json": json.dumps(values_schema(yaml.safe_load(values_text)), indent=2) + "\n"}
    stale = [path for path, text in wanted.items() if not path.exists() or path.read_text() != text]
    if check:
        for path in stale:
            print(f"chart-docs: {path.relative_to(ROOT)} is not what values.yaml makes: run python scripts/release.py chart-docs",
                  file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(wanted[path])
    return 0


def _fields(schema: dict, path: str, required: set[str]) -> list[str]:
    rows = []
    for name, field in (schema.get("properties") or {}).items():
        where = f"{path}.{name}" if path else name
        kind = field.get("type", "") or ("integer or string" if field.get("x-kubernetes-int-or-string") else "any")
        if field.get("enum"):
            kind += " (" + ", ".join(f"`{choice}`" for choice in field["enum"]) + ")"
        notes = field.get("description", "").replace("\n", " ")
        if "default" in field:
            notes += f" Default: `{json.dumps(field['default'])}`."
        if field.get("x-kubernetes-preserve-unknown-fields"):
            notes += " Kept whole (any fields)."
        rows.append(f"| `{where}` | {kind} | {'yes' if name in required else ''} | {notes.strip()} |")
        rows += _fields(field, where, set(field.get("required") or []))
        if field.get("type") == "array" and isinstance(field.get("items"), dict):
            rows += _fields(field["items"], f"{where}[]", set(field["items"].get("required") or []))
    return rows


def crd_reference(out: Path) -> None:
    crd = yaml.safe_load(CRD.read_text())
    kind, group = crd["spec"]["names"]["kind"], crd["spec"]["group"]
    parts = [f"# {kind} reference ({group})\n", f"Made from the CRD's schema (`CRDs/{CRD.name}`) by `scripts/release.py`.\n"]
    for version in crd["spec"]["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        parts.append(f"## {group}/{version['name']}\n")
        for section in ("spec", "status"):
            body = schema["properties"].get(section)
            if body:
                parts.append(f"### {section}\n\n{body.get('description', '')}\n\n| Field | Type | Required | Description |\n|---|---|---|---|")
                parts.append("\n".join(_fields(body, section, set(body.get("required") or []))) + "\n")
        columns = version.get("additionalPrinterColumns") or []
        if columns:
            parts.append("### kubectl get columns\n\n" + "\n".join(f"- {c['name']}: `{c['jsonPath']}`" for c in columns) + "\n")
    out.write_text("\n".join(parts))


def main(argv: list[str]) -> int:
    if argv[:1] == ["chart-docs"] and argv[1:] in ([], ["--check"]):
        return chart_docs(check=argv[1:] == ["--check"])
    if argv[:1] == ["crd-reference"] and len(argv) == 2:
        crd_reference(Path(argv[1]))
        return 0
    print("usage: scripts/release.py chart-docs [--check] | crd-reference OUT.md", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
