#!/usr/bin/env bash
# Set up this machine for tfcluster: the apt packages the local provider needs and the controller's
# virtual environment (.venv). Safe to re-run; it does only what is missing.
# --test: also what only the test suite uses (`make test` passes it).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-/usr/bin/python3}
# mmdebstrap: builds the local nodes' base image (bare Debian 12) once; the nodes run that image's own
# sshd, python3 and apt, so this host needs no sshd. openssh-client: ssh and ssh-keygen; nftables: the
# host's guard of the nodes' TensorFlow port; python3-venv: .venv.
APT_PACKAGES=(mmdebstrap openssh-client iproute2 nftables python3-venv procps util-linux)
# chromium: the tests load TensorBoard's page in headless Chromium (Debian's package: no browser download)
TEST_APT_PACKAGES=(chromium)
if [ "${1:-}" = "--test" ]; then
  APT_PACKAGES+=("${TEST_APT_PACKAGES[@]}")
fi

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "==> bootstrap: installing apt packages: ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "bootstrap: must run as root to install ${missing[*]} (the local provider also needs root)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v terraform >/dev/null; then
  echo "bootstrap: terraform (>= 1.5) is not on PATH; install it (HashiCorp's apt repository or release" >&2
  echo "zip) and re-run. The local provider downloads nothing: it uses only the built-in terraform_data." >&2
  exit 1
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "==> bootstrap: creating $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.tfcluster-installed"
# every package comes from a hash-pinned lock (requirements.txt is its human-edited input; `make lock`):
# the installer refuses a file whose sha256 is not in the lock, and a package the lock does not pin.
# pip installs uv (pinned in the lock) and uv the rest: ~45 s for a new venv, most of it compiling the .pyc
# files on every core, where pip took ~130 s (one core; it unpacks every wheel again, uv links from its cache).
PIP=("$VENV/bin/pip" install -q --disable-pip-version-check)
if [ ! -f "$stamp" ] || [ requirements.lock -nt "$stamp" ] || [ requirements-checkov.lock -nt "$stamp" ] \
    || [ pyproject.toml -nt "$stamp" ] || [ train/pyproject.toml -nt "$stamp" ] \
    || [ scripts/bootstrap.sh -nt "$stamp" ] || [ scripts/uv_setup.py -nt "$stamp" ]; then
  echo "==> bootstrap: installing Python packages into $VENV (about a minute)"
  # pip installs uv alone, from its entry of the lock (scripts/uv_setup.py: its pin and hashes)
  uv_lock=$(mktemp)
  sources=$(mktemp)
  trap 'rm -f "$uv_lock" "$sources"' EXIT
  "$PYTHON" scripts/uv_setup.py entry uv requirements.lock >"$uv_lock"
  "${PIP[@]}" --no-deps --require-hashes -r "$uv_lock"
  # the indexes, find-links and CA file this machine's pip is set up with (scripts/uv_setup.py), which uv does
  # not read itself (NUL-separated arguments); --no-config: nor uv's own configuration files. Any of the indexes may
  # serve a locked version (uv's default takes the first that has the package at all); a file whose hash the
  # lock does not have is refused either way
  "$VENV/bin/pip" config list | "$PYTHON" scripts/uv_setup.py sources >"$sources"
  mapfile -d '' -t pip_sources <"$sources"
  # --compile-bytecode: the .pyc files at install time, as pip writes them; without them a Python that may not
  # write its own (PYTHONDONTWRITEBYTECODE, set on this kind of machine) compiled every module it imported on
  # every start, and the test suite took 24 min 00 s against 17 min 34 s the run before
  UV=("$VENV/bin/uv" pip install -q --no-config --compile-bytecode --index-strategy unsafe-best-match
      "${pip_sources[@]}")
  # -b: the build dependencies of the packages built from source (python-terraform's, radl's setuptools) from
  # the lock too, hash-checked; without it the newest setuptools on the index, unchecked
  "${UV[@]}" --python "$VENV/bin/python" --require-hashes -r requirements.lock -b requirements.lock
  # the project and the training harness (train/tfc_harness, imported by the controller as an ordinary
  # package): no dependencies of their own to fetch, built by the locked setuptools (no build isolation)
  "${UV[@]}" --python "$VENV/bin/python" --no-deps --no-build-isolation -e . -e train
  # checkov (make lint) in a venv of its own: its exact pins clash with the set above
  [ -x "$VENV/checkov/bin/python" ] || "$PYTHON" -m venv "$VENV/checkov"
  "${UV[@]}" --python "$VENV/checkov/bin/python" --require-hashes -r requirements-checkov.lock \
    -b requirements-checkov.lock
  touch "$stamp"
fi
echo "==> bootstrap: ready ($VENV)"
