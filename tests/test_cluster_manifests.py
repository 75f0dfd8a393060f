"""The cluster manifests parse, write the run to object storage, and take credentials from the
environment (a Kubernetes Secret, an instance profile), never from a file in the repository."""
from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from mdd.config import load_config
from mdd.storage import is_uri

ROOT = Path(__file__).resolve().parents[1]
SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "HF_TOKEN",
               "GOOGLE_APPLICATION_CREDENTIALS")


def _containers(job: dict) -> list[dict]:
    spec = job["spec"]["rayClusterSpec"]
    groups = [spec["headGroupSpec"]] + spec["workerGroupSpecs"]
    return [c for g in groups for c in g["template"]["spec"]["containers"]]


def test_rayjob_runs_the_main_job_to_object_storage():
    job = yaml.safe_load((ROOT / "cluster" / "rayjob.yaml").read_text(encoding="utf-8"))
    assert job["kind"] == "RayJob"
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[:3] == ["python", "-m", "jobs.run"]
    out = argv[argv.index("--out") + 1]
    assert out.startswith("s3://") and is_uri(out)
    config = argv[argv.index("--config") + 1]
    assert load_config(ROOT / config, {"synth.out": out}).synth.out == out
    runtime = yaml.safe_load(job["spec"]["runtimeEnvYAML"])
    assert not set(runtime.get("env_vars", {})) & set(SECRET_KEYS)
    for c in _containers(job):  # every pod (the driver on the head, the readers on the workers) has the Secret
        assert {"secretRef": {"name": "mdd-object-store"}} in c["envFrom"], c["name"]
        assert not {e["name"] for e in c.get("env", []) if "value" in e} & set(SECRET_KEYS)


def test_launcher_and_gpu_config_write_to_object_storage_with_node_roles():
    cfg = load_config(ROOT / "configs" / "gpu.yaml")
    assert cfg.synth.out.startswith("s3://")
    launcher = yaml.safe_load((ROOT / "cluster" / "cluster.yaml").read_text(encoding="utf-8"))
    for name, node in launcher["available_node_types"].items():
        assert "instance-profile/" in node["node_config"]["IamInstanceProfile"]["Arn"], name
    runtime = yaml.safe_load((ROOT / "cluster" / "runtime_env.yaml").read_text(encoding="utf-8"))
    assert not set(runtime.get("env_vars", {})) & set(SECRET_KEYS)
    for f in [*(ROOT / "cluster").glob("*.yaml"), *(ROOT / "configs").glob("*.yaml")]:
        text = f.read_text(encoding="utf-8")
        for key in SECRET_KEYS:  # named in comments at most, never given a value
            for line in text.splitlines():
                if key in line:
                    assert line.lstrip().startswith("#") or "valueFrom" in line, (f.name, line)
