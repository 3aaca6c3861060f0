#!/usr/bin/env python3
"""Static checks of the deployment artefacts (run by scripts/check-deploy.sh, part of `make test`).

Kubernetes: renders the example overlay (and the overlay with the KEDA component) with kustomize,
validates every object against the Kubernetes API schemas offline (kubernetes-validate, pinned
Kubernetes version), checks the security and probe settings docs/deployment.md promises, and runs
`hookline config check` on the config the pods would assemble (ConfigMap + endpoints Secret +
environment). Monitoring: `promtool check rules`, `promtool test rules`, the PrometheusRule in step
with the rule file, the Grafana JSON parses. Compose: every hookline service's command is a real
subcommand, every mounted config passes `config check`, health checks and restart policies.
The admin API (both): it has at least one `[[admin.tokens]]` (it refuses to start without), listens
on all interfaces of its pod / container on the port its Service / published port names, is
reachable only from named sources, and no token whose clear text the repository publishes
(the local compose stack's, in docs/deployment.md) opens the Kubernetes example.
The endpoint secrets key (both): every process that reads the endpoint registry (`hookline run …`)
gets HOOKLINE_SECRETS_KEY, the same on each; on Kubernetes from the Secret `hookline-secrets-key`
(never a literal or a ConfigMap), not given to containers that do not need it, and the example
overlay's value is a placeholder the process refuses; the compose stack's local-only key is a
usable key; neither value appears in any other file of the repository.

Which metrics the rules and the dashboard may use is checked against the real binary's /metrics
by tests/it/deploy.rs (it needs a broker and traffic).

Usage: check_deploy.py --hookline BIN --kustomize BIN --kubernetes-validate BIN --promtool BIN
"""

import argparse
import base64
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
KUBERNETES_VERSION = "1.33.0"
OVERLAY = ROOT / "deploy/kubernetes/overlays/example"
KEDA = ROOT / "deploy/kubernetes/components/keda"
# Long-running processes (probes, grace period); the topics Job runs to completion.
STAGES = {"hookline-deduper", "hookline-dispatcher", "hookline-retry-tiers", "hookline-admin"}
# Components that get a PodDisruptionBudget.
COMPONENTS = {"deduper", "dispatcher", "retry-tiers", "admin"}
# `admin.listen`'s default (common/src/config/admin.rs): loopback.
ADMIN_LISTEN_DEFAULT = "127.0.0.1:8090"
# What `hookline admin token` prints: hlk_ + 64 hex digits.
TOKEN_RE = re.compile(r"\bhlk_[0-9a-f]{64}\b")
# The endpoint secrets key (control/src/crypto.rs: environment only, base64 of 32 bytes) and the
# Secret that carries it on Kubernetes.
SECRETS_KEY_ENV = "HOOKLINE_SECRETS_KEY"
SECRETS_OLD_KEYS_ENV = "HOOKLINE_SECRETS_OLD_KEYS"
SECRETS_KEY_SECRET = "hookline-secrets-key"
K8S_KEY_FILE = OVERLAY / "secrets-key.env"
COMPOSE_KEY_FILE = ROOT / "deploy/compose/secrets-key.env"

passed, failed = 0, 0


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"ok    {name}")
    else:
        failed += 1
        print(f"FAIL  {name}{': ' + detail if detail else ''}")


def run(cmd, env=None, cwd=None):
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    return r.returncode, r.stdout + r.stderr


def hookline_env(extra):
    """The environment a hookline process would get: ours without HOOKLINE_*, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOOKLINE_")}
    env.update(extra)
    return env


def duration_secs(text):
    m = re.fullmatch(r"(\d+)(ms|s|m|h)", text)
    if not m:
        raise ValueError(f"unsupported duration {text!r}")
    n, unit = int(m.group(1)), m.group(2)
    return n * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]


def subcommand_ok(hookline, args):
    """A command line is accepted by the binary's argument parser (`… --help` exits 0)."""
    code, out = run([hookline, *args, "--help"], env=hookline_env({}))
    return code == 0, out.strip().splitlines()[-1] if out.strip() else ""


def published_token_hashes():
    """SHA-256 of every clear token (`hlk_…`) written anywhere in the repository's docs and
    deploy files: such a token is known to every reader."""
    files = [ROOT / "README.md", ROOT / "docker-compose.yml", *ROOT.glob("docs/**/*.md"),
             *(p for p in ROOT.glob("deploy/**/*") if p.is_file())]
    return {hashlib.sha256(t.encode()).hexdigest()
            for f in files for t in TOKEN_RE.findall(f.read_text(errors="replace"))}


def read_env_file(path):
    """`KEY=value` lines (kustomize `envs`, compose `env_file`); `#` lines are comments."""
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            env[k.strip()] = v
    return env


def usable_key(text):
    """What the process accepts as HOOKLINE_SECRETS_KEY: standard base64 of exactly 32 bytes."""
    try:
        return len(base64.b64decode(text.strip(), validate=True)) == 32
    except ValueError:
        return False


def files_containing(text, besides):
    """Files of the repository (not target/, not .git/) other than `besides` that contain `text`."""
    found = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in ("target", ".git", "node_modules")]
        for f in filenames:
            path = Path(dirpath, f)
            if path == besides:
                continue
            try:
                if text in path.read_text(errors="ignore"):
                    found.append(str(path.relative_to(ROOT)))
            except OSError:
                pass
    return found


def admin_listen(config, env):
    """`admin.listen` as the process sees it: the environment override, else the file."""
    return env.get("HOOKLINE_ADMIN__LISTEN") or config.get("admin", {}).get("listen", ADMIN_LISTEN_DEFAULT)


def token_hashes(config):
    return {t.get("sha256") for t in config.get("admin", {}).get("tokens", [])}


def render(kustomize, path):
    code, out = run([kustomize, "build", str(path)])
    check(f"kustomize build {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}",
          code == 0, out[-2000:])
    return out if code == 0 else ""


def pod_specs(objects):
    for o in objects:
        spec = o.get("spec", {})
        if o["kind"] in ("Deployment", "StatefulSet", "Job"):
            yield o, spec["template"]["spec"]


def check_kubernetes(args):
    rendered = render(args.kustomize, OVERLAY)
    if not rendered:
        return
    # The overlay plus the optional KEDA component, rendered from a temporary kustomization.
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "kustomization.yaml").write_text(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
            f"resources:\n  - {os.path.relpath(OVERLAY, tmp)}\n"
            f"components:\n  - {os.path.relpath(KEDA, tmp)}\n")
        with_keda = render(args.kustomize, Path(tmp))
    for label, text in (("overlay", rendered), ("overlay + keda", with_keda)):
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            f.write(text)
        code, out = run([args.kubernetes_validate, "--strict", "--quiet",
                         "-k", KUBERNETES_VERSION, f.name])
        os.unlink(f.name)
        errors = [l for l in out.splitlines() if "ERROR" in l]
        check(f"kubernetes-validate --strict -k {KUBERNETES_VERSION} ({label})",
              code == 0 and not errors, "\n".join(errors) or out[-2000:])

    objects = [o for o in yaml.safe_load_all(rendered) if o]
    with_keda_objects = [o for o in yaml.safe_load_all(with_keda) if o]
    by_kind = {}
    for o in objects:
        by_kind.setdefault(o["kind"], []).append(o)

    # The config every pod assembles: ConfigMap hookline.toml + Secret endpoints.toml, with the
    # credentials Secret and the container's env as HOOKLINE_… overrides.
    cm = next(o for o in by_kind["ConfigMap"] if o["metadata"]["name"].startswith("hookline-config"))
    secrets = {o["metadata"]["name"].rsplit("-", 1)[0]: o for o in by_kind["Secret"]}
    decode = lambda o, k: base64.b64decode(o["data"][k]).decode()
    config_text = cm["data"]["hookline.toml"] + "\n" + decode(secrets["hookline-endpoints"], "endpoints.toml")
    secret_env = {name: {k: base64.b64decode(v).decode() for k, v in o.get("data", {}).items()}
                  for name, o in secrets.items()}
    import tomllib
    config = tomllib.loads(config_text)
    listen_port = int(config["server"]["listen"].rsplit(":", 1)[1])
    grace = duration_secs(config.get("dispatcher", {}).get("shutdown_grace", "20s"))
    check("config listens on all interfaces (probes and scrapes reach it)",
          config["server"]["listen"].startswith("0.0.0.0:"), config["server"]["listen"])

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "hookline.toml")
        path.write_text(config_text)
        for o, spec in pod_specs(objects):
            for c in spec.get("initContainers", []) + spec["containers"]:
                env = {e["name"]: e.get("value", "pod-name-0") for e in c.get("env", [])
                       if e["name"] != "HOOKLINE_CONFIG"}
                for ref in c.get("envFrom", []):
                    if "secretRef" in ref:
                        env.update(secret_env.get(ref["secretRef"]["name"].rsplit("-", 1)[0], {}))
                code, out = run([args.hookline, "config", "check", str(path)], env=hookline_env(env))
                check(f"config check with the env of {o['metadata']['name']}/{c['name']}",
                      code == 0, out.strip())

    for o, spec in pod_specs(objects):
        name = o["metadata"]["name"]
        sc = spec.get("securityContext", {})
        check(f"{name}: enableServiceLinks false", spec.get("enableServiceLinks") is False)
        check(f"{name}: no service account token", spec.get("automountServiceAccountToken") is False)
        check(f"{name}: runAsNonRoot with a numeric runAsUser",
              sc.get("runAsNonRoot") is True and isinstance(sc.get("runAsUser"), int) and sc["runAsUser"] > 0)
        check(f"{name}: seccomp RuntimeDefault", sc.get("seccompProfile", {}).get("type") == "RuntimeDefault")
        for c in spec.get("initContainers", []) + spec["containers"]:
            csc = c.get("securityContext", {})
            where = f"{name}/{c['name']}"
            check(f"{where}: read-only root, no privilege escalation, ALL capabilities dropped",
                  csc.get("readOnlyRootFilesystem") is True and csc.get("allowPrivilegeEscalation") is False
                  and csc.get("capabilities", {}).get("drop") == ["ALL"])
            res = c.get("resources", {})
            check(f"{where}: cpu/memory requests and a memory limit",
                  {"cpu", "memory"} <= set(res.get("requests", {})) and "memory" in res.get("limits", {}))
            cmd = c.get("args") or []
            if c.get("command", [None])[0] == "sh":
                # The init container: its script ends in `hookline config check FILE`.
                cmd = c["command"][-1].split("exec hookline ", 1)[1].split()
            ok, out = subcommand_ok(args.hookline, cmd)
            check(f"{where}: `hookline {' '.join(cmd)}` is a real subcommand", ok, out)
        if name not in STAGES:
            continue
        c = spec["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
        check(f"{name}: port `ops` is server.listen's port {listen_port}", ports.get("ops") == listen_port, str(ports))
        rp, lp = c.get("readinessProbe", {}).get("httpGet", {}), c.get("livenessProbe", {}).get("httpGet", {})
        check(f"{name}: readiness /readyz, liveness /healthz on `ops`",
              rp.get("path") == "/readyz" and lp.get("path") == "/healthz"
              and rp.get("port") == "ops" and lp.get("port") == "ops")
        tgp = spec.get("terminationGracePeriodSeconds", 30)
        check(f"{name}: terminationGracePeriodSeconds {tgp} > shutdown_grace {grace:g}s + 10 s", tgp > grace + 10)

    sts = by_kind["StatefulSet"][0]
    env = {e["name"]: e for e in sts["spec"]["template"]["spec"]["containers"][0].get("env", [])}
    iid = env.get("HOOKLINE_KAFKA__INSTANCE_ID", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    check("deduper StatefulSet: kafka.instance_id from the pod name", iid == "metadata.name")
    for kind in ("Deployment",):
        for o in by_kind[kind]:
            names = {e["name"] for e in o["spec"]["template"]["spec"]["containers"][0].get("env", [])}
            check(f"{o['metadata']['name']}: no static membership (pod names change on rollout)",
                  "HOOKLINE_KAFKA__INSTANCE_ID" not in names)
    pdbs = {o["spec"]["selector"]["matchLabels"].get("app.kubernetes.io/component") for o in by_kind["PodDisruptionBudget"]}
    check("a PodDisruptionBudget per stage and the admin API", COMPONENTS <= pdbs, str(pdbs))
    check_services(objects, by_kind)
    check_admin(objects, by_kind, config)
    check_secrets_key(objects, by_kind)
    check("HPA on the dispatcher", any(o["spec"]["scaleTargetRef"]["name"] == "hookline-dispatcher"
                                       for o in by_kind.get("HorizontalPodAutoscaler", [])))
    np = by_kind["NetworkPolicy"][0]["spec"]
    blocks = [t["ipBlock"] for r in np["egress"] for t in r.get("to", []) if "ipBlock" in t]
    check("NetworkPolicy: internet egress excludes cluster-internal ranges",
          any(b["cidr"] == "0.0.0.0/0" and {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"}
              <= set(b.get("except", [])) for b in blocks))
    pm = by_kind["PodMonitor"][0]["spec"]
    check("PodMonitor scrapes the `ops` port", pm["podMetricsEndpoints"][0]["port"] == "ops")
    rule = by_kind["PrometheusRule"][0]["spec"]["groups"]
    alerts = yaml.safe_load((ROOT / "deploy/monitoring/alerts.yaml").read_text())["groups"]
    check("PrometheusRule groups == deploy/monitoring/alerts.yaml", rule == alerts)
    kinds = {o["kind"] for o in with_keda_objects}
    so = [o for o in with_keda_objects if o["kind"] == "ScaledObject"]
    check("keda component: a ScaledObject on the dispatcher replaces the CPU HPA",
          "HorizontalPodAutoscaler" not in kinds and so and so[0]["spec"]["scaleTargetRef"]["name"] == "hookline-dispatcher")


def template_labels(o):
    return o["spec"]["template"]["metadata"].get("labels", {})


def check_services(objects, by_kind):
    """Every Service selects pods, and each of its ports targets a port those pods declare."""
    for svc in by_kind.get("Service", []):
        name = svc["metadata"]["name"]
        selector = svc["spec"].get("selector", {})
        pods = [spec for o, spec in pod_specs(objects)
                if selector and selector.items() <= template_labels(o).items()]
        check(f"Service {name}: selects pods", bool(pods), str(selector))
        declared = {(p.get("name"), p["containerPort"]) for spec in pods
                    for c in spec["containers"] for p in c.get("ports", [])}
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            check(f"Service {name}: port {port.get('name')} ({port['port']}) targets a port of its pods",
                  any(target in pair for pair in declared), f"{target} vs {sorted(declared)}")


def check_admin(objects, by_kind, config):
    """The admin Deployment: tokens, where it listens, its Service and who may reach it."""
    admin = [o for o in by_kind.get("Deployment", []) if o["metadata"]["name"] == "hookline-admin"]
    check("a Deployment hookline-admin", bool(admin))
    if not admin:
        return
    o = admin[0]
    c = o["spec"]["template"]["spec"]["containers"][0]
    check("hookline-admin: runs `hookline run admin` (no --dev: that is for loopback)",
          c.get("args") == ["run", "admin"], str(c.get("args")))
    check("hookline-admin: 2 replicas or more", o["spec"].get("replicas", 1) >= 2)
    tokens = config.get("admin", {}).get("tokens", [])
    check("the assembled config has at least one [[admin.tokens]] (run admin refuses to start without)",
          len(tokens) >= 1)
    published = published_token_hashes() & token_hashes(config)
    check("no [[admin.tokens]] of the overlay belongs to a clear token published in the repository",
          not published, str(published))
    env = {e["name"]: e.get("value", "") for e in c.get("env", [])}
    listen = admin_listen(config, env)
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    check("hookline-admin: admin.listen is on all interfaces of the pod, on port `http`",
          listen.startswith("0.0.0.0:") and ports.get("http") == int(listen.rsplit(":", 1)[1]),
          f"{listen} vs {ports}")
    services = [s for s in by_kind.get("Service", [])
                if s["spec"].get("selector", {}).items() <= template_labels(o).items()
                and s["spec"].get("selector")]
    service_ports = {p.get("name"): p.get("targetPort") for s in services for p in s["spec"]["ports"]}
    check("hookline-admin: a Service with port `http` (the API) and `ops` (metrics)",
          service_ports.get("http") == "http" and service_ports.get("ops") == "ops", str(service_ports))
    rules = [r for np in by_kind.get("NetworkPolicy", [])
             if np["spec"]["podSelector"].get("matchLabels", {}).items() <= template_labels(o).items()
             for r in np["spec"].get("ingress", [])]
    admitting = [r for r in rules if any(p.get("port") in (ports.get("http"), "http") for p in r.get("ports", []))]
    check("NetworkPolicy: the admin API port is admitted, from named sources only",
          bool(admitting) and all(r.get("from") for r in admitting), str(admitting))


def key_sources(c, secret_data, configmap_data):
    """Where container `c` gets the endpoint secrets keys from: ("secret", name) / ("configmap",
    name) / ("literal", variable), one entry per source."""
    names = (SECRETS_KEY_ENV, SECRETS_OLD_KEYS_ENV)
    sources = []
    for ref in c.get("envFrom", []):
        for kind, field, data in (("secret", "secretRef", secret_data),
                                  ("configmap", "configMapRef", configmap_data)):
            name = ref.get(field, {}).get("name")
            if name and any(n in data.get(name, {}) for n in names):
                sources.append((kind, name.rsplit("-", 1)[0]))
    for e in c.get("env", []):
        if e["name"] in names:
            vf = e.get("valueFrom", {})
            if "secretKeyRef" in vf:
                sources.append(("secret", vf["secretKeyRef"]["name"].rsplit("-", 1)[0]))
            elif "configMapKeyRef" in vf:
                sources.append(("configmap", vf["configMapKeyRef"]["name"]))
            else:
                sources.append(("literal", e["name"]))
    return sources


def check_secrets_key(objects, by_kind):
    """HOOKLINE_SECRETS_KEY on Kubernetes: from the Secret hookline-secrets-key in every process
    that reads the endpoint registry, nowhere else, never a literal or a ConfigMap; the example's
    value a placeholder that no process accepts and that no other file repeats."""
    secret_data = {o["metadata"]["name"]: o.get("data", {}) for o in by_kind.get("Secret", [])}
    configmaps = by_kind.get("ConfigMap", [])
    for cm in configmaps:
        data = cm.get("data", {})
        check(f"ConfigMap {cm['metadata']['name']}: no endpoint secrets key in it",
              not any(k in (SECRETS_KEY_ENV, SECRETS_OLD_KEYS_ENV) or SECRETS_KEY_ENV + "=" in v
                      for k, v in data.items()))
    configmap_data = {cm["metadata"]["name"]: cm.get("data", {}) for cm in configmaps}
    for o, spec in pod_specs(objects):
        for c in spec.get("initContainers", []) + spec["containers"]:
            where = f"{o['metadata']['name']}/{c['name']}"
            sources = key_sources(c, secret_data, configmap_data)
            bad = [s for s in sources if s[0] != "secret"]
            check(f"{where}: the endpoint secrets key is never a literal or from a ConfigMap", not bad, str(bad))
            # `hookline run …` reads (and seeds) the endpoint registry, except `run deduper`;
            # init containers and the topics Job (`config check`, `topics apply`) never do, so
            # they do not get the key (scripts/check_k8s_run.py shows each one that gets it uses it).
            args = c.get("args") or [None]
            reads_registry = c in spec["containers"] and args[0] == "run" and args[1:2] != ["deduper"]
            if reads_registry:
                # From that one Secret only: the same key in every process.
                check(f"{where}: {SECRETS_KEY_ENV} from the Secret {SECRETS_KEY_SECRET} (only)",
                      bool(sources) and all(s == ("secret", SECRETS_KEY_SECRET) for s in sources),
                      str(sources))
            else:
                check(f"{where}: no endpoint secrets key (it does not read the endpoint registry)",
                      not sources, str(sources))
    example = read_env_file(K8S_KEY_FILE).get(SECRETS_KEY_ENV, "") if K8S_KEY_FILE.exists() else ""
    rendered = [base64.b64decode(d[SECRETS_KEY_ENV]).decode() for name, d in secret_data.items()
                if name.rsplit("-", 1)[0] == SECRETS_KEY_SECRET and SECRETS_KEY_ENV in d]
    check(f"Secret {SECRETS_KEY_SECRET}: generated from {K8S_KEY_FILE.relative_to(ROOT)}",
          bool(example) and rendered == [example], f"{len(rendered)} rendered")
    check(f"{K8S_KEY_FILE.relative_to(ROOT)}: a placeholder the process refuses (not base64 of 32 "
          "bytes), so a copied overlay never runs with a key everyone knows",
          bool(example) and not usable_key(example))
    reused = files_containing(example, K8S_KEY_FILE) if example else []
    check("the example overlay's secrets key value appears in no other file", not reused, str(reused))


def check_monitoring(args):
    rules = ROOT / "deploy/monitoring/alerts.yaml"
    code, out = run([args.promtool, "check", "rules", str(rules)])
    check("promtool check rules deploy/monitoring/alerts.yaml", code == 0, out)
    code, out = run([args.promtool, "test", "rules", "alerts.test.yaml"], cwd=ROOT / "deploy/monitoring")
    check("promtool test rules deploy/monitoring/alerts.test.yaml", code == 0, out)
    doc = (ROOT / "docs/operations.md").read_text() if (ROOT / "docs/operations.md").exists() else ""
    for group in yaml.safe_load(rules.read_text())["groups"]:
        for r in group["rules"]:
            anchor = r["annotations"].get("runbook_url", "").split("#")[-1]
            check(f"runbook entry for {r['alert']}",
                  anchor == r["alert"].lower() and f"### {r['alert']}" in doc, anchor)
    try:
        dash = json.loads((ROOT / "deploy/monitoring/grafana-dashboard.json").read_text())
        check("Grafana dashboard parses", bool(dash.get("panels")))
    except ValueError as e:
        check("Grafana dashboard parses", False, str(e))


def check_compose(args):
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    subnets = [c["subnet"] for n in compose.get("networks", {}).values() if n
               for c in n.get("ipam", {}).get("config", [])]
    for name, svc in services.items():
        uses_hookline = "build" in svc or str(svc.get("image", "")).startswith("hookline")
        check(f"compose {name}: restart policy", "restart" in svc)
        for port in svc.get("ports", []):
            check(f"compose {name}: port {port} published on the host's loopback only",
                  str(port).startswith("127.0.0.1:"))
        for dep in svc.get("depends_on", {}):
            check(f"compose {name}: depends on existing service {dep}", dep in services)
        for v in svc.get("volumes", []):
            source = v.split(":")[0]
            if not source.startswith("."):
                check(f"compose {name}: volume {source} declared", source in (compose.get("volumes") or {}))
        if not uses_hookline:
            continue
        ok, out = subcommand_ok(args.hookline, svc["command"])
        check(f"compose {name}: `hookline {' '.join(svc['command'])}` is a real subcommand", ok, out)
        env = service_env(svc)
        for v in svc.get("volumes", []):
            source, target = v.split(":")[:2]
            if source.endswith(".toml"):
                path = ROOT / source
                code, out = run([args.hookline, "config", "check", str(path)], env=hookline_env(env))
                check(f"compose {name}: mounted {source} passes config check", code == 0, out.strip())
                import tomllib
                cfg = tomllib.loads(path.read_text())
                allowed = cfg.get("http", {}).get("allow_cidrs", [])
                check(f"compose {name}: SSRF allow-list is the compose network only",
                      allowed and set(allowed) <= set(subnets), f"{allowed} vs {subnets}")
                receiver_secret = services.get("receiver", {}).get("command", [])
                demo = [e for e in cfg.get("endpoints", []) if e["id"] == "demo"]
                if demo and "--secret" in receiver_secret:
                    s = receiver_secret[receiver_secret.index("--secret") + 1]
                    check(f"compose {name}: the receiver verifies the demo endpoint's secret", s in demo[0]["secrets"])
    for name in ("kafka", "hookline", "receiver", "admin"):
        check(f"compose {name}: health check", "healthcheck" in services.get(name, {}))
    check_compose_admin(services)
    check_compose_secrets_key(services)
    kafka_volumes = services["kafka"].get("volumes", [])
    check("compose kafka: data on a named volume (the DLQ survives `down`)",
          any(v.split(":")[1] == services["kafka"]["environment"].get("KAFKA_LOG_DIRS") for v in kafka_volumes))


def service_env(svc):
    """A compose service's environment: its `env_file`s, then `environment` (which wins)."""
    env = {}
    files = svc.get("env_file", [])
    for f in [files] if isinstance(files, str) else files:
        env.update(read_env_file(ROOT / (f if isinstance(f, str) else f["path"])))
    environment = svc.get("environment") or {}
    if isinstance(environment, list):
        environment = dict(e.split("=", 1) for e in environment)
    env.update({k: str(v) for k, v in environment.items()})
    return env


def check_compose_secrets_key(services):
    """Every compose service with a hookline config has the same usable endpoint secrets key,
    from the local-stack-only env file, which no other file repeats; the receiver (someone
    else's server) has none."""
    keys = {}
    for name, svc in services.items():
        mounts_config = any(v.split(":")[0].endswith(".toml") for v in svc.get("volumes", []))
        key = service_env(svc).get(SECRETS_KEY_ENV)
        if mounts_config:
            check(f"compose {name}: {SECRETS_KEY_ENV} is set", bool(key))
            keys[name] = key
        elif "build" in svc or str(svc.get("image", "")).startswith("hookline"):
            check(f"compose {name}: no endpoint secrets key (no hookline config)", key is None)
    values = set(keys.values())
    check("compose: one endpoint secrets key for every hookline service", len(values) == 1, str(sorted(keys)))
    key = next(iter(values), None) or ""
    text = COMPOSE_KEY_FILE.read_text() if COMPOSE_KEY_FILE.exists() else ""
    check(f"compose: the key comes from {COMPOSE_KEY_FILE.relative_to(ROOT)}, marked LOCAL STACK ONLY",
          bool(key) and read_env_file(COMPOSE_KEY_FILE).get(SECRETS_KEY_ENV) == key and "LOCAL STACK ONLY" in text)
    check("compose: the key is usable (base64 of 32 bytes)", usable_key(key))
    reused = files_containing(key, COMPOSE_KEY_FILE) if key else []
    check("compose: the local stack's key appears in no other file", not reused, str(reused))
    example = read_env_file(K8S_KEY_FILE).get(SECRETS_KEY_ENV) if K8S_KEY_FILE.exists() else None
    check("compose: the local stack's key is not the Kubernetes example's", key != example)


def check_compose_admin(services):
    """The compose `admin` service: `run admin`, reachable from the host's loopback on the port
    it listens on, with a token whose clear text docs/deployment.md gives for the local stack."""
    import tomllib
    svc = services.get("admin")
    check("compose admin: a service running `hookline run admin`",
          bool(svc) and svc.get("command") == ["run", "admin"], str(svc and svc.get("command")))
    if not svc:
        return
    env = service_env(svc)
    configs = [v.split(":")[0] for v in svc.get("volumes", []) if v.split(":")[0].endswith(".toml")]
    check("compose admin: mounts a config", len(configs) == 1, str(configs))
    if len(configs) != 1:
        return
    cfg = tomllib.loads((ROOT / configs[0]).read_text())
    listen = admin_listen(cfg, env)
    port = listen.rsplit(":", 1)[1]
    check("compose admin: admin.listen is on all interfaces of its container", listen.startswith("0.0.0.0:"), listen)
    check(f"compose admin: port {port} published on 127.0.0.1 of the host",
          f"127.0.0.1:{port}:{port}" in [str(p) for p in svc.get("ports", [])], str(svc.get("ports")))
    check("compose admin: the config has at least one [[admin.tokens]] (run admin refuses to start without)",
          bool(token_hashes(cfg)))
    doc = (ROOT / "docs/deployment.md").read_text()
    compose_section = doc.split("\n## Docker Compose", 1)[-1].split("\n## ", 1)[0]
    clear = TOKEN_RE.findall(compose_section)
    check("compose admin: the clear token in docs/deployment.md \"Docker Compose\" opens it",
          bool(clear) and all(hashlib.sha256(t.encode()).hexdigest() in token_hashes(cfg) for t in clear),
          f"{len(clear)} token(s) in the section")


def main():
    p = argparse.ArgumentParser()
    for tool in ("hookline", "kustomize", "kubernetes-validate", "promtool"):
        p.add_argument(f"--{tool}", required=True)
    args = p.parse_args()
    for section in (check_kubernetes, check_monitoring, check_compose):
        print(f"--- {section.__name__.removeprefix('check_')}")
        try:
            section(args)
        except Exception as e:  # a broken artefact must fail the run, not stop the report
            check(f"{section.__name__} ran", False, f"{type(e).__name__}: {e}")
    print(f"check-deploy: {passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
