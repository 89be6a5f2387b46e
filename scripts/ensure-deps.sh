#!/usr/bin/env bash
# Installs what the tests and `make run` need beyond Go modules:
# bubblewrap (sandbox tests), iproute2 (multi-host namespace tests),
# chromium (the control page's browser test), openssl (test CA), and git,
# less and gawk (the carrier tests of package approvals run the real
# tools; find, tar and sed are part of every Debian system), curl and jq
# (the README's commands, which integration's TestREADME runs).
# Debian/Ubuntu only; without root it says what is missing and goes on.
set -u
missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
command -v git >/dev/null 2>&1 || missing+=(git)
command -v less >/dev/null 2>&1 || missing+=(less)
command -v awk >/dev/null 2>&1 || missing+=(gawk)
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v jq >/dev/null 2>&1 || missing+=(jq)
# The confinement tests attack through the programs the allowlist
# names: ssh, zip, make and perl.
command -v ssh >/dev/null 2>&1 || missing+=(openssh-client)
command -v zip >/dev/null 2>&1 || missing+=(zip)
command -v make >/dev/null 2>&1 || missing+=(make)
command -v perl >/dev/null 2>&1 || missing+=(perl)
# npm installs OpenClaw and a Node.js runtime it accepts into a cache
# directory, once, for the end-to-end tests of integration/openclaw.
command -v npm >/dev/null 2>&1 || missing+=(npm)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "ensure-deps: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null 2>&1 || true
  if ! apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1; then
    echo "ensure-deps: WARNING: could not install ${missing[*]}; the tests that need them will skip and say so" >&2
  fi
else
  echo "ensure-deps: WARNING: missing ${missing[*]} (install the Debian packages as root); the tests that need them will skip and say so" >&2
fi
exit 0
