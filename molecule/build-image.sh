#!/usr/bin/env bash
# Build (once) the container image every Molecule scenario uses: Debian bookworm with systemd
# as PID 1, made with debootstrap from the host's own apt mirror (read from the host's apt
# configuration, never hard-coded), with the host's apt, pip and CA settings so apt and pip
# work inside. Also configures podman for this kernel. Reuses the image when present.
set -euo pipefail
IMAGE="${LLMGW_MOLECULE_IMAGE:-localhost/llmgw-debian-systemd:12}"

configure_podman() {
  mkdir -p /etc/containers
  local conf=/etc/containers/containers.conf
  if ! grep -q 'llmgw molecule' "$conf" 2>/dev/null; then
    cat > "$conf" <<'CONF'
# llmgw molecule: settings these machines need (see shared/recipes/molecule-podman.md)
[containers]
default_ulimits = ["nofile=16384:16384", "nproc=16384:16384"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
  fi
}

mirror() {
  local f=/etc/apt/sources.list.d/debian.sources
  if [ -f "$f" ]; then
    awk '/^URIs:/ {print $2; exit}' "$f"
  else
    awk '/^deb / && $0 !~ /security/ {print $2; exit}' /etc/apt/sources.list
  fi
}

configure_podman
if podman image exists "$IMAGE"; then
  echo "image $IMAGE exists; reusing it"
  exit 0
fi

MIRROR="$(mirror)"
[ -n "$MIRROR" ] || { echo "cannot read the apt mirror from the host's apt configuration" >&2; exit 1; }
ROOTFS="$(mktemp -d /var/tmp/llmgw-rootfs.XXXXXX)"
trap 'rm -rf "$ROOTFS"' EXIT
echo "debootstrap bookworm from $MIRROR"
debootstrap --variant=minbase \
  --include=systemd,systemd-sysv,dbus,python3,python3-apt,python3-packaging,python3-venv,sudo,iproute2,procps,ca-certificates,curl \
  bookworm "$ROOTFS" "$MIRROR" > /var/tmp/llmgw-debootstrap.log 2>&1 \
  || { tail -20 /var/tmp/llmgw-debootstrap.log >&2; exit 1; }

# The host's apt, pip and CA settings, so package registries work inside.
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
  cp /etc/apt/sources.list.d/debian.sources "$ROOTFS/etc/apt/sources.list.d/"
  rm -f "$ROOTFS/etc/apt/sources.list"
fi
cp /etc/apt/apt.conf.d/99* "$ROOTFS/etc/apt/apt.conf.d/" 2>/dev/null || true
[ -f /etc/pip.conf ] && cp /etc/pip.conf "$ROOTFS/etc/pip.conf"
python3 - "$ROOTFS" <<'PY'
import re, sys
root = sys.argv[1]
pem = re.compile(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----", re.S)
host = pem.findall(open("/etc/ssl/certs/ca-certificates.crt").read())
mine = set(pem.findall(open(f"{root}/etc/ssl/certs/ca-certificates.crt").read()))
extra = [c for c in host if c not in mine]
with open(f"{root}/usr/local/share/ca-certificates/host-extra.crt", "w") as fh:
    fh.write("\n".join(extra) + "\n")
print(f"{len(extra)} host CA certificate(s) added")
PY
chroot "$ROOTFS" update-ca-certificates > /dev/null

# systemd as PID 1 in a container.
: > "$ROOTFS/etc/machine-id"
for unit in getty.target console-getty.service systemd-remount-fs.service \
    sys-kernel-debug.mount sys-kernel-tracing.mount systemd-udevd.service \
    systemd-udev-trigger.service dev-hugepages.mount apt-daily.timer \
    apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer; do
  ln -sf /dev/null "$ROOTFS/etc/systemd/system/$unit"
done
rm -rf "$ROOTFS"/var/lib/apt/lists/*
mkdir -p "$ROOTFS/var/lib/apt/lists/partial"
touch -d 2000-01-01 "$ROOTFS/var/lib/apt/lists"

tar --numeric-owner -C "$ROOTFS" -c . | podman import \
  --change 'CMD=["/lib/systemd/systemd"]' --change 'ENV=container=podman' \
  --change 'STOPSIGNAL=SIGRTMIN+3' - "$IMAGE"
echo "built $IMAGE"
