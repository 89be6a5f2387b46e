#!/usr/bin/env bash
# Fetches the xterm.js files the control page ships (ui/assets/xterm/)
# from the npm registry, at the versions pinned below, and checks each
# tarball against its pinned integrity (the sha512 of the registry's
# dist.integrity, which the registry's metadata must state too), so the
# committed files are reproducible. The files are copied as they are in
# the tarballs, and their sha256 sums written to ui/assets/xterm/SHA256SUMS,
# which ui's TestVendoredXterm holds the embedded files to.
#
#   scripts/vendor-xterm.sh          fetch, check and write the files
#   scripts/vendor-xterm.sh --check  fetch and check, and compare with the
#                                    committed files without writing
#
# The tests never run this: the files are committed. To move to another
# release, change a version and its integrity here (from
# `npm view @xterm/xterm@X dist.integrity`), run the script, and run the
# control page's browser tests.
#
# The canvas renderer (@xterm/addon-canvas) is shipped because the page's
# Content-Security-Policy (style-src 'self') refuses the <style> elements
# xterm 5's default DOM renderer writes; loaded before Terminal.open, the
# canvas renderer replaces it and xterm adds no inline style at all.
set -euo pipefail

registry=${NPM_REGISTRY:-https://registry.npmjs.org}
root=$(cd "$(dirname "$0")/.." && pwd)
dest=$root/ui/assets/xterm

# package version integrity, then tarball path → file name pairs.
packages=(
  "@xterm/xterm 5.5.0 sha512-hqJHYaQb5OptNunnyAnkHyM8aCjZ1MEIDTQu1iIbbTD/xops91NB5yq1ZK/dC2JDbVWtF23zUtl9JE2NqwT87A== package/lib/xterm.js=xterm.js package/css/xterm.css=xterm.css package/LICENSE=LICENSE"
  "@xterm/addon-fit 0.10.0 sha512-UFYkDm4HUahf2lnEyHvio51TNGiLK66mqP2JoATy7hRZeXaGMRDr00JiSF7m63vR5WKATF605yEggJKsw0JpMQ== package/lib/addon-fit.js=addon-fit.js package/LICENSE=LICENSE.addon-fit"
  "@xterm/addon-canvas 0.7.0 sha512-LF5LYcfvefJuJ7QotNRdRSPc9YASAVDeoT5uyXS/nZshZXjYplGXRECBGiznwvhNL2I8bq1Lf5MzRwstsYQ2Iw== package/lib/addon-canvas.js=addon-canvas.js package/LICENSE=LICENSE.addon-canvas"
)

check=false
case "${1:-}" in
--check) check=true ;;
"") ;;
*)
  echo "usage: $0 [--check]" >&2
  exit 2
  ;;
esac

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/out"

for entry in "${packages[@]}"; do
  read -r name version integrity files <<<"$entry"
  base=${name#*/}
  # The registry's metadata of this version must state the pinned
  # integrity: a republished or tampered package fails here.
  meta=$(curl -fsSL "$registry/${name/\//%2f}/$version")
  stated=$(printf '%s' "$meta" | tr -d '\n' | sed -n 's/.*"integrity"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p')
  if [ "$stated" != "$integrity" ]; then
    echo "vendor-xterm: $name@$version: the registry states integrity $stated, pinned $integrity" >&2
    exit 1
  fi
  tgz=$work/$base-$version.tgz
  curl -fsSL -o "$tgz" "$registry/$name/-/$base-$version.tgz"
  got="sha512-$(openssl dgst -sha512 -binary "$tgz" | base64 -w0)"
  if [ "$got" != "$integrity" ]; then
    echo "vendor-xterm: $name@$version: tarball integrity $got, pinned $integrity" >&2
    exit 1
  fi
  echo "vendor-xterm: $name@$version $integrity (tarball sha256 $(sha256sum "$tgz" | cut -d' ' -f1))"
  mkdir -p "$work/$base"
  tar -xzf "$tgz" -C "$work/$base"
  for pair in $files; do
    cp "$work/$base/${pair%%=*}" "$work/out/${pair#*=}"
  done
done

(cd "$work/out" && sha256sum -- * | LC_ALL=C sort -k2) >"$work/SHA256SUMS"

if $check; then
  (cd "$work/out" && for f in *; do cmp -s "$f" "$dest/$f" || { echo "vendor-xterm: $dest/$f differs from the release" >&2; exit 1; }; done)
  cmp -s "$work/SHA256SUMS" "$dest/SHA256SUMS" || { echo "vendor-xterm: $dest/SHA256SUMS is out of date" >&2; exit 1; }
  echo "vendor-xterm: $dest matches the pinned releases"
  exit 0
fi
rm -rf "$dest"
mkdir -p "$dest"
cp "$work"/out/* "$dest"/
cp "$work/SHA256SUMS" "$dest/SHA256SUMS"
echo "vendor-xterm: wrote $dest"
