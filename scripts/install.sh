#!/bin/sh
# Install everything sandcell needs on Debian 12, as root: system packages, the Python
# environment from the lock file, and the default image (built once, then cached).
set -eu
cd "$(dirname "$0")/.."

export DEBIAN_FRONTEND=noninteractive
missing=""
for pkg in runsc bubblewrap libseccomp2 debootstrap e2fsprogs iproute2 util-linux gcc libc6-dev \
    chromium chromium-driver; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing="$missing $pkg"
done
if [ -n "$missing" ]; then
    apt-get update -qq
    apt-get install -y -qq $missing >/dev/null
fi

python3 -m uv --version >/dev/null 2>&1 || python3 -m pip install --quiet uv
python3 -m uv sync --frozen --quiet

.venv/bin/sandcell image build python
.venv/bin/sandcell image build python-data
