#!/usr/bin/env bash
# Installs what the offline Bazel build needs (see WORKSPACE): Debian's
# bazel-bootstrap and the rules_java / platforms packages it resolves locally.
set -euo pipefail
need=()
command -v bazel >/dev/null || need+=(bazel-bootstrap)
[ -d /usr/share/bazel/rules/java ] || need+=(bazel-rules-java)
[ -d /usr/share/bazel/platforms ] || need+=(bazel-platforms)
[ ${#need[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
echo "installing ${need[*]} with apt-get"
$sudo apt-get install -y "${need[@]}" || { $sudo apt-get update && $sudo apt-get install -y "${need[@]}"; }
