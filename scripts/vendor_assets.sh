#!/usr/bin/env bash
# Refresh book/_static/vendor from the npm registry (maintainers only; the build uses the committed copies).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
v="$root/book/_static/vendor"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
npm pack --silent mathjax@3.2.2 @jupyter-widgets/html-manager@1.0.15 requirejs@2.3.8 >/dev/null
for f in *.tgz; do mkdir -p "x/${f%.tgz}"; tar xzf "$f" -C "x/${f%.tgz}"; done
rm -rf "$v/mathjax" "$v/html-manager" "$v/requirejs"
mkdir -p "$v/mathjax/output/chtml/fonts" "$v/html-manager" "$v/requirejs"
cp x/mathjax-*/package/es5/tex-chtml.js x/mathjax-*/package/LICENSE "$v/mathjax/"
cp -r x/mathjax-*/package/es5/output/chtml/fonts/woff-v2 "$v/mathjax/output/chtml/fonts/"
cp x/requirejs-*/package/require.js "$v/requirejs/"
dist=$(echo x/jupyter-widgets-html-manager-*/package/dist)
cp "$dist/embed-amd.js" "$v/html-manager/"
for font in $(grep -o '[0-9a-f]\{20\}\.woff2\?' "$dist/embed-amd.js" | sort -u); do cp "$dist/$font" "$v/html-manager/"; done
echo "vendored into $v"
