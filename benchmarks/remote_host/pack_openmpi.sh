#!/bin/bash
# Packs this machine's Open MPI (Debian's openmpi-bin 4.1) and the shared libraries that it
# and the programs in build/bench need, for a host that has neither TensorFlow nor Open MPI
# nor compilers (the 16-core rows of issue 23 §5): build here, copy the repository there,
# run benchmarks/remote_host/run.sh there.
#   benchmarks/remote_host/pack_openmpi.sh [DIR]     (default .devicepack, ignored by git)
# DIR/ompi_root.tgz holds Open MPI's own trees at their absolute paths (run.sh unpacks them
# without overwriting anything); DIR/lib the generic libraries (run.sh uses only those the
# host lacks). glibc and libstdc++ stay the host's (newer there, compatible).
set -euo pipefail
P=${1:-.devicepack}; L=/usr/lib/x86_64-linux-gnu
rm -rf "$P/root" "$P/lib"; mkdir -p "$P/root" "$P/lib"
for t in $L/openmpi $L/pmix2 /usr/share/openmpi /etc/openmpi $L/hwloc; do
  mkdir -p "$P/root$(dirname $t)"; cp -a $t "$P/root$t"
done
mkdir -p "$P/root/usr/bin" "$P/root$L"
cp -a /usr/bin/orterun /usr/bin/orted "$P/root/usr/bin/"
cp -a $L/libmpi.so.40* $L/libopen-rte.so.40* $L/libopen-pal.so.40* $L/libpmix.so.2* "$P/root$L/"
# Everything they and build/bench load, less glibc, libstdc++ and Open MPI's own; less the
# optional plugins' X11, ICU and XML libraries (tens of MB, not needed on loopback).
find $L/openmpi $L/pmix2 $L/hwloc /usr/bin/orterun $L/libmpi.so.40 build/bench -type f 2>/dev/null |
  while read -r e; do ldd "$e" 2>/dev/null | awk '/=> \//{print $3}'; done | sort -u |
  grep -v -E '/(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+|ld-linux[^/]*|libresolv|libutil)\.so' |
  grep -v -E 'openmpi/|pmix2/|libmpi|libopen-(rte|pal)|libpmix|liboshmem|libmca_common|libicu|libxml2|libX|libxcb|libOpenCL' |
  while read -r f; do cp -L "$f" "$P/lib/"; done || true  # find and ldd fail on what is not a program
tar czf "$P/ompi_root.tgz" -C "$P/root" . && rm -rf "$P/root"
du -sh "$P/ompi_root.tgz" "$P/lib"
