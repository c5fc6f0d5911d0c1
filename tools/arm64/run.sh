#!/usr/bin/env bash
# Run omnicore's equivalence tests on linux/arm64 under QEMU user emulation, from an x86-64
# Debian/Ubuntu host, as root. Everything comes from the host's apt mirror (qemu-user-static,
# debootstrap, an arm64 Debian root) and PyPI (aarch64 wheels); nothing else is downloaded.
#
#   sudo tools/arm64/run.sh                               # both CPU models, the default tests
#   sudo tools/arm64/run.sh --cpu neoverse-n1 -- -k golden tests/test_pipeline.py
#   sudo tools/arm64/run.sh --purge                        # delete the arm64 root
#
# Each --cpu is a real core's feature set (QEMU_CPU), so OpenBLAS and LLVM pick the kernels that
# core would get: cortex-a76 is a Raspberry Pi 5, neoverse-n1 a Graviton 2. (QEMU's default
# `max` CPU advertises SVE and SME, which no Pi or Graviton has.) The arm64 root, its Python
# environment and the Numba kernel cache stay in --root between runs: under emulation the first
# compile of the kernels takes many minutes, the next runs load them. It proves correctness,
# not speed: emulation is 10-50x slower than the real core.
#
# The CPU models run side by side, each logging to ROOT/logs/CPU.log; the summary comes at the
# end. On exit (also on failure or Ctrl-C) the runs are stopped, every mount is undone and the
# binfmt handler this script enabled is disabled again.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
ROOT=/var/tmp/omnicore-arm64
CPUS="cortex-a76,neoverse-n1"
SUITE="bookworm"
MIRROR=""
PURGE=0
TESTS=(tests/test_tokenizer.py tests/test_backbone.py tests/test_unmasking.py
       tests/test_packed_unmasking.py tests/test_higgs_codec.py tests/test_pipeline.py
       tests/test_streaming.py tests/test_int8_kernels.py)
# The Python packages the tests need, at the versions the host runs (when it has them), so the
# two runs differ only in the CPU.
PACKAGES=(numpy numba llvmlite safetensors tokenizers soundfile huggingface-hub pytest hypothesis
          onnxruntime threadpoolctl)

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) CPUS="$2"; shift 2 ;;
    --root) ROOT="$2"; shift 2 ;;
    --mirror) MIRROR="$2"; shift 2 ;;
    --purge) PURGE=1; shift ;;
    -h|--help) usage ;;
    --) shift; TESTS=("$@"); break ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

[ "$(id -u)" = 0 ] || { echo "run as root: binfmt_misc, debootstrap and chroot need it" >&2; exit 2; }
log() { printf '[arm64 %(%H:%M:%S)T] %s\n' -1 "$*"; }

MOUNTS=()        # what we mounted, unmounted in reverse order on exit
RUNS=()          # "pid:cpu" of the test runs going on
ENABLED_BINFMT=0
MOUNTED_BINFMT=0
cleanup() {
  local i run
  for run in "${RUNS[@]}"; do kill -TERM -- "-${run%%:*}" 2>/dev/null || true; done
  [ ${#RUNS[@]} -gt 0 ] && sleep 5  # let them end before their mounts go
  for ((i=${#MOUNTS[@]}-1; i>=0; i--)); do umount -R "${MOUNTS[i]}" 2>/dev/null || umount -l "${MOUNTS[i]}" || true; done
  [ "$ENABLED_BINFMT" = 1 ] && { update-binfmts --disable qemu-aarch64 >/dev/null || true; }
  [ "$MOUNTED_BINFMT" = 1 ] && { umount /proc/sys/fs/binfmt_misc || true; }
  return 0
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ "$PURGE" = 1 ]; then
  if grep -q " $ROOT/" /proc/mounts; then echo "$ROOT still has mounts: is a run going on?" >&2; exit 1; fi
  rm -rf --one-file-system "$ROOT"; log "removed $ROOT"; exit 0
fi

# --- host: emulator and binfmt handler ------------------------------------------------------
need=()
for pkg in qemu-user-static binfmt-support debootstrap; do dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg"); done
if [ ${#need[@]} -gt 0 ]; then
  log "apt-get install ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
  mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc; MOUNTED_BINFMT=1
fi
if ! grep -qx enabled /proc/sys/fs/binfmt_misc/qemu-aarch64 2>/dev/null; then
  # Debian's entry has the F flag: the kernel opens the emulator now, so the arm64 root needs
  # no copy of it.
  update-binfmts --enable qemu-aarch64; ENABLED_BINFMT=1
fi

# --- the arm64 Debian root (once) ------------------------------------------------------------
if [ -z "$MIRROR" ]; then
  MIRROR=$(grep -rhoE '^(URIs:|deb) *https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null \
           | grep -oE 'https?://[^ ]+' | head -1 || true)
  MIRROR=${MIRROR:-http://deb.debian.org/debian}
fi
mkdir -p "$ROOT"
if [ ! -e "$ROOT/.stage-debootstrap" ]; then
  log "debootstrap $SUITE arm64 from $MIRROR into $ROOT (a few minutes)"
  debootstrap --arch=arm64 --variant=minbase --foreign "$SUITE" "$ROOT" "$MIRROR" >/dev/null
  chroot "$ROOT" /debootstrap/debootstrap --second-stage >/dev/null
  touch "$ROOT/.stage-debootstrap"
fi

bind() {  # bind [--rbind] SRC DST: mount and remember it
  local opt=--bind; [ "$1" = --rbind ] && { opt=--rbind; shift; }
  mkdir -p "$2"; mount "$opt" "$1" "$2"; MOUNTS+=("$2")
}
mount -t proc proc "$ROOT/proc"; MOUNTS+=("$ROOT/proc")
bind --rbind /sys "$ROOT/sys"
bind --rbind /dev "$ROOT/dev"
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
# pip inside checks certificates against the host's bundle (the host may sit behind a proxy
# whose authority only the host trusts).
cp /etc/ssl/certs/ca-certificates.crt "$ROOT/etc/host-ca.crt"

# The environment inside: nothing of the host's but the certificates.
ENVV=(HOME=/root LANG=C.UTF-8 PATH=/opt/venv/bin:/usr/sbin:/usr/bin:/sbin:/bin
      PIP_CERT=/etc/host-ca.crt SSL_CERT_FILE=/etc/host-ca.crt PIP_DISABLE_PIP_VERSION_CHECK=1
      DEBIAN_FRONTEND=noninteractive)
inside() {  # inside CPU CMD...: run CMD in the arm64 root on that CPU model
  local cpu=$1; shift
  QEMU_CPU=$cpu chroot "$ROOT" /usr/bin/env -i QEMU_CPU="$cpu" "${ENVV[@]}" "$@"
}
FIRST_CPU=${CPUS%%,*}

if [ ! -e "$ROOT/.stage-apt" ]; then
  log "apt-get install python3 python3-venv libsndfile1 inside (a few minutes)"
  inside "$FIRST_CPU" sh -c 'apt-get update -qq && apt-get install -y -qq --no-install-recommends python3 python3-venv libsndfile1 >/dev/null'
  touch "$ROOT/.stage-apt"
fi

pins=()
for pkg in "${PACKAGES[@]}"; do
  v=$(python3 -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$pkg" 2>/dev/null || true)
  pins+=("$pkg${v:+==$v}")
done
if [ "$(cat "$ROOT/.stage-venv" 2>/dev/null)" != "${pins[*]}" ]; then
  log "PyPI aarch64 wheels into /opt/venv: ${pins[*]}"
  inside "$FIRST_CPU" sh -c '[ -x /opt/venv/bin/python ] || python3 -m venv /opt/venv'
  # --no-compile: under emulation byte-compiling every module costs more than compiling the few imported ones
  inside "$FIRST_CPU" python -m pip install -q --no-compile --only-binary=:all: "${pins[@]}"
  echo "${pins[*]}" > "$ROOT/.stage-venv"
fi

# --- the code under test: the checkout's files as git sees them (tracked + new, not ignored) --
rm -rf "$ROOT/src"; mkdir -p "$ROOT/src"
(cd "$REPO" && git ls-files -z -co --exclude-standard | tar --null -T - -cf - 2>/dev/null) | tar -xf - -C "$ROOT/src"

# --- the CPU models side by side, each in a mount namespace of its own ----------------------
# Each sees its own /proc/cpuinfo (LLVM, i.e. Numba, and ONNX Runtime read the CPU from it; the
# host's x86 one makes ONNX Runtime crash on import and LLVM target a generic core), keeps its
# own kernel cache and writes its own log; side by side, two niced runs get twice the idle time
# of one.
on_core() {  # on_core CPU CPUINFO CMD...: CMD in the arm64 root as that core
  local cpu=$1 info=$2; shift 2
  QEMU_CPU=$cpu unshare --mount --propagation private sh -c \
    'mount --bind "$1" "$2/proc/cpuinfo" && shift 2 && exec "$@"' sh "$info" "$ROOT" \
    chroot "$ROOT" /usr/bin/env -i QEMU_CPU="$cpu" "${ENVV[@]}" "$@"
}
run_core() {  # run_core CPU CPUINFO: what the libraries see there, then the tests
  local cpu=$1 info=$2 start rc
  on_core "$cpu" "$info" python -c '
import platform, numpy, numba, llvmlite.binding as ll, threadpoolctl
print("python", platform.python_version(), platform.machine(), "| numpy", numpy.__version__, "| numba", numba.__version__)
print("LLVM target cpu:", ll.get_host_cpu_name())
for p in threadpoolctl.threadpool_info():
    print("BLAS:", p.get("internal_api"), p.get("version"), "kernels:", p.get("architecture"))'
  start=$(date +%s)
  # One thread each: an emulated core is one host thread anyway.
  rc=0
  on_core "$cpu" "$info" NUMBA_CACHE_DIR="/var/cache/omnicore-numba/$cpu" \
    OMNICORE_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 \
    sh -c 'cd /src && exec python -m pytest -q -p no:cacheprovider "$@"' pytest "${TESTS[@]}" || rc=$?
  echo "exit $rc after $(( ($(date +%s) - start) / 60 )) min"
  return $rc
}
mkdir -p "$ROOT/logs"
set -m  # each run in a process group of its own, which cleanup can stop whole
IFS=, read -r -a cpu_list <<< "$CPUS"
for cpu in "${cpu_list[@]}"; do
  case "$cpu" in
    cortex-a76)  part=0xd0b variant=0x4 feats="fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp" ;;
    neoverse-n1) part=0xd0c variant=0x3 feats="fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs" ;;
    cortex-a72)  part=0xd08 variant=0x0 feats="fp asimd evtstrm crc32 cpuid" ;;
    *) echo "--cpu $cpu: no /proc/cpuinfo for it here (cortex-a76, neoverse-n1, cortex-a72)" >&2; exit 2 ;;
  esac
  info="$ROOT/tmp/cpuinfo-$cpu"
  for ((i=0; i<$(nproc); i++)); do
    printf 'processor\t: %d\nBogoMIPS\t: 50.00\nFeatures\t: %s\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: %s\nCPU part\t: %s\nCPU revision\t: 1\n\n' \
      "$i" "$feats" "$variant" "$part"
  done > "$info"
  log "QEMU_CPU=$cpu: pytest ${TESTS[*]} (log: $ROOT/logs/$cpu.log)"
  run_core "$cpu" "$info" > "$ROOT/logs/$cpu.log" 2>&1 &
  RUNS+=("$!:$cpu")
done
status=0
for run in "${RUNS[@]}"; do
  pid=${run%%:*} cpu=${run#*:}
  if wait "$pid"; then
    log "QEMU_CPU=$cpu: passed ($(tail -1 "$ROOT/logs/$cpu.log"))"
  else
    status=1; log "QEMU_CPU=$cpu: FAILED ($(tail -1 "$ROOT/logs/$cpu.log")); see $ROOT/logs/$cpu.log"
  fi
  sed -n '1,4p' "$ROOT/logs/$cpu.log" | sed 's/^/    /'
  grep -E "passed|failed" "$ROOT/logs/$cpu.log" | tail -1 | sed 's/^/    /'
done
RUNS=()
exit $status
