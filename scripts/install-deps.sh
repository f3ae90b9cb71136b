#!/usr/bin/env bash
# Installs the Debian packages attnops builds with (only those missing). Needs root or sudo.
set -euo pipefail
packages=(cmake ninja-build g++ clang ccache libgtest-dev libfmt-dev libcli11-dev nlohmann-json3-dev
  python3-dev python3-venv python3-pip)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
echo "installing: ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
