#!/usr/bin/env bash
# Installs the Debian tools the command line's tests use: Chromium renders
# `graphmod diff --format=html` headless for a screenshot, Graphviz's `dot`
# parses `--format=dot`.
set -euo pipefail
need=()
command -v chromium >/dev/null || need+=(chromium)
command -v dot >/dev/null || need+=(graphviz)
[ ${#need[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
echo "installing ${need[*]} with apt-get"
$sudo apt-get install -y --no-install-recommends "${need[@]}" || {
  $sudo apt-get update && $sudo apt-get install -y --no-install-recommends "${need[@]}"; }
