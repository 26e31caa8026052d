#!/usr/bin/env python3
"""Offline checks of the Helm chart charts/gantry, without a helm binary or a cluster.

`helm lint --strict` and `helm template` through PyPI `helm-python-sdk` (Helm's Go SDK), with
the default values, with every optional feature on (tests/helm/values-all.yaml) and with the dev
profile; every rendered manifest validated against the Kubernetes 1.33 schemas with PyPI
`kubernetes-validate`; then assertions on the rendered objects (probes, security contexts,
RBAC equal to what the code exports, no secret in a ConfigMap or an env literal, references
that resolve), the CRD copy, values.schema.json, and the values table of charts/gantry/README.md.

RBAC: the expected list is `$GANTRY_BIN rbac` (default target/x86_64-unknown-linux-gnu/debug/gantry).

    tests/helm/run.sh                        # makes the venv, then runs this
    .venv-helm/bin/python tests/helm/check_chart.py

One line per check; exits non-zero when any fails.
"""

import base64
import json
import os
import re
import subprocess
import sys
import traceback
from pathlib import Path

try:
    import helm_python as helm
    import kubernetes_validate
    import yaml
except ImportError as missing:  # pragma: no cover - the message is the point
    sys.exit(
        f"check_chart.py needs helm-python-sdk and kubernetes-validate ({missing}); run tests/helm/run.sh, "
        "which makes the .venv-helm venv with them"
    )

sys.path.insert(0, str(Path(__file__).resolve().parent))
import values_table  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gantry"
TOP_CRD = ROOT / "crds" / "functionjobs.gantry.dev.yaml"
README = ROOT / "charts" / "gantry" / "README.md"
KUBE_VERSION = "1.33.0"
RELEASE = "gantry"
NAMESPACE = "gantry"
STANDARD_LABELS = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
)
# Env or ConfigMap keys that may only come from a Secret.
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|KEY|DATABASE_URL|CREDENTIAL|PASSWD", re.IGNORECASE)
# ...except these, which hold names of Secrets, not their values.
SECRET_NAME_ALLOWED = {"GANTRY_IMAGE_PULL_SECRETS"}
PASSTHROUGH = "Kubernetes type, passed through as is and checked by the API server"

PROFILES = {
    "default": {},
    "all features": yaml.safe_load((ROOT / "tests" / "helm" / "values-all.yaml").read_text()),
    "dev": {"dev": {"enabled": True}},
}

FAILED = []


def check(name):
    """Runs the decorated function as the check `name`: `ok` (with its returned note) or `FAIL`."""

    def run(test):
        try:
            note = test()
        except AssertionError as failure:
            FAILED.append(name)
            print(f"FAIL {name}: {failure}")
        except Exception:  # noqa: BLE001 - an error is a failure, reported in full
            FAILED.append(name)
            print(f"FAIL {name}: error")
            traceback.print_exc(file=sys.stdout)
        else:
            print(f"ok   {name}" + (f" ({note})" if note else ""))
        return test

    return run


# ---------------------------------------------------------------------------------------------
# Rendering

def render(values):
    """The objects `helm template` would print: [(template path, object)]."""
    with helm.Chart.load(str(CHART)) as chart:
        manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects = []
    for path, text in sorted(manifests.items()):
        if not path.endswith((".yaml", ".yml")):
            continue
        for document in yaml.safe_load_all(text):
            if document:
                objects.append((path, document))
    return objects


RENDERED = {}


def rendered(profile):
    if profile not in RENDERED:
        try:
            RENDERED[profile] = render(PROFILES[profile])
        except (helm.HelmValuesError, helm.HelmRenderError) as error:
            RENDERED[profile] = error
    if isinstance(RENDERED[profile], Exception):
        message = " ".join(str(RENDERED[profile]).split())
        raise AssertionError(f"helm template ({profile} values) failed: {message}")
    return RENDERED[profile]


def objects_of(profile, kind=None):
    return [obj for _, obj in rendered(profile) if kind is None or obj["kind"] == kind]


def one(profile, kind, name):
    found = [obj for obj in objects_of(profile, kind) if obj["metadata"]["name"] == name]
    assert len(found) == 1, f"{profile}: expected one {kind} {name}, found {len(found)}"
    return found[0]


def deployment(profile, role):
    return one(profile, "Deployment", f"{RELEASE}-{role}")


def container(deploy, name):
    found = [c for c in deploy["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    assert len(found) == 1, f"Deployment {deploy['metadata']['name']} has no container {name}"
    return found[0]


def workloads(profile):
    return [obj for obj in objects_of(profile) if obj["kind"] in ("Deployment", "StatefulSet", "Job", "DaemonSet")]


def all_containers(pod_spec):
    return pod_spec.get("initContainers", []) + pod_spec["containers"]


def config_map_data(profile, role):
    return one(profile, "ConfigMap", f"{RELEASE}-{role}")["data"]


# ---------------------------------------------------------------------------------------------
# Checks

@check("Chart.yaml appVersion is the crate version")
def _():
    crate = re.search(r'^\[package\][^\[]*?^version\s*=\s*"([^"]+)"', (ROOT / "Cargo.toml").read_text(), re.M | re.S)
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert crate, "no [package] version in Cargo.toml"
    assert str(chart["appVersion"]) == crate.group(1), f"appVersion {chart['appVersion']} != crate {crate.group(1)}"
    return f"{crate.group(1)}"


for profile, values in PROFILES.items():

    @check(f"helm lint --strict ({profile} values)")
    def _(values=values):
        report = helm.lint(str(CHART), values, strict=True, kube_version=f"v{KUBE_VERSION}")
        problems = [m for m in report["messages"] if m["severity"] >= 2] + [{"error": e} for e in report["errors"]]
        assert not problems, "; ".join(f"{m.get('path', '')}: {m['error']}" for m in problems)
        infos = [m["error"] for m in report["messages"] if m["severity"] < 2]
        return "; ".join(infos) if infos else ""


for profile in PROFILES:

    @check(f"helm template ({profile} values) validates against Kubernetes {KUBE_VERSION}")
    def _(profile=profile):
        skipped, errors = [], []
        for path, obj in rendered(profile):
            try:
                kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
            except kubernetes_validate.SchemaNotFoundError:
                skipped.append(f"{obj['kind']} ({obj['apiVersion']}, a CRD kind without a schema here)")
            except kubernetes_validate.ValidationError as error:
                where = ".".join(str(p) for p in error.path)
                errors.append(f"{path}: {obj['kind']}/{obj['metadata'].get('name')}: {where}: {error.message}")
        assert not errors, "\n  " + "\n  ".join(errors)
        note = f"{len(rendered(profile))} objects"
        return note + (f"; skipped {', '.join(skipped)}" if skipped else "")


@check("the chart's CRD validates and is identical to crds/functionjobs.gantry.dev.yaml")
def _():
    files = sorted(p.name for p in (CHART / "crds").iterdir())
    assert files == [TOP_CRD.name], f"charts/gantry/crds holds {files}"
    copy = (CHART / "crds" / TOP_CRD.name).read_bytes()
    assert copy == TOP_CRD.read_bytes(), "charts/gantry/crds/functionjobs.gantry.dev.yaml differs: cp crds/functionjobs.gantry.dev.yaml charts/gantry/crds/"
    with helm.Chart.load(str(CHART)) as chart:
        crds = chart.crds
    assert len(crds) == 1 and crds[0]["data"].encode() == TOP_CRD.read_bytes(), "helm does not load the CRD as given"
    kubernetes_validate.validate(yaml.safe_load(copy), KUBE_VERSION, strict=True)


for profile in PROFILES:

    @check(f"probes of both roles ({profile})")
    def _(profile=profile):
        def port_number(c, port):
            if isinstance(port, int):
                return port
            named = [p["containerPort"] for p in c.get("ports", []) if p.get("name") == port]
            assert named, f"container {c['name']} has no port named {port}"
            return named[0]

        expected = {
            ("gateway", "gateway"): {"livenessProbe": ("/liveness/", 8000), "readinessProbe": ("/readiness/", 8000)},
            ("controller", "controller"): {"livenessProbe": ("/healthz", 9090), "readinessProbe": ("/readyz", 9090)},
        }
        for (role, name), probes in expected.items():
            c = container(deployment(profile, role), name)
            for probe, (path, port) in probes.items():
                got = c.get(probe, {}).get("httpGet")
                assert got, f"{role}: no {probe} httpGet"
                number = port_number(c, got["port"])
                assert (got["path"], number) == (path, port), (
                    f"{role} {probe} is {got['path']} on port {number!r}, want {path} on {port}"
                )
            metrics = [p for p in c["ports"] if p.get("name") == "metrics"]
            assert metrics and metrics[0]["containerPort"] == 9090, f"{role}: no port named metrics on 9090"
            assert "GANTRY_ADMIN_LISTEN" in config_map_data(profile, role), f"{role}: admin listen not set"
            assert config_map_data(profile, role)["GANTRY_ADMIN_LISTEN"].endswith(":9090")


for profile in PROFILES:

    @check(f"security contexts: non-root, no privilege escalation, no capabilities, seccomp ({profile})")
    def _(profile=profile):
        problems = []
        for workload in workloads(profile):
            name = f"{workload['kind']}/{workload['metadata']['name']}"
            pod = workload["spec"]["template"]["spec"]
            pod_context = pod.get("securityContext", {})
            gantry_role = workload["kind"] == "Deployment"
            if pod.get("hostNetwork") or pod.get("hostPID") or pod.get("hostIPC"):
                problems.append(f"{name}: host namespaces")
            for c in all_containers(pod):
                context = c.get("securityContext", {})
                where = f"{name} container {c['name']}"
                if not (context.get("runAsNonRoot", pod_context.get("runAsNonRoot")) is True):
                    problems.append(f"{where}: runAsNonRoot is not true")
                if context.get("runAsUser", pod_context.get("runAsUser", 1)) == 0:
                    problems.append(f"{where}: runs as uid 0")
                if context.get("allowPrivilegeEscalation") is not False:
                    problems.append(f"{where}: allowPrivilegeEscalation is not false")
                if context.get("privileged"):
                    problems.append(f"{where}: privileged")
                if "ALL" not in context.get("capabilities", {}).get("drop", []) or context.get("capabilities", {}).get("add"):
                    problems.append(f"{where}: capabilities are not drop ALL")
                seccomp = context.get("seccompProfile", pod_context.get("seccompProfile", {})).get("type")
                if seccomp != "RuntimeDefault":
                    problems.append(f"{where}: seccomp {seccomp}")
                if gantry_role and context.get("readOnlyRootFilesystem") is not True:
                    problems.append(f"{where}: root filesystem is not read-only")
            if gantry_role:
                volumes = {v["name"]: v for v in pod.get("volumes", [])}
                for c in pod["containers"]:
                    tmp = [m for m in c.get("volumeMounts", []) if m["mountPath"] == "/tmp"]
                    if not tmp or "emptyDir" not in volumes.get(tmp[0]["name"], {}):
                        problems.append(f"{name} container {c['name']}: /tmp is not an emptyDir")
                data_dir = config_map_data(profile, workload["metadata"]["name"].removeprefix(f"{RELEASE}-"))
                if not data_dir.get("GANTRY_DATA_DIR", "").startswith("/tmp/"):
                    problems.append(f"{name}: GANTRY_DATA_DIR is not under the writable /tmp")
        assert not problems, "\n  " + "\n  ".join(problems)
        return f"{len(workloads(profile))} workloads"


@check("controller: leader election, POD_NAME from the downward API, Recreate with one replica, RollingUpdate with more")
def _():
    for profile in PROFILES:
        controller = deployment(profile, "controller")
        replicas = controller["spec"]["replicas"]
        strategy = controller["spec"]["strategy"]["type"]
        assert strategy == ("Recreate" if replicas <= 1 else "RollingUpdate"), f"{profile}: {replicas} replicas, {strategy}"
        env = {e["name"]: e for e in container(controller, "controller").get("env", [])}
        assert env.get("POD_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name", (
            f"{profile}: POD_NAME is not the pod's name"
        )
        data = config_map_data(profile, "controller")
        assert data.get("GANTRY_LEADER_ELECTION") == "true", f"{profile}: leader election is off"
        assert data.get("GANTRY_LEASE_NAME"), f"{profile}: no lease name"
    assert deployment("default", "controller")["spec"]["replicas"] == 1
    assert deployment("all features", "controller")["spec"]["replicas"] > 1, "values-all.yaml should run several controllers"


@check("event sinks: the same settings on both roles, the webhook key by secretKeyRef, every variable a flag of both roles")
def _():
    binary = os.environ.get("GANTRY_BIN") or str(ROOT / "target" / "x86_64-unknown-linux-gnu" / "debug" / "gantry")
    helps = {role: subprocess.run([binary, role, "--help"], capture_output=True, text=True, check=True).stdout for role in ("gateway", "controller")}
    settings = {}
    for role in ("gateway", "controller"):
        data = config_map_data("all features", role)
        settings[role] = {k: v for k, v in data.items() if k.startswith("GANTRY_EVENTS_")}
        for name in settings[role]:
            assert f"[env: {name}=" in helps[role], f"{role}: {name} is not a flag's variable of `gantry {role}`"
        env = {e["name"]: e for e in container(deployment("all features", role), role).get("env", [])}
        ref = env.get("GANTRY_EVENTS_WEBHOOK_SECRET", {}).get("valueFrom", {}).get("secretKeyRef", {})
        assert ref == {"name": "gantry-webhook", "key": "signing-key"}, f"{role}: webhook key not from its Secret: {ref}"
    assert settings["gateway"] == settings["controller"], "the roles publish to different sinks"
    assert settings["gateway"]["GANTRY_EVENTS_NATS_URL"] == "nats://nats.messaging:4222"
    assert settings["gateway"]["GANTRY_EVENTS_WEBHOOK_URL"] == "https://hooks.example.com/gantry"
    assert "GANTRY_EVENTS_NATS_URL" not in config_map_data("default", "gateway"), "NATS is off by default"
    return f"{len(settings['gateway'])} settings"


def expected_rbac():
    binary = os.environ.get("GANTRY_BIN") or str(ROOT / "target" / "x86_64-unknown-linux-gnu" / "debug" / "gantry")
    assert os.access(binary, os.X_OK), f"no gantry binary at {binary}: build it (cargo build) or set GANTRY_BIN"
    answer = subprocess.run([binary, "rbac"], capture_output=True, text=True, timeout=60)
    assert answer.returncode == 0, f"`{binary} rbac` failed: {answer.stderr.strip()}"
    return json.loads(answer.stdout), f"`{binary} rbac`"


def flatten_expected(rules):
    flat = {}
    for rule in rules:
        key = (rule["scope"], rule["apiGroup"], rule["resource"])
        assert key not in flat, f"the exported list names {key} twice"
        assert list(rule["verbs"]) == sorted(rule["verbs"]), f"verbs of {key} are not sorted"
        flat[key] = set(rule["verbs"])
    return flat


def granted(profile):
    """role -> {(scope, group, resource): verbs}, from the rendered Roles and ClusterRoles and the
    bindings of each role's ServiceAccount, plus the problems seen on the way."""
    problems = []
    accounts = {
        deployment(profile, role)["spec"]["template"]["spec"]["serviceAccountName"]: role
        for role in ("gateway", "controller")
    }
    jobs_namespace = config_map_data(profile, "controller")["GANTRY_NAMESPACE"]
    assert config_map_data(profile, "gateway")["GANTRY_NAMESPACE"] == jobs_namespace
    roles = {("Role", r["metadata"]["namespace"], r["metadata"]["name"]): r for r in objects_of(profile, "Role")}
    roles.update({("ClusterRole", None, r["metadata"]["name"]): r for r in objects_of(profile, "ClusterRole")})
    flat = {role: {} for role in ("gateway", "controller")}
    bound = set()
    for binding in objects_of(profile, "RoleBinding") + objects_of(profile, "ClusterRoleBinding"):
        cluster = binding["kind"] == "ClusterRoleBinding"
        ref = binding["roleRef"]
        if not cluster and ref["kind"] == "ClusterRole":
            problems.append(f"RoleBinding {binding['metadata']['name']} binds a ClusterRole")
        namespace = None if ref["kind"] == "ClusterRole" else binding["metadata"]["namespace"]
        role_object = roles.get((ref["kind"], namespace, ref["name"]))
        if role_object is None:
            problems.append(f"{binding['kind']} {binding['metadata']['name']} refers to a missing {ref['kind']} {ref['name']}")
            continue
        if not cluster and namespace != jobs_namespace:
            problems.append(f"Role {ref['name']} is in {namespace}, not the jobs' namespace {jobs_namespace}")
        bound.add((ref["kind"], namespace, ref["name"]))
        for subject in binding["subjects"]:
            if subject["kind"] != "ServiceAccount" or subject.get("namespace") != NAMESPACE or subject["name"] not in accounts:
                problems.append(f"{binding['kind']} {binding['metadata']['name']} binds {subject}, not a role's ServiceAccount")
                continue
            role = accounts[subject["name"]]
            for rule in role_object["rules"]:
                if rule.get("nonResourceURLs"):
                    problems.append(f"{ref['name']}: nonResourceURLs")
                for group in rule.get("apiGroups", []):
                    for resource in rule.get("resources", []):
                        if "*" in (group, resource) or "*" in rule["verbs"]:
                            problems.append(f"{ref['name']}: wildcard in {rule}")
                        scope = "cluster" if cluster else "namespaced"
                        if cluster:
                            names = rule.get("resourceNames")
                            if resource == "customresourcedefinitions" and names != ["functionjobs.gantry.dev"]:
                                problems.append(f"{ref['name']}: the CRD rule is not restricted to functionjobs.gantry.dev")
                            elif not names:
                                problems.append(f"{ref['name']}: cluster-wide rule on {resource} without resourceNames")
                        flat[role].setdefault((scope, group, resource), set()).update(rule["verbs"])
    for key in roles:
        if key not in bound:
            problems.append(f"{key[0]} {key[2]} is bound to nobody")
    return flat, problems


for profile in PROFILES:

    @check(f"RBAC grants exactly what the code exports ({profile})")
    def _(profile=profile):
        exported, source = expected_rbac()
        assert set(exported) == {"gateway", "controller"}, f"{source} names roles {sorted(exported)}"
        flat, problems = granted(profile)
        for role in ("gateway", "controller"):
            want = flatten_expected(exported[role])
            got = flat[role]
            for key in sorted(set(want) | set(got)):
                extra = sorted(got.get(key, set()) - want.get(key, set()))
                missing = sorted(want.get(key, set()) - got.get(key, set()))
                label = f"{role} {key[0]} {key[1] or 'core'}/{key[2]}"
                if extra:
                    problems.append(f"{label}: granted but not used: {extra}")
                if missing:
                    problems.append(f"{label}: used but not granted: {missing}")
        assert not problems, "\n  " + "\n  ".join(problems)
        return f"against {source}"


for profile in PROFILES:

    @check(f"no secret value in a ConfigMap or an env literal; credentials only by secretKeyRef ({profile})")
    def _(profile=profile):
        problems = []
        secret_values = set()
        for secret in objects_of(profile, "Secret"):
            for value in (secret.get("data") or {}).values():
                secret_values.add(base64.b64decode(value).decode(errors="replace"))
            secret_values.update((secret.get("stringData") or {}).values())
        secret_values = {v for v in secret_values if len(v) >= 8}
        literals = []
        for config_map in objects_of(profile, "ConfigMap"):
            for key, value in (config_map.get("data") or {}).items():
                literals.append((f"ConfigMap {config_map['metadata']['name']} {key}", key, value))
        for workload in workloads(profile):
            for c in all_containers(workload["spec"]["template"]["spec"]):
                for env in c.get("env", []):
                    if "value" in env:
                        literals.append((f"{workload['metadata']['name']}/{c['name']} env {env['name']}", env["name"], str(env["value"])))
                for argument in c.get("command", []) + c.get("args", []):
                    literals.append((f"{workload['metadata']['name']}/{c['name']} command", "", argument))
        for where, key, value in literals:
            if key and SECRET_NAME.search(key) and key not in SECRET_NAME_ALLOWED:
                problems.append(f"{where}: a secret-like name with a literal value")
            if re.search(r"://[^/\s:@]+:[^/\s@$]+@", value):
                problems.append(f"{where}: a URL with a password")
            if any(secret in value for secret in secret_values):
                problems.append(f"{where}: holds a Secret's value")
        # Every credential the roles read comes from a Secret.
        for role in ("gateway", "controller"):
            env = {e["name"]: e for e in container(deployment(profile, role), role).get("env", [])}
            needed = ["GANTRY_DATABASE_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"] + (["GANTRY_TOKEN_KEY"] if role == "gateway" else [])
            for name in needed:
                if "secretKeyRef" not in env.get(name, {}).get("valueFrom", {}):
                    problems.append(f"{role}: {name} is not read from a Secret")
        assert not problems, "\n  " + "\n  ".join(problems)
        return f"{len(literals)} literals"


@check("values.yaml holds no credential")
def _():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    problems = []

    def walk(tree, path):
        for key, value in tree.items():
            here = f"{path}{key}"
            if isinstance(value, dict):
                walk(value, here + ".")
            elif isinstance(value, str) and value:
                credential_keys = {"password", "passwd", "secret", "token", "credentials", "url", "databaseurl", "accesskeyid", "secretaccesskey"}
                if key.lower() in credential_keys or key.lower().endswith(("password", "passwd")):
                    problems.append(f"{here} has a literal value")
                if re.search(r"://[^/\s:@]+:[^/\s@]+@", value):
                    problems.append(f"{here} is a URL with a password")

    walk(values, "")
    assert not problems, "; ".join(problems)


@check("dev profile: PostgreSQL and S3 with volumes, generated Secrets kept across upgrades, everything referenced is rendered")
def _():
    profile = "dev"
    sets = {s["metadata"]["name"]: s for s in objects_of(profile, "StatefulSet")}
    assert set(sets) == {f"{RELEASE}-dev-postgresql", f"{RELEASE}-dev-s3"}, sorted(sets)
    for stateful in sets.values():
        claims = stateful["spec"].get("volumeClaimTemplates", [])
        mounts = {m["name"] for c in stateful["spec"]["template"]["spec"]["containers"] for m in c.get("volumeMounts", [])}
        assert claims and claims[0]["metadata"]["name"] in mounts, f"{stateful['metadata']['name']}: no persistent volume"
        one(profile, "Service", stateful["spec"]["serviceName"])
    secrets = {s["metadata"]["name"]: s for s in objects_of(profile, "Secret")}
    for secret in secrets.values():
        assert secret["metadata"].get("annotations", {}).get("helm.sh/resource-policy") == "keep", secret["metadata"]["name"]
    # Offline, lookup finds nothing; the template must still look each Secret up before
    # generating it, so an upgrade keeps the values the volumes were initialised with.
    template = (CHART / "templates" / "dev-secrets.yaml").read_text()
    lookups = template.count('lookup "v1" "Secret"')
    assert lookups == len(secrets), f"{lookups} lookups for {len(secrets)} generated Secrets"
    # Every Secret and ConfigMap a pod reads is rendered: the profile needs nothing else.
    config_maps = {c["metadata"]["name"] for c in objects_of(profile, "ConfigMap")}
    for workload in workloads(profile):
        pod = workload["spec"]["template"]["spec"]
        for c in all_containers(pod):
            for env in c.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] in secrets, f"{workload['metadata']['name']}: Secret {ref['name']} is not rendered"
                    data = secrets[ref["name"]].get("data", {})
                    assert ref["key"] in data, f"Secret {ref['name']} has no key {ref['key']}"
            for source in c.get("envFrom", []):
                if "configMapRef" in source:
                    assert source["configMapRef"]["name"] in config_maps
    for role in ("gateway", "controller"):
        pod = deployment(profile, role)["spec"]["template"]["spec"]
        init = [c["name"] for c in pod.get("initContainers", [])]
        assert init == ["wait-for-postgresql", "create-bucket"], f"{role}: init containers {init}"
        data = config_map_data(profile, role)
        assert data["GANTRY_S3_ENDPOINT"].startswith(f"http://{RELEASE}-dev-s3."), data["GANTRY_S3_ENDPOINT"]
        assert data["GANTRY_S3_PATH_STYLE"] == "true"
        assert data["GANTRY_STORAGE"] == "s3://gantry"


@check("references resolve: Services, Ingress, HPA, PDB, ServiceMonitor, ConfigMaps, ServiceAccounts")
def _():
    problems = []
    for profile in PROFILES:
        pods = [(w["metadata"]["name"], w["spec"]["template"]) for w in workloads(profile)]

        def matching(selector):
            return [name for name, template in pods if all(template["metadata"]["labels"].get(k) == v for k, v in selector.items())]

        services = {s["metadata"]["name"]: s for s in objects_of(profile, "Service")}
        for service in services.values():
            targets = matching(service["spec"]["selector"])
            if len(targets) != 1:
                problems.append(f"{profile}: Service {service['metadata']['name']} selects {targets}")
                continue
            template = dict(pods)[targets[0]]
            names = {p.get("name") for c in template["spec"]["containers"] for p in c.get("ports", [])}
            for port in service["spec"]["ports"]:
                if port["targetPort"] not in names:
                    problems.append(f"{profile}: Service {service['metadata']['name']} targets missing port {port['targetPort']}")
        for ingress in objects_of(profile, "Ingress"):
            for rule in ingress["spec"]["rules"]:
                for path in rule["http"]["paths"]:
                    backend = path["backend"]["service"]
                    target = services.get(backend["name"])
                    if not target or backend["port"]["name"] not in {p["name"] for p in target["spec"]["ports"]}:
                        problems.append(f"{profile}: Ingress backend {backend} does not exist")
        for hpa in objects_of(profile, "HorizontalPodAutoscaler"):
            ref = hpa["spec"]["scaleTargetRef"]
            target = one(profile, ref["kind"], ref["name"])
            if "replicas" in target["spec"]:
                problems.append(f"{profile}: {ref['name']} sets replicas although an HPA scales it")
            for resource in (m["resource"]["name"] for m in hpa["spec"]["metrics"]):
                requests = {k for c in target["spec"]["template"]["spec"]["containers"] for k in c.get("resources", {}).get("requests", {})}
                if resource not in requests:
                    problems.append(f"{profile}: the HPA scales on {resource} but the gateway requests none")
        for pdb in objects_of(profile, "PodDisruptionBudget"):
            if matching(pdb["spec"]["selector"]["matchLabels"]) != [f"{RELEASE}-gateway"]:
                problems.append(f"{profile}: PDB selects {matching(pdb['spec']['selector']['matchLabels'])}")
        for monitor in objects_of(profile, "ServiceMonitor"):
            selected = [
                s for s in services.values()
                if all(s["metadata"]["labels"].get(k) == v for k, v in monitor["spec"]["selector"]["matchLabels"].items())
            ]
            names = sorted(s["metadata"]["name"] for s in selected)
            if names != [f"{RELEASE}-controller-metrics", f"{RELEASE}-gateway-metrics"]:
                problems.append(f"{profile}: the ServiceMonitor selects {names}")
            for endpoint in monitor["spec"]["endpoints"]:
                if any(endpoint["port"] not in {p["name"] for p in s["spec"]["ports"]} for s in selected):
                    problems.append(f"{profile}: ServiceMonitor port {endpoint['port']} missing")
        accounts = {a["metadata"]["name"] for a in objects_of(profile, "ServiceAccount")}
        config_maps = {c["metadata"]["name"] for c in objects_of(profile, "ConfigMap")}
        for role in ("gateway", "controller"):
            pod = deployment(profile, role)["spec"]["template"]["spec"]
            if pod["serviceAccountName"] not in accounts:
                problems.append(f"{profile}: {role} ServiceAccount {pod['serviceAccountName']} is not rendered")
            for c in pod["containers"]:
                for source in c.get("envFrom", []):
                    if source.get("configMapRef", {}).get("name") not in config_maps:
                        problems.append(f"{profile}: {role} reads a missing ConfigMap")
    assert not problems, "\n  " + "\n  ".join(problems)


@check("standard labels on every object")
def _():
    problems = []
    for profile in PROFILES:
        for path, obj in rendered(profile):
            labels = obj["metadata"].get("labels", {})
            missing = [label for label in STANDARD_LABELS if label not in labels]
            if missing and not (obj["kind"] == "ServiceMonitor" and missing == ["app.kubernetes.io/component"]):
                problems.append(f"{profile}: {obj['kind']}/{obj['metadata']['name']} lacks {missing}")
        for workload in workloads(profile):
            labels = workload["spec"]["template"]["metadata"]["labels"]
            if "app.kubernetes.io/component" not in labels:
                problems.append(f"{profile}: pods of {workload['metadata']['name']} lack the component label")
    assert not problems, "\n  " + "\n  ".join(problems)


@check("values.schema.json accepts the three profiles and sets additionalProperties on every object")
def _():
    schema = json.loads((CHART / "values.schema.json").read_text())
    loose = []

    def walk(node, path):
        if isinstance(node, dict):
            if node.get("type") == "object":
                extra = node.get("additionalProperties")
                if "properties" in node and extra is not False:
                    loose.append(path or "(root)")
                elif "properties" not in node and not isinstance(extra, dict) and node.get("$comment") != PASSTHROUGH:
                    loose.append(path or "(root)")
            for key, value in node.items():
                walk(value, f"{path}/{key}")
        elif isinstance(node, list):
            for index, value in enumerate(node):
                walk(value, f"{path}/{index}")

    walk(schema, "")
    assert not loose, f"objects without additionalProperties false: {loose}"
    with helm.Chart.load(str(CHART)) as chart:
        for profile, values in PROFILES.items():
            try:
                chart.validate_schema(chart.merge_values(values))
            except helm.HelmValuesError as error:
                raise AssertionError(f"{profile} values rejected: {' '.join(str(error).split())}") from None


for name, values in {
    "a wrong type (gateway.replicas: \"two\")": {"gateway": {"replicas": "two"}},
    "an unknown top-level key (gatway)": {"gatway": {"replicas": 2}},
    "an unknown nested key (gateway.replica)": {"gateway": {"replica": 2}},
    "an unknown auth mechanism": {"auth": {"mechanism": "oauth"}},
    "a setting that is not an authentication variable": {"auth": {"settings": {"DATABASE_URL": "x"}}},
    "a root job user (jobs.user: 0)": {"jobs": {"user": 0}},
}.items():

    @check(f"values.schema.json rejects {name}")
    def _(values=values):
        with helm.Chart.load(str(CHART)) as chart:
            try:
                chart.validate_schema(chart.merge_values(values))
            except helm.HelmValuesError as error:
                rejected = str(error).strip().splitlines()[-1].strip()
            else:
                raise AssertionError("accepted")
            try:
                chart.render(values, name=RELEASE, namespace=NAMESPACE)
            except helm.HelmValuesError:
                pass
            else:
                raise AssertionError("helm template accepted it")
        return rejected


def exported_metrics():
    """The metric names the admin port exports: each `register("name", ...)` of src/ops.rs, with
    the registry's `gantry_` prefix."""
    source = (ROOT / "src" / "ops.rs").read_text()
    return {"gantry_" + name for name in re.findall(r'register\(\s*"([a-z_]+)"', source)}


@check("the Grafana dashboard renders, is valid JSON and names only metrics /metrics has")
def _():
    exported = exported_metrics()
    assert {"gantry_jobs", "gantry_job_queue_wait_seconds", "gantry_outbox_lag_seconds"} <= exported, exported
    assert not [obj for obj in objects_of("default", "ConfigMap") if obj["metadata"]["name"].endswith("-dashboard")]
    config_map = one("all features", "ConfigMap", f"{RELEASE}-dashboard")
    assert config_map["metadata"]["labels"].get("grafana_dashboard") == "1", config_map["metadata"]["labels"]
    dashboard = json.loads(config_map["data"]["gantry.json"])
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    named = set()
    for expression in expressions:
        for metric in re.findall(r"gantry_[a-z_]+", expression):
            base = re.sub(r"_(total|bucket|count|sum)$", "", metric)
            assert metric in exported or base in exported, f"the dashboard names {metric}, which /metrics lacks"
            named.add(base if base in exported else metric)
    titles = " ".join(panel["title"] for panel in dashboard["panels"]).lower()
    for subject in ["status", "queue depth", "queue wait", "run time", "reconcile", "failures", "outbox", "http latency"]:
        assert subject in titles, f"no panel about {subject}"
    return f"{len(dashboard['panels'])} panels, {len(named)} metrics"


@check("both roles log JSON by default, export spans when tracing.otlpEndpoint is set, the gateway links traces with tracing.traceLink")
def _():
    for role in ("gateway", "controller"):
        default = config_map_data("default", role)
        assert default["GANTRY_LOG_FORMAT"] == "json", default
        assert not [name for name in default if name.startswith("OTEL_")], default
        configured = config_map_data("all features", role)
        assert configured["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.monitoring:4318", configured
        assert configured["OTEL_TRACES_SAMPLER"] == "parentbased_traceidratio", configured
        assert configured["OTEL_TRACES_SAMPLER_ARG"] == "0.25", configured
    assert config_map_data("all features", "gateway")["GANTRY_TRACE_LINK"] == "https://jaeger.example/trace/{trace_id}"
    assert "GANTRY_TRACE_LINK" not in config_map_data("default", "gateway")


@check("the chart README values table matches values.yaml (tests/helm/values_table.py)")
def _():
    table, problems = values_table.rows()
    assert not problems, "; ".join(problems)
    block = values_table.readme_block(README.read_text())
    assert block is not None, f"charts/gantry/README.md has no {values_table.START} ... {values_table.END} block"
    if block != values_table.markdown(table):
        raise AssertionError("charts/gantry/README.md is out of date: python3 tests/helm/values_table.py --update charts/gantry/README.md")
    return f"{len(table)} values"


print(f"{'FAILED: ' + ', '.join(FAILED) if FAILED else 'all chart checks passed'}")
sys.exit(1 if FAILED else 0)
