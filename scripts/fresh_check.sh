#!/usr/bin/env bash
# `make fresh-check`: the README's set-up on a fresh Debian 12 machine.
#
# Builds a clean Debian 12 (bookworm) root with debootstrap under build-fresh/,
# copies a clean `git clone` of HEAD into it (uncommitted files are not part of
# the check), installs the README's stated prerequisites (git, make) and runs
# the README's two commands there, `make run` then `make test`, inside a chroot,
# then `pip install .` and `pip wheel .` of the Python package in a clean venv.
# The root holds only what Debian installs in it: no host CUDA toolkit, no
# ccache, none of the host's environment. It is the "fresh Debian machine
# without extras" case.
#
# The bootstrapped base system is cached as build-fresh/base-bookworm.tar, so a
# rerun does not download it again; every run starts from that pristine base
# (the previous root is deleted). Downloaded .deb files are kept in
# build-fresh/apt-archives between runs (the packages are still installed by
# the project's own scripts on every run; only the download is saved).
#
# Usage: sudo scripts/fresh_check.sh [--known-failures FILE]
#   --known-failures FILE  ctest names (one a line) that may fail without failing
#                          the check, e.g. failures known on this CPU; every
#                          other failure, and any build error, is a FAIL.
# Environment: FRESH_MIRROR (default http://deb.debian.org/debian).
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

known_failures=""
while [ $# -gt 0 ]; do
  case "$1" in
    --known-failures) known_failures="$(realpath "$2")"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "fresh-check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

if [ "$(id -u)" -ne 0 ]; then
  echo "fresh-check: needs root (debootstrap, chroot and mounts); run: sudo make fresh-check" >&2
  exit 1
fi

repo="$(git rev-parse --show-toplevel)"
cd "$repo"
fresh="$repo/build-fresh"
root="$fresh/root"
base_tar="$fresh/base-bookworm.tar"
apt_cache="$fresh/apt-archives"
logs="$fresh/logs"
mirror="${FRESH_MIRROR:-http://deb.debian.org/debian}"
sha="$(git rev-parse HEAD)"
mkdir -p "$fresh" "$apt_cache" "$logs"

# The mounts the chroot needs, in mount order; unmounted in reverse.
mounts=(proc sys dev var/cache/apt/archives)

mounts_under_root() { findmnt -rn -o TARGET | grep -F "$root/" || true; }

unmount_all() {
  local i m
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
    m="$root/${mounts[i]}"
    if mountpoint -q "$m" 2>/dev/null; then
      umount "$m" 2>/dev/null || umount -l "$m"
    fi
  done
}

# Stage bookkeeping: name, seconds, result; printed at the end, also on failure.
# Stages run in subshells; one that has a remark for the verdict writes logs/note.
stage_names=()
stage_secs=()
stage_results=()
current_stage=""  # the stage running now, with its start time: an interrupted one is reported too
current_t0=""
run_start=$EPOCHREALTIME
verdict="FAIL"
rm -f "$logs"/*

seconds_since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }'; }

summary() {
  local i
  if [ -n "$current_stage" ]; then
    stage_names+=("$current_stage")
    stage_secs+=("$(seconds_since "$current_t0")")
    stage_results+=("INTERRUPTED")
  fi
  echo
  echo "fresh-check: Debian 12 root, clean clone of ${sha:0:12}"
  for i in "${!stage_names[@]}"; do
    printf '  %-14s %6ss  %s\n' "${stage_names[i]}" "${stage_secs[i]}" "${stage_results[i]}"
  done
  printf '  %-14s %6ss\n' "total" "$(seconds_since "$run_start")"
  local note=""
  if [ -s "$logs/note" ]; then note=" ($(cat "$logs/note"))"; fi
  echo "fresh-check: $verdict$note; logs in build-fresh/logs/"
}

# Whatever still runs inside the root (an interrupted stage's build) is ours:
# it must end before its mounts can go.
stop_root_processes() {
  local p pids=()
  for p in /proc/[0-9]*; do
    if [ "$(readlink "$p/root" 2>/dev/null)" = "$root" ]; then pids+=("${p#/proc/}"); fi
  done
  if [ ${#pids[@]} -eq 0 ]; then return; fi
  kill -TERM "${pids[@]}" 2>/dev/null || true
  sleep 2
  kill -KILL "${pids[@]}" 2>/dev/null || true
}

on_exit() {
  local rc=$?
  stop_root_processes
  unmount_all
  if [ -n "$(mounts_under_root)" ]; then
    echo "fresh-check: WARNING: still mounted under $root:" >&2
    mounts_under_root >&2
  fi
  summary
  exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT TERM

# Runs one stage: its output goes to the terminal and to logs/NAME.log.
stage() {
  local name="$1"
  shift
  local t0=$EPOCHREALTIME rc
  current_stage="$name"
  current_t0="$t0"
  echo "==> fresh-check: $name"
  # A subshell with errexit of its own: under `cmd || rc=$?` bash would ignore
  # set -e inside the stage's function and carry on after a failed command.
  # In the background, so that a signal to this script is handled at once
  # (bash waits for a foreground command before running a trap).
  set +e
  (
    (set -e; "$@") 2>&1 | tee "$logs/$name.log"
    exit "${PIPESTATUS[0]}"
  ) &
  wait $!
  rc=$?
  set -e
  current_stage=""
  stage_names+=("$name")
  stage_secs+=("$(seconds_since "$t0")")
  if [ "$rc" -eq 0 ]; then stage_results+=("ok"); else stage_results+=("FAILED (exit $rc)"); fi
  return "$rc"
}

# Runs a command in the chroot with a clean environment (nothing of the host's
# PATH, CUDA_HOME, CCACHE_* or compiler settings reaches it) and no stdin; pip
# trusts the host's CA bundle when the host has one (unpack_base copies it).
host_ca=""
[ -f /etc/ssl/certs/ca-certificates.crt ] && host_ca=/etc/host-ca-bundle.crt
in_root() {
  chroot "$root" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
    ${host_ca:+PIP_CERT=$host_ca} \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    /bin/bash -c "$1" </dev/null
}

bootstrap_base() {
  local tmp="$fresh/base-bootstrap"
  if ! command -v debootstrap >/dev/null; then
    echo "installing debootstrap on the host"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap
  fi
  rm -rf --one-file-system "$tmp"
  # minbase: the packages of priority "required" and apt; the strictest fresh machine.
  debootstrap --variant=minbase bookworm "$tmp" "$mirror"
  # The sources a Debian 12 installation has: the release, its updates and security.
  cat >"$tmp/etc/apt/sources.list" <<EOF
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
EOF
  rm -rf "$tmp"/var/cache/apt/archives/*.deb "$tmp"/var/lib/apt/lists/*
  tar --numeric-owner -C "$tmp" -cpf "$base_tar.tmp" .
  mv "$base_tar.tmp" "$base_tar"
  rm -rf --one-file-system "$tmp"
}

unpack_base() {
  if [ -n "$(mounts_under_root)" ]; then
    echo "still mounted under $root (a killed earlier run?); unmounting"
    unmount_all
  fi
  if [ -n "$(mounts_under_root)" ]; then
    echo "cannot unmount:" >&2
    mounts_under_root >&2
    return 1
  fi
  rm -rf --one-file-system "$root"
  mkdir -p "$root"
  tar --numeric-owner -C "$root" -xpf "$base_tar"
  cp -L /etc/resolv.conf "$root/etc/resolv.conf"
  # The host's CA bundle too, for pip in the root (make test's venv, pip install .): where
  # this host reaches PyPI through an intercepting proxy, only its bundle holds that CA.
  # Like resolv.conf, it is the host's network path, not a package the project installs.
  cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/host-ca-bundle.crt" 2>/dev/null || true
}

mount_all() {
  mount -t proc proc "$root/proc"
  mount -t sysfs sysfs "$root/sys"
  mount --bind /dev "$root/dev"
  mount --bind "$apt_cache" "$root/var/cache/apt/archives"
}

clone_head() {
  if [ -n "$(git status --porcelain)" ]; then
    echo "note: the working tree has uncommitted changes; they are not part of the check"
  fi
  git clone --quiet --no-hardlinks "$repo" "$root/root/tiermoe"
  local cloned
  cloned="$(git -C "$root/root/tiermoe" rev-parse HEAD)"
  if [ "$cloned" != "$sha" ]; then
    echo "the clone is at $cloned, not HEAD $sha" >&2
    return 1
  fi
  echo "cloned $sha into /root/tiermoe"
}

# The README's prerequisites on a fresh Debian 12, then proof that nothing of
# the host's toolchain is visible.
prerequisites() {
  # shellcheck disable=SC2016 # expanded inside the chroot
  in_root '
    set -e
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq git make
    echo "packages installed: $(dpkg-query -W | wc -l)"
    for tool in nvcc ccache clang c++ g++ cmake; do
      if command -v "$tool" >/dev/null; then echo "unexpected on a fresh machine: $tool" >&2; exit 1; fi
    done
    if [ -e /usr/local/cuda ]; then echo "unexpected: /usr/local/cuda" >&2; exit 1; fi
    echo "no compiler, CMake, CUDA or ccache before the project installs its dependencies"
  '
}

make_test() {
  local rc=0
  in_root 'cd /root/tiermoe && make test' || rc=$?
  local failed_log="$root/root/tiermoe/build/Testing/Temporary/LastTestsFailed.log"
  if [ "$rc" -eq 0 ]; then
    : >"$logs/failed-tests.txt"
    return 0
  fi
  if [ ! -f "$failed_log" ]; then
    echo "make test failed before ctest reported any test (see the log above)" >&2
    return "$rc"
  fi
  cut -d: -f2- "$failed_log" | sort >"$logs/failed-tests.txt"
  local n_failed
  n_failed=$(wc -l <"$logs/failed-tests.txt")
  echo "ctest: $n_failed failed test(s), listed in build-fresh/logs/failed-tests.txt"
  if [ -z "$known_failures" ]; then
    return "$rc"
  fi
  local unexpected
  unexpected=$(comm -23 "$logs/failed-tests.txt" <(grep -v '^\s*$' "$known_failures" | sort -u))
  if [ -n "$unexpected" ]; then
    echo "failures not in $known_failures:" >&2
    echo "$unexpected" >&2
    return "$rc"
  fi
  echo "every failure is listed in $known_failures"
  echo "$n_failed known failure(s) from $(basename "$known_failures")" >"$logs/note"
}

# The Python package as a user installs it: `pip install .` into a clean venv
# (build isolation fetches scikit-build-core and nanobind from PyPI; no torch),
# then the import and the console command; `pip wheel .` after it.
pip_install() {
  # shellcheck disable=SC2016 # expanded inside the chroot
  in_root '
    set -e
    python3 -m venv /root/pip-check
    /root/pip-check/bin/pip install --quiet /root/tiermoe
    /root/pip-check/bin/python -c "import tiermoe; print(\"import tiermoe:\", tiermoe.__version__)"
    /root/pip-check/bin/tiermoe --help | head -n 3
    /root/pip-check/bin/pip wheel --quiet --no-deps -w /root/wheels /root/tiermoe
    ls -l /root/wheels
  '
}

if [ -f "$base_tar" ]; then
  stage base unpack_base
else
  stage bootstrap bootstrap_base
  stage base unpack_base
fi
stage clone clone_head
mount_all
stage prerequisites prerequisites
stage make-run in_root 'cd /root/tiermoe && make run'
stage make-test make_test
stage pip-install pip_install
verdict="PASS"
