#!/usr/bin/env python3
"""Runs the Kubernetes example overlay for real, from the built container image, with `docker run`.

scripts/check_deploy.py checks the manifests statically; this one runs them. It renders
deploy/kubernetes/overlays/example with kustomize and emulates one pod of every workload (the Job
`hookline-topics` first, then the StatefulSet and the Deployments) the way a kubelet would, taking
everything from the rendered manifests, nothing hard-coded:

- every init container to completion, in order, then the container: `command` replaces the image's
  ENTRYPOINT, `args` its CMD, `$(VAR)` expanded;
- the environment: the Service variables of every Service with a cluster IP (made-up IPs, see
  below), then `envFrom` (Secret data is base64), then `env` (`value`, `secretKeyRef`,
  `configMapKeyRef`, `fieldRef` metadata.name/namespace…), later ones winning as on Kubernetes;
- volumes: configMap / secret volumes written to a temporary directory (keys or `items` as file
  names) and mounted read-only; an emptyDir is one docker volume per pod (tmpfs for
  `medium: Memory`, of `sizeLimit`), mode 0777 as the kubelet makes it (group `fsGroup` + setgid
  when the pod sets one), shared by the init containers and the container, and held mounted by a
  sandbox container for the pod's lifetime (as the kubelet's pause container: docker unmounts a
  tmpfs volume, losing its files, when no container uses it);
- the securityContext as Kubernetes enforces it: `--user runAsUser:runAsGroup` (pod, overridden by
  container), runAsNonRoot verified, supplementalGroups / fsGroup as extra groups, `--read-only`,
  capabilities dropped / added, `--security-opt no-new-privileges` when allowPrivilegeEscalation is
  false, seccomp RuntimeDefault = the runtime's default profile (docker's); memory limits as cgroup
  limits, cpu requests as shares; no service account token is mounted (the pod spec's
  automountServiceAccountToken: false is checked);
- probes from the host, on the pod's IP on --network (127.0.0.1 with --network host): startup,
  readiness, liveness at their httpGet path and port (named ports resolved through the
  container's `ports`), honouring initialDelaySeconds / periodSeconds / timeoutSeconds /
  failureThreshold (success = HTTP 200-399, as the kubelet); readiness must succeed within its
  window, at least --ready-floor seconds (consumer-group joins take seconds); liveness must
  succeed before failureThreshold consecutive failures;
- the process is the one the manifest names (/proc/1/cmdline) and runs with the identity and
  restrictions above (/proc/1/status: uid, gid, CapEff, NoNewPrivs, Seccomp);
- every Service selecting the pod answers on its target ports, the PodMonitor's endpoint serves
  metrics;
- `docker stop` (SIGTERM, then SIGKILL after terminationGracePeriodSeconds): exit 0 within the grace.

The example overlay is written for a production cluster; the test adjustments (printed as ADJUST,
each with its reason) are: the image (--image), the network (--network), the Kafka bootstrap
(--bootstrap, as HOOKLINE_KAFKA__BOOTSTRAP_SERVERS), a PLAINTEXT broker instead of the overlay's
SASL_SSL (security.protocol and sasl.* removed from the ConfigMap's [kafka.options], the SCRAM
password dropped from the credentials Secret), a replication factor the test broker can hold, a
unique topic prefix per run, the endpoint secrets key from --secrets-key-file instead of the
overlay's placeholder (every container given the placeholder is run once with it and must refuse
to start, naming it), and the Service variables of every Service although the pods set
enableServiceLinks: false (proves hookline ignores them, should an overlay turn links on).
Not emulated: NetworkPolicy, PodDisruptionBudget, HPA, scheduling, more than one replica,
restarts (a failure here is a failure, where a kubelet would retry).

Needs a Docker engine (this host's: the volumes are bind mounts of local temporary directories),
the image, a broker reachable from --network, kustomize. Cleans up its containers, volumes and
files on exit, Ctrl-C included; the topics (prefix printed) stay on the broker.

Usage: check_k8s_run.py --image hookline:local --kustomize BIN --network NET --bootstrap HOST:PORT
                        [--secrets-key-file deploy/compose/secrets-key.env]
  e.g. --network host --bootstrap 127.0.0.1:9092 (workloads one at a time: they share the host's
  ports), or a user-defined bridge network where the broker answers as kafka:9092 (together).
"""

import argparse
import base64
import json
import os
import random
import re
import shutil
import signal
import socket
import ssl
import string
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
# Definitions only (check_deploy.py does its work in main()).
from check_deploy import OVERLAY, ROOT, SECRETS_KEY_ENV, read_env_file, usable_key  # noqa: E402

LABEL = "hookline.check-k8s-run"
# The order a `kubectl apply` reader expects: the Job first, then the pipeline's stages.
ORDER = ["hookline-topics", "hookline-deduper", "hookline-dispatcher", "hookline-retry-tiers",
         "hookline-admin"]
KIND_RANK = {"Job": 0, "StatefulSet": 1, "Deployment": 2}
# The `kubernetes` Service of namespace default: the kubelet injects its variables into every
# container, enableServiceLinks or not.
KUBERNETES_SERVICE = {"metadata": {"name": "kubernetes"},
                      "spec": {"clusterIP": "10.96.0.1",
                               "ports": [{"name": "https", "port": 443, "protocol": "TCP"}]}}
# Pod and container fields this emulation handles, or knowingly leaves to the cluster (scheduling,
# identity); any other field fails the run rather than being ignored silently.
POD_FIELDS = {"containers", "initContainers", "volumes", "securityContext",
              "terminationGracePeriodSeconds", "automountServiceAccountToken",
              "enableServiceLinks", "restartPolicy"}
POD_FIELDS_CLUSTER_ONLY = {"serviceAccountName", "serviceAccount", "topologySpreadConstraints",
                           "affinity", "nodeSelector", "tolerations", "priorityClassName",
                           "schedulerName", "dnsPolicy", "hostname", "subdomain"}
CONTAINER_FIELDS = {"name", "image", "imagePullPolicy", "command", "args", "env", "envFrom", "ports",
                    "readinessProbe", "livenessProbe", "startupProbe", "securityContext",
                    "resources", "volumeMounts", "workingDir", "terminationMessagePath",
                    "terminationMessagePolicy"}
NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                       urllib.request.HTTPSHandler(context=ssl._create_unverified_context()))

DOCKER = "docker"  # its full path, once main() has found it
lock = threading.Lock()
stopping = threading.Event()
passed, failed = 0, 0


def say(line):
    with lock:
        print(line, flush=True)


def check(name, ok, detail=""):
    """One PASS/FAIL line; `detail` (why) is printed on failure only."""
    global passed, failed
    ok = bool(ok)
    with lock:
        if ok:
            passed += 1
        else:
            failed += 1
        detail = f": {detail}" if detail and not ok else ""
        print(f"{'PASS' if ok else 'FAIL'}  {name}{detail}", flush=True)
    return ok


def adjust(text):
    say(f"ADJUST {text}")


def note(text):
    say(f"note   {text}")


def docker(*args, env=None, timeout=60):
    """`docker …` → (exit code, stdout, stderr); a hung call counts as failed."""
    try:
        r = subprocess.run([DOCKER, *args], capture_output=True, text=True, env=env, timeout=timeout)
        return r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired:
        return 124, "", f"docker {args[0]}: no answer within {timeout} s"


def indent(text, n=20):
    lines = text.strip().splitlines()[-n:]
    return "\n" + "\n".join("        " + l for l in lines) if lines else " (no output)"


def quantity(text):
    """A Kubernetes quantity (`1Mi`, `512Mi`, `250m`, `2`) as a number (bytes, cores)."""
    m = re.fullmatch(r"([0-9.]+(?:e[0-9]+)?)([KMGTPE]i?|m|k)?", str(text))
    if not m:
        raise ValueError(f"quantity {text!r}")
    n, unit = float(m.group(1)), m.group(2) or ""
    if unit == "m":
        return n / 1000
    powers = {"k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
              "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
    return n * powers.get(unit, 1)


def expand(text, env):
    """Kubernetes' `$(VAR)` expansion in env values, command and args: a defined variable is
    replaced, an undefined reference stays as written, `$$` is a literal `$`."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("$(", i) and text.find(")", i) > 0:
            j = text.find(")", i)
            name = text[i + 2:j]
            out.append(env[name] if name in env else text[i:j + 1])
            i = j + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def random_suffix(n):
    # The alphabet of Kubernetes' generated names (no vowels, no look-alike digits).
    return "".join(random.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(n))


def service_env(services, cluster_ips):
    """The variables the kubelet injects for Services (pkg/kubelet/envvars): per Service with a
    cluster IP, `<NAME>_SERVICE_HOST`, `_SERVICE_PORT` (first port), `_SERVICE_PORT_<PORTNAME>`,
    and the Docker-link style `<NAME>_PORT`, `<NAME>_PORT_<P>_<PROTO>[_PROTO|_PORT|_ADDR]`."""
    env = {}
    for svc in services:
        ip = cluster_ips.get(svc["metadata"]["name"])
        if not ip:
            continue  # headless (clusterIP: None): no variables
        name = svc["metadata"]["name"].upper().replace("-", "_")
        ports = svc["spec"].get("ports", [])
        env[f"{name}_SERVICE_HOST"] = ip
        if ports:
            env[f"{name}_SERVICE_PORT"] = str(ports[0]["port"])
        for p in ports:
            if p.get("name"):
                env[f"{name}_SERVICE_PORT_{p['name'].upper().replace('-', '_')}"] = str(p["port"])
        for k, p in enumerate(ports):
            proto = p.get("protocol", "TCP")
            url = f"{proto.lower()}://{ip}:{p['port']}"
            if k == 0:
                env[f"{name}_PORT"] = url
            base = f"{name}_PORT_{p['port']}_{proto.upper()}"
            env[base] = url
            env[f"{base}_PROTO"] = proto.lower()
            env[f"{base}_PORT"] = str(p["port"])
            env[f"{base}_ADDR"] = ip
    return env


def probe_once(probe, host, ports, container):
    """One probe as the kubelet runs it → (success, what it saw)."""
    timeout = probe.get("timeoutSeconds", 1)
    if "httpGet" in probe:
        h = probe["httpGet"]
        port = ports.get(h["port"], h["port"]) if isinstance(h["port"], str) else h["port"]
        url = f"{h.get('scheme', 'HTTP').lower()}://{h.get('host', host)}:{port}{h.get('path', '/')}"
        req = urllib.request.Request(url, headers={x["name"]: x["value"] for x in h.get("httpHeaders", [])})
        try:
            with NO_PROXY.open(req, timeout=timeout) as r:
                return 200 <= r.status < 400, f"{r.status} {r.read(200).decode(errors='replace').strip()}"
        except urllib.error.HTTPError as e:
            return 200 <= e.code < 400, f"{e.code} {e.read(200).decode(errors='replace').strip()}"
        except Exception as e:  # refused, timed out, reset
            return False, f"{type(e).__name__}: {e}"
    if "tcpSocket" in probe:
        t = probe["tcpSocket"]
        port = ports.get(t["port"], t["port"]) if isinstance(t["port"], str) else t["port"]
        try:
            socket.create_connection((t.get("host", host), port), timeout=timeout).close()
            return True, "connected"
        except OSError as e:
            return False, str(e)
    if "exec" in probe:
        code, out, err = docker("exec", container, *probe["exec"]["command"], timeout=timeout + 5)
        return code == 0, f"exit {code} {(out + err).strip()[:200]}"
    return False, f"unsupported probe {sorted(probe)}"


class Cluster:
    """The rendered overlay with the test adjustments: Secrets, ConfigMaps, Services, workloads."""

    def __init__(self, objects, args):
        self.args = args
        self.namespace = "default"
        self.secrets, self.configmaps, self.services, self.workloads = {}, {}, [], []
        self.podmonitors = []
        for o in objects:
            kind, name = o["kind"], o["metadata"]["name"]
            self.namespace = o["metadata"].get("namespace", self.namespace)
            if kind == "Secret":
                data = {k: base64.b64decode(v).decode() for k, v in (o.get("data") or {}).items()}
                data.update(o.get("stringData") or {})
                self.secrets[name] = data
            elif kind == "ConfigMap":
                data = dict(o.get("data") or {})
                data.update({k: base64.b64decode(v).decode() for k, v in (o.get("binaryData") or {}).items()})
                self.configmaps[name] = data
            elif kind == "Service":
                self.services.append(o)
            elif kind == "PodMonitor":
                self.podmonitors.append(o)
            elif kind in KIND_RANK:
                self.workloads.append(o)
            elif kind in ("CronJob", "DaemonSet", "ReplicaSet", "Pod"):
                check(f"{kind} {name} is emulated", False, "this script runs Jobs, StatefulSets and Deployments")
        self.workloads.sort(key=lambda o: (KIND_RANK[o["kind"]],
                                           ORDER.index(o["metadata"]["name"]) if o["metadata"]["name"] in ORDER else 99))
        # Made-up cluster IPs, as a Service CIDR 10.96.0.0/12 would hand them out.
        self.cluster_ips = {"kubernetes": "10.96.0.1"}
        for k, svc in enumerate(self.services):
            ip = svc["spec"].get("clusterIP")
            if ip != "None":
                self.cluster_ips[svc["metadata"]["name"]] = ip or f"10.96.0.{10 + k}"
        self.service_env = service_env([KUBERNETES_SERVICE, *self.services], self.cluster_ips)
        self.original_secrets = {k: dict(v) for k, v in self.secrets.items()}
        self.extra_env = {}

    def config(self):
        """The hookline config of the ConfigMap (the one with a [kafka] table)."""
        for name, data in self.configmaps.items():
            for key, text in data.items():
                try:
                    doc = tomllib.loads(text)
                except tomllib.TOMLDecodeError:
                    continue
                if "kafka" in doc:
                    return f"ConfigMap {name} key {key}", doc
        return None, {}

    def strip_kafka_security(self):
        """Removes security.protocol, sasl.* and ssl.* from the config's [kafka.options] (line by
        line, then verified: the parsed config must differ by exactly those keys) → their names."""
        for name, data in self.configmaps.items():
            for key, text in data.items():
                try:
                    doc = tomllib.loads(text)
                except tomllib.TOMLDecodeError:
                    continue
                options = doc.get("kafka", {}).get("options", {})
                drop = sorted(k for k in options if k == "security.protocol" or k.startswith(("sasl.", "ssl.")))
                if "kafka" not in doc or not drop:
                    continue
                table, lines = None, []
                for line in text.splitlines(keepends=True):
                    m = re.match(r"\s*\[\s*([^\]]+?)\s*\]", line)
                    if m and not line.lstrip().startswith("[["):
                        table = m.group(1).replace(" ", "")
                    k = re.match(r'\s*"?([A-Za-z0-9_.-]+)"?\s*=', line)
                    if table == "kafka.options" and k and k.group(1) in drop:
                        continue
                    lines.append(line)
                new = "".join(lines)
                want = json.loads(json.dumps(doc))
                for k in drop:
                    del want["kafka"]["options"][k]
                if tomllib.loads(new) != want:
                    return []
                data[key] = new
                return drop
        return []

    def apply_test_adjustments(self):
        a = self.args
        images = sorted({c["image"] for w in self.workloads
                         for c in w["spec"]["template"]["spec"].get("initContainers", [])
                         + w["spec"]["template"]["spec"]["containers"]})
        adjust(f"image {', '.join(images)} → {a.image} (the image under test)")
        adjust(f"network: every container on --network {a.network}"
               + (" (the host's: workloads one at a time, probes on 127.0.0.1)" if a.network == "host" else
                  " (probes on each container's IP on it, from the host)"))
        where, config = self.config()
        kafka = config.get("kafka", {})
        options = kafka.get("options", {})
        self.extra_env["HOOKLINE_KAFKA__BOOTSTRAP_SERVERS"] = a.bootstrap
        adjust(f"HOOKLINE_KAFKA__BOOTSTRAP_SERVERS={a.bootstrap} on every container "
               f"(the overlay's {kafka.get('bootstrap_servers')!r} is a cluster DNS name)")
        protocol = options.get("security.protocol", "PLAINTEXT")
        plaintext = a.kafka_security_protocol.upper() == "PLAINTEXT"
        if plaintext and protocol.upper() != "PLAINTEXT":
            # The overlay talks TLS + SCRAM to its broker: its security settings are in the
            # ConfigMap ([kafka.options]) and its password in the Secret (kafka-credentials.env).
            # A PLAINTEXT broker takes neither; left in place, librdkafka warns about every client.
            removed = self.strip_kafka_security()
            if removed:
                adjust(f"{where}: removed [kafka.options] {', '.join(removed)} (the overlay's TLS + "
                       "SCRAM to a Strimzi listener; the test broker speaks PLAINTEXT)")
            else:
                self.extra_env["HOOKLINE_KAFKA__OPTIONS__SECURITY_PROTOCOL"] = "PLAINTEXT"
                adjust(f"HOOKLINE_KAFKA__OPTIONS__SECURITY_PROTOCOL=PLAINTEXT on every container "
                       f"({where} sets {protocol!r}; the test broker speaks PLAINTEXT)")
        elif protocol.upper() != a.kafka_security_protocol.upper():
            self.extra_env["HOOKLINE_KAFKA__OPTIONS__SECURITY_PROTOCOL"] = a.kafka_security_protocol
            adjust(f"HOOKLINE_KAFKA__OPTIONS__SECURITY_PROTOCOL={a.kafka_security_protocol} on every "
                   f"container ({where} sets {protocol!r})")
        if plaintext:
            for name, data in self.secrets.items():
                creds = [k for k in data if re.match(r"HOOKLINE_KAFKA__OPTIONS__(SASL|SSL)_", k)]
                for k in creds:
                    del data[k]
                if creds:
                    adjust(f"Secret {name}: dropped {', '.join(creds)} (all that the overlay's "
                           "kafka-credentials.env sets: the SCRAM password; a PLAINTEXT broker "
                           "takes no credentials)")
        rf = config.get("topics", {}).get("replication_factor", 1)
        if rf > a.replication_factor:
            self.extra_env["HOOKLINE_TOPICS__REPLICATION_FACTOR"] = str(a.replication_factor)
            adjust(f"HOOKLINE_TOPICS__REPLICATION_FACTOR={a.replication_factor} on every container: "
                   f"{where} asks for {rf} replicas, the test broker has --replication-factor "
                   f"{a.replication_factor} broker(s) (`topics apply` would fail)")
            isr = config.get("topics", {}).get("min_insync_replicas")
            if isr and isr > a.replication_factor:
                self.extra_env["HOOKLINE_TOPICS__MIN_INSYNC_REPLICAS"] = str(a.replication_factor)
                adjust(f"HOOKLINE_TOPICS__MIN_INSYNC_REPLICAS={a.replication_factor} (follows the above)")
        self.extra_env["HOOKLINE_TOPICS__PREFIX"] = a.prefix
        adjust(f"HOOKLINE_TOPICS__PREFIX={a.prefix} on every container (a fresh set of topics and "
               f"consumer groups per run; the overlay's is {config.get('topics', {}).get('prefix')!r})")
        key = read_env_file(Path(a.secrets_key_file)).get(SECRETS_KEY_ENV, "")
        check(f"{a.secrets_key_file} has a usable {SECRETS_KEY_ENV} (base64 of 32 bytes)", usable_key(key))
        for name, data in self.secrets.items():
            if SECRETS_KEY_ENV in data:
                self.placeholder_key = data[SECRETS_KEY_ENV]
                data[SECRETS_KEY_ENV] = key
                adjust(f"Secret {name}: {SECRETS_KEY_ENV} = the value in {a.secrets_key_file} (the "
                       "overlay's is a placeholder the processes refuse by design; checked below)")
        links = [s["metadata"]["name"] for s in self.services if self.cluster_ips.get(s["metadata"]["name"])]
        off = all(w["spec"]["template"]["spec"].get("enableServiceLinks") is False for w in self.workloads)
        adjust(f"Service variables of {', '.join(['kubernetes', *links])} injected into every container"
               + (" although every pod sets enableServiceLinks: false (a kubelet would inject only "
                  "KUBERNETES_*): hookline must ignore the HOOKLINE_<SERVICE>_… ones, should an "
                  "overlay turn links on" if off else "")
               + f"; made-up cluster IPs {', '.join(f'{k}={v}' for k, v in self.cluster_ips.items())}")
        adjust("one pod per workload (replicas, HPA, PDB, NetworkPolicy and scheduling are the "
               "cluster's: not emulated)")


class Pod:
    """One emulated pod of a workload."""

    def __init__(self, cluster, workload, run_id, tmp, placeholder_key=False):
        self.cluster, self.workload = cluster, workload
        self.kind, self.name = workload["kind"], workload["metadata"]["name"]
        self.spec = workload["spec"]["template"]["spec"]
        self.labels = workload["spec"]["template"]["metadata"].get("labels", {})
        self.placeholder_key = placeholder_key
        self.pod_name = {"StatefulSet": f"{self.name}-0",
                         "Job": f"{self.name}-{random_suffix(5)}"}.get(
            self.kind, f"{self.name}-{random_suffix(10)}-{random_suffix(5)}")
        self.run_id = run_id
        self.tmp = Path(tmp, self.pod_name + ("-placeholder" if placeholder_key else ""))
        self.host_network = cluster.args.network == "host"
        self.containers, self.volumes = [], []  # docker names, for the cleanup
        self.mounts = {}  # volume name → (type, source, kubelet-style read-only)
        self.main = self.spec["containers"][0]
        self.main_name = None
        self.ip = None
        self.ready_after = None
        self.ok = True
        self.exited = False

    def where(self, c=None):
        return f"{self.kind} {self.name}" + (f"/{c['name']}" if c else "")

    def fail(self, what, detail=""):
        self.ok = False
        return check(what, False, detail)

    # ---- the pod spec → docker ----------------------------------------------------------

    def check_fields(self):
        unknown = set(self.spec) - POD_FIELDS - POD_FIELDS_CLUSTER_ONLY
        ok = check(f"{self.where()}: every pod field is emulated or the cluster's",
                   not unknown, f"not emulated: {sorted(unknown)}")
        for c in self.spec.get("initContainers", []) + self.spec["containers"]:
            extra = set(c) - CONTAINER_FIELDS
            if c in self.spec.get("initContainers", []) and c.get("restartPolicy") == "Always":
                extra.add("restartPolicy: Always (sidecar)")
            if extra:
                ok = check(f"{self.where(c)}: every container field is emulated", False,
                           f"not emulated: {sorted(extra)}")
        if len(self.spec["containers"]) > 1:
            ok = check(f"{self.where()}: one container per pod", False, "more are not emulated")
        check(f"{self.where()}: automountServiceAccountToken false: no service account token "
              "(none mounted here)", self.spec.get("automountServiceAccountToken") is False,
              f"the pod spec says {self.spec.get('automountServiceAccountToken')!r}; a token would "
              "be mounted at /var/run/secrets/kubernetes.io/serviceaccount (not emulated)")
        return ok

    def make_volumes(self):
        sc = self.spec.get("securityContext", {})
        fs_group = sc.get("fsGroup")
        for v in self.spec.get("volumes", []):
            name = v["name"]
            if "configMap" in v or "secret" in v:
                src = v.get("configMap") or v.get("secret")
                ref = src.get("name") or src.get("secretName")
                data = (self.cluster.configmaps if "configMap" in v else self.cluster.secrets).get(ref)
                if data is None:
                    if src.get("optional"):
                        data = {}
                    else:
                        return self.fail(f"{self.where()}: volume {name}: "
                                         f"{'ConfigMap' if 'configMap' in v else 'Secret'} {ref} exists")
                if "secret" in v and self.placeholder_key:
                    data = self.cluster.original_secrets.get(ref, data)
                d = self.tmp / "volumes" / name
                d.mkdir(parents=True)
                os.chmod(d, 0o755)
                items = src.get("items") or [{"key": k, "path": k} for k in data]
                for it in items:
                    if it["key"] not in data:
                        return self.fail(f"{self.where()}: volume {name}: key {it['key']} in {ref}")
                    f = d / it["path"]
                    f.parent.mkdir(parents=True, exist_ok=True)
                    f.write_text(data[it["key"]])
                    os.chmod(f, it.get("mode", src.get("defaultMode", 0o644)))
                self.mounts[name] = ("bind", str(d), True)
            elif "emptyDir" in v:
                ed = v["emptyDir"] or {}
                vol = f"k8srun-{self.run_id}-{self.pod_name}-{name}" + ("-p" if self.placeholder_key else "")
                # The kubelet makes an emptyDir 0777; with fsGroup, group fsGroup and setgid.
                mode = "2777" if fs_group is not None else "0777"
                opts = [f"mode={mode}"] + ([f"gid={fs_group}"] if fs_group is not None else [])
                if ed.get("medium") == "Memory":
                    if ed.get("sizeLimit"):
                        opts.append(f"size={int(quantity(ed['sizeLimit']))}")
                    create = ["--driver", "local", "--opt", "type=tmpfs", "--opt", "device=tmpfs",
                              "--opt", "o=" + ",".join(opts)]
                else:
                    d = self.tmp / "volumes" / name
                    d.mkdir(parents=True)
                    os.chmod(d, int(mode, 8))
                    if fs_group is not None:
                        os.chown(d, -1, fs_group)
                    create = ["--driver", "local", "--opt", "type=none", "--opt", "o=bind",
                              "--opt", f"device={d}"]
                self.volumes.append(vol)
                code, out, err = docker("volume", "create", "--label", f"{LABEL}={self.run_id}", *create, vol)
                if code:
                    return self.fail(f"{self.where()}: emptyDir {name} as docker volume {vol}", err.strip())
                self.mounts[name] = ("volume", vol, False)
            else:
                return self.fail(f"{self.where()}: volume {name} is emulated",
                                 f"type {sorted(set(v) - {'name'})} not supported")
        return self.start_sandbox()

    def start_sandbox(self):
        """The pod's sandbox (the kubelet's pause container): it holds the emptyDir volumes
        mounted for the pod's lifetime. Docker's local driver mounts a tmpfs volume when a first
        container uses it and unmounts it (contents gone) when the last one ends, so without a
        holder the init container's files would vanish before the container starts."""
        vols = [src for kind, src, _ in self.mounts.values() if kind == "volume"]
        if not vols:
            return True
        name = f"k8srun-{self.run_id}-{self.pod_name}-sandbox" + ("-p" if self.placeholder_key else "")
        self.containers.append(name)
        a = ["run", "-d", "--name", name, "--label", f"{LABEL}={self.run_id}", "--network", "none",
             "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
             "--user", "65535:65535", "--entrypoint", "sleep"]
        for k, vol in enumerate(vols):
            a += ["--mount", f"type=volume,source={vol},target=/k8srun/{k},volume-nocopy,readonly"]
        code, out, err = docker(*a, self.cluster.args.image, "infinity")
        if code:
            return self.fail(f"{self.where()}: pod sandbox holding the emptyDir volumes", err.strip())
        return True

    def security(self, c):
        """The effective securityContext (container fields over the pod's)."""
        pod, own = self.spec.get("securityContext", {}), c.get("securityContext", {})
        eff = {k: own.get(k, pod.get(k)) for k in ("runAsUser", "runAsGroup", "runAsNonRoot", "seccompProfile")}
        eff.update({k: own.get(k) for k in ("readOnlyRootFilesystem", "allowPrivilegeEscalation",
                                            "capabilities", "privileged")})
        eff["groups"] = [*pod.get("supplementalGroups", []),
                         *([pod["fsGroup"]] if pod.get("fsGroup") is not None else [])]
        return eff

    def env(self, c):
        """The container's environment as the kubelet builds it → (env, problems)."""
        env, problems = dict(self.cluster.service_env), []
        defined = {}
        secrets = self.cluster.original_secrets if self.placeholder_key else self.cluster.secrets

        def source(kind, name, optional):
            data = (secrets if kind == "secret" else self.cluster.configmaps).get(name)
            if data is None and not optional:
                problems.append(f"{kind} {name} not found (the pod would not start)")
            return data or {}

        for ref in c.get("envFrom", []):
            kind = "secret" if "secretRef" in ref else "configmap"
            r = ref.get("secretRef") or ref.get("configMapRef")
            for k, v in source(kind, r["name"], r.get("optional")).items():
                defined[ref.get("prefix", "") + k] = v
        for e in c.get("env", []):
            if "value" in e or "valueFrom" not in e:
                defined[e["name"]] = expand(e.get("value", ""), {**env, **defined})
                continue
            vf = e["valueFrom"]
            if "secretKeyRef" in vf or "configMapKeyRef" in vf:
                kind = "secret" if "secretKeyRef" in vf else "configmap"
                r = vf.get("secretKeyRef") or vf.get("configMapKeyRef")
                data = source(kind, r["name"], r.get("optional"))
                if r["key"] in data:
                    defined[e["name"]] = data[r["key"]]
                elif not r.get("optional"):
                    problems.append(f"{e['name']}: key {r['key']} not in {kind} {r['name']}")
            elif "fieldRef" in vf:
                path = vf["fieldRef"]["fieldPath"]
                fields = {"metadata.name": self.pod_name, "metadata.namespace": self.cluster.namespace,
                          "spec.serviceAccountName": self.spec.get("serviceAccountName", "default")}
                m = re.fullmatch(r"metadata\.labels\['(.+)'\]", path)
                if m:
                    fields[path] = self.labels.get(m.group(1), "")
                if path in fields:
                    defined[e["name"]] = fields[path]
                else:
                    problems.append(f"{e['name']}: fieldRef {path} not emulated")
            else:
                problems.append(f"{e['name']}: valueFrom {sorted(vf)} not emulated")
        env.update(defined)
        env.update(self.cluster.extra_env)
        return env, problems

    def docker_run(self, c, name):
        """`docker run -d` arguments and the environment they read (`-e KEY` takes the value from
        the client's environment: no value on a command line)."""
        env, problems = self.env(c)
        sc = self.security(c)
        a = ["run", "-d", "--name", name, "--label", f"{LABEL}={self.run_id}",
             "--network", self.cluster.args.network]
        if not self.host_network:
            a += ["--hostname", self.pod_name]
        user, group = sc["runAsUser"], sc["runAsGroup"]
        image_user = self.cluster.args.image_user
        if user is None and group is not None:
            user = image_user.split(":")[0] or "0"
        if user is not None:
            a += ["--user", f"{user}:{group}" if group is not None else str(user)]
        effective = str(user if user is not None else image_user.split(":")[0] or "0")
        if sc["runAsNonRoot"]:
            # The kubelet refuses to start a container that would run as root or as a user name
            # it cannot verify.
            if not effective.isdigit() or int(effective) == 0:
                problems.append(f"runAsNonRoot but the user would be {effective!r} (CreateContainerConfigError)")
        for g in sc["groups"]:
            a += ["--group-add", str(g)]
        if sc["readOnlyRootFilesystem"]:
            a.append("--read-only")
        if sc["privileged"]:
            a.append("--privileged")
        caps = sc["capabilities"] or {}
        for cap in caps.get("drop", []):
            a += ["--cap-drop", cap]
        for cap in caps.get("add", []):
            a += ["--cap-add", cap]
        if sc["allowPrivilegeEscalation"] is False:
            a += ["--security-opt", "no-new-privileges"]
        seccomp = (sc["seccompProfile"] or {}).get("type")
        if seccomp in (None, "Unconfined"):
            a += ["--security-opt", "seccomp=unconfined"]  # the kubelet's default: no profile
        elif seccomp != "RuntimeDefault":
            problems.append(f"seccompProfile {seccomp} not emulated")
        res = c.get("resources", {})
        if "memory" in res.get("limits", {}):
            mem = str(int(quantity(res["limits"]["memory"])))
            a += ["--memory", mem, "--memory-swap", mem]
        if "cpu" in res.get("limits", {}):
            a += ["--cpus", str(quantity(res["limits"]["cpu"]))]
        if "cpu" in res.get("requests", {}):
            a += ["--cpu-shares", str(max(2, int(quantity(res["requests"]["cpu"]) * 1024)))]
        for m in c.get("volumeMounts", []):
            if m["name"] not in self.mounts:
                problems.append(f"volumeMount {m['name']}: no such volume")
                continue
            kind, src, always_ro = self.mounts[m["name"]]
            if m.get("subPath"):
                if kind != "bind":
                    problems.append(f"volumeMount {m['name']}: subPath on an emptyDir not emulated")
                    continue
                src = str(Path(src, m["subPath"]))
            spec = f"type={kind},source={src},target={m['mountPath']}"
            if kind == "volume":
                spec += ",volume-nocopy"
            if always_ro or m.get("readOnly"):
                spec += ",readonly"
            a += ["--mount", spec]
        if c.get("workingDir"):
            a += ["-w", c["workingDir"]]
        for k in env:
            a += ["-e", k]
        command = [expand(x, env) for x in c.get("command", [])]
        args = [expand(x, env) for x in c.get("args", [])]
        if command:
            a += ["--entrypoint", command[0], self.cluster.args.image, *command[1:], *args]
            argv = command + args
        else:
            a += [self.cluster.args.image, *args]
            argv = self.cluster.args.image_entrypoint + (args or self.cluster.args.image_cmd)
        client_env = {k: v for k, v in os.environ.items() if k.startswith("DOCKER_") or k in ("PATH", "HOME")}
        client_env.update(env)
        return a, client_env, argv, problems

    def start(self, c, suffix):
        name = f"k8srun-{self.run_id}-{self.pod_name}-{suffix}"
        self.containers.append(name)
        a, client_env, argv, problems = self.docker_run(c, name)
        if problems:
            self.fail(f"{self.where(c)}: the kubelet could create the container", "; ".join(problems))
            return None, argv
        if self.cluster.args.verbose:
            say(f"       docker {' '.join(a)}")
        code, out, err = docker(*a, env=client_env)
        if code:
            self.fail(f"{self.where(c)}: docker run", err.strip())
            return None, argv
        return name, argv

    def run_to_completion(self, c, suffix, timeout):
        """Runs a container to its end → (exit code or None, seconds, logs)."""
        name, argv = self.start(c, suffix)
        if not name:
            return None, 0, ""
        t0 = time.monotonic()
        code, out, err = docker("wait", name, timeout=timeout)
        took = time.monotonic() - t0
        if code:
            docker("kill", name)
            return None, took, logs(name)
        return int(out.strip()), took, logs(name)

    def run_init(self, show_output=False):
        for k, c in enumerate(self.spec.get("initContainers", [])):
            code, took, out = self.run_to_completion(c, f"init{k}-{c['name']}", timeout=120)
            if not check(f"{self.where(c)} (init container `{' '.join(c.get('command', []) + c.get('args', []))[:90]}`)"
                         f" exits 0", code == 0, f"exit {code}{indent(out)}"):
                self.ok = False
                return False
            say(f"       {self.where(c)}: done in {took:.1f} s" + (f", said:{indent(out, 6)}"
                                              if show_output or self.cluster.args.verbose else ""))
        return True

    # ---- the container, observed ------------------------------------------------------------

    def verify_process(self, c, name, argv):
        """The running process is the manifest's command, with the manifest's identity and
        restrictions (read from /proc/1 inside the container, as the kernel sees them)."""
        code, out, err = docker("exec", name, "cat", "/proc/1/cmdline")
        running = out.split("\0")[:-1] if code == 0 else None
        check(f"{self.where(c)}: PID 1 is `{' '.join(argv)}` (command/args of the manifest)",
              running == argv, f"running {running!r} {err.strip()}")
        code, out, err = docker("exec", name, "cat", "/proc/1/status")
        status = dict(l.split(":", 1) for l in out.splitlines() if ":" in l)
        field = lambda k: status.get(k, "").split()
        sc = self.security(c)
        want, got = [], []
        if sc["runAsUser"] is not None:
            want.append(f"uid {sc['runAsUser']}")
            got.append(f"uid {field('Uid')[1] if field('Uid') else '?'}")
        if sc["runAsGroup"] is not None:
            want.append(f"gid {sc['runAsGroup']}")
            got.append(f"gid {field('Gid')[1] if field('Gid') else '?'}")
        if "ALL" in ((sc["capabilities"] or {}).get("drop", [])) and not (sc["capabilities"] or {}).get("add"):
            want.append("no capabilities")
            got.append("no capabilities" if status.get("CapEff", "").strip() == "0" * 16
                       else f"CapEff {status.get('CapEff', '?').strip()}")
        if sc["allowPrivilegeEscalation"] is False:
            want.append("no_new_privs")
            got.append("no_new_privs" if status.get("NoNewPrivs", "").strip() == "1" else "privileges may grow")
        if (sc["seccompProfile"] or {}).get("type") == "RuntimeDefault":
            want.append("seccomp filter")
            got.append("seccomp filter" if status.get("Seccomp", "").strip() == "2"
                       else f"Seccomp {status.get('Seccomp', '?').strip()}")
        check(f"{self.where(c)}: the process runs with {', '.join(want)}", code == 0 and want == got,
              f"{', '.join(got)} {err.strip()}")
        limit = c.get("resources", {}).get("limits", {}).get("memory")
        if limit:
            code, out, err = docker("exec", name, "sh", "-c", "cat /sys/fs/cgroup/memory.max 2>/dev/null"
                                    " || cat /sys/fs/cgroup/memory/memory.limit_in_bytes")
            check(f"{self.where(c)}: the kernel enforces resources.limits.memory {limit} (cgroup limit)",
                  code == 0 and out.strip() == str(int(quantity(limit))), f"cgroup says {out.strip()} {err.strip()}")
        if sc["readOnlyRootFilesystem"]:
            # /tmp: writable by anyone on a writable root, so only a read-only root refuses it.
            code, out, err = docker("exec", name, "sh", "-c", "echo > /tmp/k8srun-probe")
            check(f"{self.where(c)}: the root filesystem is read-only (a write to /tmp fails)",
                  code != 0 and "Read-only" in out + err, f"exit {code} {(out + err).strip()}")

    def running(self, name):
        code, out, err = docker("inspect", "-f", "{{.State.Running}} {{.State.ExitCode}} {{.State.OOMKilled}}", name)
        parts = out.split()
        return (code == 0 and parts and parts[0] == "true"), " ".join(parts)

    def start_main(self):
        self.main_name, self.argv = self.start(self.main, self.main["name"])
        self.t0 = time.monotonic()
        if not self.main_name:
            return False
        if self.host_network:
            self.ip = "127.0.0.1"
        else:
            net = self.cluster.args.network
            code, out, err = docker("inspect", "-f", f'{{{{(index .NetworkSettings.Networks "{net}").IPAddress}}}}',
                                    self.main_name)
            self.ip = out.strip()
            if not check(f"{self.where(self.main)}: has an IP on {net}", code == 0 and self.ip, err.strip()):
                self.ok = False
                return False
        return True

    def observe(self):
        """Probes on the kubelet's schedule until every probe has its verdict."""
        c, name = self.main, self.main_name
        ports = {p["name"]: p["containerPort"] for p in c.get("ports", []) if p.get("name")}
        floor = self.cluster.args.ready_floor
        probes = {k: c[f"{k}Probe"] for k in ("startup", "readiness", "liveness") if f"{k}Probe" in c}
        if "readiness" not in probes:
            check(f"{self.where(c)}: declares a readiness probe", False)
        t0 = self.t0
        active = {k: (0 if k == "startup" or "startup" not in probes else None) for k in probes}
        nxt = {k: None for k in probes}
        fails = {k: 0 for k in probes}
        verdict = {}
        ready_at = None  # first 200 on the readiness endpoint, polled finely between the kubelet's probes
        ready_seen = None
        after_ready_failures = 0
        last_alive_check = 0
        self.verify_pending = True
        while len(verdict) < len(probes) and not stopping.is_set():
            now = time.monotonic() - t0
            if now - last_alive_check > 2:
                last_alive_check = now
                alive, state = self.running(name)
                if not alive:
                    self.exited = True
                    parts = state.split() + ["?", "?", "?"]
                    self.fail(f"{self.where(c)}: keeps running", f"exited with code {parts[1]} "
                              f"(OOM-killed: {parts[2]}) after {now:.1f} s{indent(logs(name))}")
                    return
                if self.verify_pending and now > 1:
                    self.verify_pending = False
                    self.verify_process(c, name, self.argv)
            for k, p in probes.items():
                if k in verdict or active[k] is None:
                    continue
                if nxt[k] is None:
                    nxt[k] = active[k] + p.get("initialDelaySeconds", 0)
                if now < nxt[k]:
                    continue
                nxt[k] += p.get("periodSeconds", 10)
                ok, seen = probe_once(p, self.ip, ports, name)
                threshold = p.get("failureThreshold", 3)
                fails[k] = 0 if ok else fails[k] + 1
                if k == "startup":
                    if ok:
                        verdict[k] = (True, f"succeeded at {now:.1f} s")
                        for other in probes:
                            if other != "startup":
                                active[other] = now
                    elif fails[k] >= threshold:
                        verdict[k] = (False, f"{threshold} failures by {now:.1f} s (the kubelet kills "
                                             f"the container): {seen}")
                elif k == "readiness":
                    if ok and ready_seen is None:
                        ready_seen = now
                        ready_at = ready_at if ready_at is not None else now
                        verdict[k] = (True, f"ready after {ready_at:.1f} s (the kubelet's probe every "
                                            f"{p.get('periodSeconds', 10)} s saw it at {now:.1f} s): {seen}")
                        self.ready_after = ready_at
                    elif not ok:
                        window = max(p.get("initialDelaySeconds", 0)
                                     + p.get("periodSeconds", 10) * threshold, floor)
                        if now - active[k] >= window:
                            verdict[k] = (False, f"not ready after {now:.1f} s (window {window:g} s): {seen}")
                elif k == "liveness":
                    if ok:
                        verdict[k] = (True, f"{seen[:60]} at {now:.1f} s (first probe after "
                                            f"initialDelaySeconds {p.get('initialDelaySeconds', 0)})")
                    elif fails[k] >= threshold:
                        verdict[k] = (False, f"{threshold} consecutive failures by {now:.1f} s "
                                             f"(the kubelet restarts it): {seen}")
            # Finer readiness timing than the kubelet's period (the verdict above uses its schedule).
            rp = probes.get("readiness")
            if rp and ready_at is None and active["readiness"] is not None \
                    and now >= active["readiness"] + rp.get("initialDelaySeconds", 0):
                if probe_once(rp, self.ip, ports, name)[0]:
                    ready_at = now
            # Readiness keeps being probed once ready: it must not flap.
            if rp and ready_seen is not None and "readiness" in verdict:
                if nxt.get("readiness_after") is None:
                    nxt["readiness_after"] = now + rp.get("periodSeconds", 10)
                elif now >= nxt["readiness_after"]:
                    nxt["readiness_after"] += rp.get("periodSeconds", 10)
                    if not probe_once(rp, self.ip, ports, name)[0]:
                        after_ready_failures += 1
            time.sleep(0.25)
        if stopping.is_set():
            return  # interrupted: no verdicts
        for k in ("startup", "readiness", "liveness"):
            if k in verdict:
                p = probes[k]["httpGet"] if "httpGet" in probes[k] else probes[k]
                what = f"{p.get('path', '')} on port {p.get('port', '')}" if "path" in p else str(sorted(probes[k]))
                ok = check(f"{self.where(c)}: {k} probe {what}", verdict[k][0], "" if verdict[k][0] else verdict[k][1])
                if ok:
                    say(f"       {self.where(c)}: {k} {verdict[k][1]}")
                else:
                    self.ok = False
                    say(indent(logs(name)))
        if "readiness" in verdict and verdict["readiness"][0]:
            check(f"{self.where(c)}: stays ready after its first ready probe", after_ready_failures == 0,
                  f"{after_ready_failures} failed readiness probe(s)")
        if self.verify_pending:
            self.verify_process(c, name, self.argv)

    def check_services(self):
        """Every Service that selects this pod reaches it on its target ports; the PodMonitor's
        endpoint serves metrics."""
        c = self.main
        ports = {p["name"]: p["containerPort"] for p in c.get("ports", []) if p.get("name")}
        for svc in self.cluster.services:
            sel = svc["spec"].get("selector") or {}
            if not sel or not sel.items() <= self.labels.items():
                continue
            for p in svc["spec"].get("ports", []):
                target = p.get("targetPort", p["port"])
                port = ports.get(target) if isinstance(target, str) else target
                ok, seen = False, f"targetPort {target!r} is no named port of the container"
                if port:
                    try:
                        socket.create_connection((self.ip, port), timeout=2).close()
                        ok, seen = True, ""
                    except OSError as e:
                        seen = str(e)
                check(f"{self.where(c)}: Service {svc['metadata']['name']} port {p.get('name', p['port'])} "
                      f"→ targetPort {target} ({port}) accepts connections", ok, seen)
        for pm in self.cluster.podmonitors:
            sel = pm["spec"].get("selector", {}).get("matchLabels", {})
            if not sel.items() <= self.labels.items():
                continue
            for ep in pm["spec"].get("podMetricsEndpoints", []):
                path, port = ep.get("path", "/metrics"), ports.get(ep.get("port"), ep.get("port"))
                try:
                    with NO_PROXY.open(f"http://{self.ip}:{port}{path}", timeout=5) as r:
                        body = r.read().decode(errors="replace")
                        ok, seen = r.status == 200 and "# TYPE " in body, f"{r.status}, {len(body)} bytes"
                except Exception as e:
                    ok, seen = False, f"{type(e).__name__}: {e}"
                check(f"{self.where(c)}: PodMonitor {pm['metadata']['name']} scrapes {path} on port "
                      f"{ep.get('port')} (Prometheus text)", ok, seen)
                if ok:
                    say(f"       {self.where(c)}: {path} {seen}")

    def stop(self):
        """SIGTERM, then SIGKILL after terminationGracePeriodSeconds: must exit 0 in time."""
        grace = self.spec.get("terminationGracePeriodSeconds", 30)
        t0 = time.monotonic()
        code, out, err = docker("stop", "-t", str(grace), self.main_name, timeout=grace + 30)
        took = time.monotonic() - t0
        code, out, err = docker("inspect", "-f", "{{.State.ExitCode}} {{.State.OOMKilled}}", self.main_name)
        exit_code = int(out.split()[0]) if code == 0 and out.split() else None
        ok = check(f"{self.where(self.main)}: SIGTERM → exit 0 within terminationGracePeriodSeconds {grace}",
                   exit_code == 0 and took < grace,
                   f"exit {exit_code} after {took:.1f} s{indent(logs(self.main_name))}")
        if ok:
            say(f"       {self.where(self.main)}: exited 0 after {took:.1f} s")
        self.log_notes(self.main_name)
        return ok

    def log_notes(self, name):
        """Warnings and errors the process logged (JSON lines with `level`), as notes for the
        reader: each distinct message once, with its count."""
        counts = {}
        for line in logs(name, tail=None).splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            level = str(rec.get("level", "")).upper()
            if level in ("WARN", "WARNING", "ERROR"):
                extra = {k: v for k, v in rec.items() if k not in ("timestamp", "level", "message", "target")}
                text = rec.get("message", "") + (f" {json.dumps(extra, ensure_ascii=False)}" if extra else "")
                counts[(level, text)] = counts.get((level, text), 0) + 1
        for k, ((level, text), n) in enumerate(sorted(counts.items(), key=lambda x: -x[1])):
            if k == 6:
                note(f"{self.where(self.main)}: {len(counts) - 6} more distinct warnings/errors in its log")
                break
            note(f"{self.where(self.main)} logged {level}{f' x{n}' if n > 1 else ''}: {text[:300]}")

    # ---- whole pods ---------------------------------------------------------------------------

    def prepare(self):
        self.tmp.mkdir(parents=True)
        # The placeholder-key run repeats a pod the main run checks: its fields once is enough.
        return ((self.placeholder_key or self.check_fields()) and self.host_ports_free()
                and self.make_volumes())

    def host_ports_free(self):
        """On the host's network the pod's ports are the host's: another listener there would make
        the process fail to bind and, worse, answer the probes in its place."""
        if not self.host_network:
            return True
        taken = []
        for c in self.spec.get("initContainers", []) + self.spec["containers"]:
            for p in c.get("ports", []):
                port = p["containerPort"]
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                    taken.append(port)
                    continue
                except OSError:
                    pass
                with socket.socket() as sock:
                    try:
                        sock.bind(("0.0.0.0", port))
                    except OSError:
                        taken.append(port)
        return check(f"{self.where()}: its ports are free on the host (--network host)", not taken,
                     f"port(s) {taken} already in use by another process on this host; stop it, or "
                     "use a user-defined bridge network") or self.fail_quietly()

    def fail_quietly(self):
        self.ok = False
        return False

    def run_job(self):
        """A Job's pod: init containers, then the container to completion (exit 0)."""
        if not (self.prepare() and self.run_init(show_output=True)):
            return
        c = self.main
        code, took, out = self.run_to_completion(c, c["name"], timeout=self.spec.get("activeDeadlineSeconds", 180))
        name = self.containers[-1]
        if check(f"{self.where(c)} `{' '.join(c.get('command', []) + c.get('args', []))}` runs to completion, exit 0",
                 code == 0, f"exit {code} after {took:.1f} s{indent(out)}"):
            say(f"       {self.where(c)}: completed in {took:.1f} s")
        code2, out2, err2 = docker("inspect", "-f", "{{json .Path}} {{json .Args}} {{json .Config.User}}", name)
        if code2 == 0:
            path, argv, user = out2.split(" ", 2)
            ran = [json.loads(path), *json.loads(argv)]
            check(f"{self.where(c)}: the process was `{' '.join(self.argv_of(c))}` as {json.loads(user)}",
                  ran == self.argv_of(c), f"ran {ran}")
        self.log_notes(name)

    def argv_of(self, c):
        return (c.get("command") or self.cluster.args.image_entrypoint) + (
            c.get("args") or ([] if c.get("command") else self.cluster.args.image_cmd))

    def refuses_placeholder(self):
        """With the overlay's own placeholder key, the process must refuse to start, naming it."""
        if not (self.prepare() and self.run_init()):
            return
        c = self.main
        code, took, out = self.run_to_completion(c, c["name"] + "-placeholder", timeout=15)
        check(f"{self.where(c)} is given {SECRETS_KEY_ENV}: with the overlay's placeholder it refuses "
              "to start, naming it", code not in (None, 0) and SECRETS_KEY_ENV in out,
              (f"still running after {took:.0f} s (the key is in its environment but the process "
               "does not check it)" if code is None else f"exit {code} after {took:.1f} s")
              + indent(out, 4))

    def cleanup(self):
        for name in self.containers:
            docker("rm", "-f", "-v", name)
        for vol in self.volumes:
            docker("volume", "rm", "-f", vol)


def logs(name, tail=40):
    a = ["logs"] + (["--tail", str(tail)] if tail else []) + [name]
    code, out, err = docker(*a)
    return out + err


def start_long_running(pod):
    """Init containers, then the container, detached."""
    if not (pod.prepare() and pod.run_init()):
        return False
    if not pod.start_main():
        return False
    say(f"       {pod.where(pod.main)} started as {pod.pod_name} ({pod.ip})")
    return True


def observe_and_stop(pod):
    try:
        pod.observe()
        if pod.ok and not stopping.is_set():
            pod.check_services()
    finally:
        if pod.main_name and not stopping.is_set():
            if pod.exited:
                pod.log_notes(pod.main_name)
            else:
                pod.stop()


def in_threads(fn, pods):
    threads = [threading.Thread(target=fn, args=(p,), daemon=True) for p in pods]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.5)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--image", required=True)
    p.add_argument("--kustomize", default=str(Path.home() / ".cache/hookline/deploy-tools/bin/kustomize"))
    p.add_argument("--network", required=True, help="`host`, or a user-defined bridge network")
    p.add_argument("--bootstrap", required=True, help="the broker as the containers reach it")
    p.add_argument("--secrets-key-file", default=str(ROOT / "deploy/compose/secrets-key.env"))
    p.add_argument("--kafka-security-protocol", default="PLAINTEXT", help="the test broker's (default PLAINTEXT)")
    p.add_argument("--replication-factor", type=int, default=1,
                   help="the most replicas the test broker can hold (its broker count; default 1)")
    p.add_argument("--ready-floor", type=float, default=60,
                   help="seconds a first readiness may take at least (default 60)")
    p.add_argument("--overlay", default=str(OVERLAY))
    p.add_argument("--verbose", action="store_true", help="print every docker run command line")
    args = p.parse_args()
    args.prefix = "k8srun" + "".join(random.choice(string.ascii_lowercase + string.digits) for _ in range(6))
    run_id = args.prefix.removeprefix("k8srun")

    global DOCKER
    DOCKER = shutil.which("docker")
    if not DOCKER:
        check("docker is installed", False)
        return finish()
    code, out, err = docker("image", "inspect", "-f", "{{json .Config}}", args.image)
    if not check(f"image {args.image} exists", code == 0, err.strip()):
        return finish()
    cfg = json.loads(out)
    args.image_entrypoint, args.image_cmd = cfg.get("Entrypoint") or [], cfg.get("Cmd") or []
    args.image_user = cfg.get("User") or "0"
    if args.network != "host":
        code, out, err = docker("network", "inspect", "-f", "{{.Driver}}", args.network)
        if not check(f"network {args.network} exists", code == 0, err.strip()):
            return finish()

    r = subprocess.run([args.kustomize, "build", args.overlay], capture_output=True, text=True)
    rel = os.path.relpath(args.overlay, ROOT)
    if not check(f"kustomize build {rel}", r.returncode == 0, r.stderr[-2000:]):
        return finish()
    cluster = Cluster([o for o in yaml.safe_load_all(r.stdout) if o], args)
    names = [w["metadata"]["name"] for w in cluster.workloads]
    check(f"the rendered overlay has the workloads {', '.join(ORDER)}", set(ORDER) <= set(names), str(names))
    cluster.placeholder_key = None
    cluster.apply_test_adjustments()
    placeholder = getattr(cluster, "placeholder_key", None)

    def on_term(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)
    tmp = tempfile.mkdtemp(prefix=f"k8srun-{run_id}-")
    pods = []
    t_start = time.monotonic()
    try:
        say(f"--- run {run_id}: topics {args.prefix}.*, containers and volumes labelled {LABEL}={run_id}")
        jobs = [w for w in cluster.workloads if w["kind"] == "Job"]
        stages = [w for w in cluster.workloads if w["kind"] != "Job"]
        for w in jobs:
            say(f"--- Job {w['metadata']['name']}")
            pod = Pod(cluster, w, run_id, tmp)
            pods.append(pod)
            pod.run_job()
            pod.cleanup()
        if placeholder is not None and not usable_key(placeholder):
            say(f"--- the overlay's placeholder {SECRETS_KEY_ENV} (expected: refused)")
            given = []
            for w in stages:
                pod = Pod(cluster, w, run_id, tmp, placeholder_key=True)
                if any(placeholder == pod.env(c)[0].get(SECRETS_KEY_ENV) for c in pod.spec["containers"]):
                    pods.append(pod)
                    given.append(pod)

            def refuses(pod):
                pod.refuses_placeholder()
                pod.cleanup()
            if args.network == "host":
                for pod in given:
                    refuses(pod)
            else:
                in_threads(refuses, given)
        if args.network == "host":
            for w in stages:
                say(f"--- {w['kind']} {w['metadata']['name']} (one at a time: --network host)")
                pod = Pod(cluster, w, run_id, tmp)
                pods.append(pod)
                if start_long_running(pod):
                    observe_and_stop(pod)
                pod.cleanup()
        else:
            say(f"--- {', '.join(w['metadata']['name'] for w in stages)} (together, on {args.network})")
            threads = []
            for w in stages:
                pod = Pod(cluster, w, run_id, tmp)
                pods.append(pod)
                if start_long_running(pod):
                    # Observed from its start on, while the next pods start.
                    threads.append(threading.Thread(target=observe_and_stop, args=(pod,), daemon=True))
                    threads[-1].start()
            for t in threads:
                while t.is_alive():
                    t.join(0.5)
        say("--- time to ready: " + ", ".join(
            f"{p.name} {p.ready_after:.1f} s" if p.ready_after is not None else f"{p.name} never"
            for p in pods if p.kind != "Job" and not p.placeholder_key))
    except KeyboardInterrupt:
        stopping.set()
        check("the run finished", False, "interrupted")
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stopping.set()
        for pod in pods:
            pod.cleanup()
        # Anything labelled with this run that a pod object did not record (interrupted mid-start).
        code, out, err = docker("ps", "-aq", "--filter", f"label={LABEL}={run_id}")
        for cid in out.split():
            docker("rm", "-f", "-v", cid)
        code, out, err = docker("volume", "ls", "-q", "--filter", f"label={LABEL}={run_id}")
        for vol in out.split():
            docker("volume", "rm", "-f", vol)
        shutil.rmtree(tmp, ignore_errors=True)
        code, out, err = docker("ps", "-aq", "--filter", f"label={LABEL}={run_id}")
        code2, out2, err2 = docker("volume", "ls", "-q", "--filter", f"label={LABEL}={run_id}")
        check("cleanup: no container or volume of this run is left", not out.split() and not out2.split(),
              f"containers {out.split()}, volumes {out2.split()}")
        say(f"--- took {time.monotonic() - t_start:.0f} s; the topics {args.prefix}.* stay on the broker")
    return finish()


def finish():
    print(f"check-k8s-run: {passed} passed, {failed} failed", flush=True)
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
