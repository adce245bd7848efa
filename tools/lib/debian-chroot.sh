# Shared by the Debian chroot tools (tools/sid-python, tools/bullseye-python):
# each sets the variables below, then sources this file and calls
# chroot_main "$@".  Sourced, never run.
#
#   TOOL         the tool's name, for messages
#   SUITE        the Debian suite debootstrap installs
#   ROOT         where the chroot lives (cached outside the clone)
#   RECIPE       bumped when PACKAGES changes: an older chroot is then
#                completed, not reused as is
#   PACKAGES     comma-separated packages installed into it
#   REQUIRED     files that must be there for the chroot to count as whole
#   PASSED_VARS  variables that cross into the chroot (env -i drops the rest)
#   after_ensure optional function, run after every ensure
#
# HEAPWATCH_CHROOT_BINDS ("SOURCE:TARGET ...") binds more host folders
# read-only inside for one run (the wheels' build binds the C library it
# links against into sid; the image check binds an interpreter).
#
# The Debian mirror is read from this machine's own apt sources at run time.
# The checkout's parent folder (which holds shared/) is bound at the same path
# inside, so every path the tests use is the same on both sides.

MARKER="$ROOT/.heapwatch-complete"
CHECKOUT="$(cd "$(dirname "$0")/.." && pwd)"
SHARED_PARENT="$(dirname "$CHECKOUT")"
EXTRA_BINDS="${HEAPWATCH_CHROOT_BINDS-}"

die() { echo "$TOOL: $*" >&2; exit 1; }

need_root() {
  [ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot and mount do)"
}

# The first Debian archive URI of the host's apt sources (deb822 or one-line
# format), skipping the security archive, which carries no sid.
debian_mirror() {
  for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list /etc/apt/sources.list; do
    [ -r "$f" ] || continue
    case "$f" in
      *.sources) uris=$(sed -n 's/^URIs:[[:space:]]*//p' "$f") ;;
      *) uris=$(sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]\+\).*/\2/p' "$f") ;;
    esac
    for u in $uris; do
      case "$u" in
        *security*) ;;
        */debian|*/debian/) echo "${u%/}"; return 0 ;;
      esac
    done
  done
  die "no Debian archive found in this machine's apt sources (/etc/apt/sources.list*)"
}

is_complete() {
  [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "$RECIPE" ] || return 1
  local f
  for f in $REQUIRED; do
    [ -e "$ROOT$f" ] || return 1
  done
}

install_certificates() {
  mkdir -p "$ROOT/usr/local/share/ca-certificates"
  for crt in /usr/local/share/ca-certificates/*.crt; do
    [ -e "$crt" ] && cp "$crt" "$ROOT/usr/local/share/ca-certificates/"
  done
  cp /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true
  chroot "$ROOT" /usr/sbin/update-ca-certificates >/dev/null 2>&1
}

ensure() {
  need_root
  if is_complete; then
    install_certificates  # cheap, and the host's certificates may have changed
    if declare -F after_ensure >/dev/null; then after_ensure; fi
    return 0
  fi
  command -v debootstrap >/dev/null 2>&1 || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap
  }
  mirror=$(debian_mirror)
  unmount_all
  if [ -x "$ROOT/usr/bin/apt-get" ] && [ -f "$ROOT/.heapwatch-bootstrapped" ]; then
    # A whole base system from an older recipe: add what the recipe now asks for.
    echo "$TOOL: completing $ROOT" >&2
    install_certificates
    # The machine's mirror may serve a frozen snapshot whose Release file has
    # passed its Valid-Until (sid's, here: debootstrap does not check it,
    # apt-get update does): the signatures are still checked.
    chroot "$ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
      sh -c "apt-get -o Acquire::Check-Valid-Until=false update -qq && apt-get install -y -qq --no-install-recommends $(echo "$PACKAGES" | tr , ' ')"
  else
    echo "$TOOL: creating the $SUITE chroot in $ROOT from $mirror (a few minutes, once)" >&2
    rm -rf "$ROOT"
    mkdir -p "$ROOT"
    debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOT" "$mirror" >"$ROOT.log" 2>&1 ||
      die "debootstrap failed; its log is $ROOT.log"
    touch "$ROOT/.heapwatch-bootstrapped"
    install_certificates
  fi
  echo "$RECIPE" >"$MARKER"
  is_complete || die "the chroot at $ROOT lacks one of $REQUIRED after set-up"
  if declare -F after_ensure >/dev/null; then after_ensure; fi
}

mount_once() {  # mount_once SOURCE TARGET [OPTIONS...]
  src=$1; dst=$2; shift 2
  mkdir -p "$dst"
  mountpoint -q "$dst" || mount "$@" "$src" "$dst"
}

# A bind left by an earlier run whose source was since deleted and made again
# still shows the deleted directory: bind the live one.
bind_live() {  # bind_live SOURCE TARGET
  if mountpoint -q "$2" && [ "$(stat -c %d:%i "$1")" != "$(stat -c %d:%i "$2")" ]; then
    umount -l "$2"
  fi
  mount_once "$1" "$2" --bind
}

mount_all() {
  mount_once proc "$ROOT/proc" -t proc
  mount_once /dev "$ROOT/dev" --rbind
  mount_once /sys "$ROOT/sys" --rbind
  bind_live "$SHARED_PARENT" "$ROOT$SHARED_PARENT"
  local pair
  for pair in $EXTRA_BINDS; do
    bind_live "${pair%%:*}" "$ROOT${pair#*:}"
    mount -o remount,bind,ro "$ROOT${pair#*:}"
  done
}

# Every mount point below the chroot, deepest first (a CI clone elsewhere binds
# its own folder), so that nothing of the host is reachable when it is removed.
mounts_below_root() {
  awk -v root="$ROOT" '$2 == root || index($2, root "/") == 1 { print $2 }' /proc/self/mounts | sort -r
}

unmount_all() {
  local m
  for m in $(mounts_below_root); do
    umount -R "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done
  [ -z "$(mounts_below_root)" ] || die "cannot unmount what is mounted below $ROOT: $(mounts_below_root | tr '\n' ' ')"
}

run() {
  [ $# -gt 0 ] || die "run needs a command"
  ensure
  mount_all
  local env=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8)
  local v
  for v in $PASSED_VARS; do
    [ -n "${!v-}" ] && env+=("$v=${!v}")
  done
  # The command's own folder is the checkout, as it is outside.
  exec chroot "$ROOT" /usr/bin/env -i "${env[@]}" /bin/sh -c 'cd "$0" && exec "$@"' "$CHECKOUT" "$@"
}

chroot_main() {
  case "${1-}" in
    ensure) ensure ;;
    run) shift; run "$@" ;;
    path) echo "$ROOT" ;;
    unmount) need_root; unmount_all ;;
    *) die "usage: tools/$TOOL ensure | run CMD [ARG...] | path | unmount" ;;
  esac
}
