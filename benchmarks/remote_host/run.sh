#!/bin/bash
# The runtime benchmarks on a host without TensorFlow or compilers (issue 23 §5: np = 8 and
# 16 on a 16-core host), from programs built here:
#   here:  make build/bench/runtime_scaling && python -m benchmarks.allreduce --quick ...
#          (compiles build/bench/*), then benchmarks/remote_host/pack_openmpi.sh
#   there: OUT=results benchmarks/remote_host/run.sh
# Uses the host's Open MPI if it has one, else the packed one. QUICK=1: a rehearsal.
set -u
cd "$(dirname "$0")/../.."
PACK=${PACK:-.devicepack}; OUT=${OUT:-/tmp/remote_host}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=$(command -v python3)
{ nproc; uptime; grep -m1 "model name" /proc/cpuinfo; $PY --version; ulimit -n; cat /proc/sys/kernel/pid_max; } 2>&1 | tee "$OUT/machine.txt"
if ! command -v mpirun >/dev/null 2>&1; then
  tar xzf "$PACK/ompi_root.tgz" -C / --skip-old-files && ln -sf /usr/bin/orterun /usr/local/bin/mpirun && ldconfig
  mkdir -p /tmp/kflib
  for f in "$PACK"/lib/*; do n=$(basename "$f"); ldconfig -p | grep -q " $n " || cp "$f" /tmp/kflib/; done
  export LD_LIBRARY_PATH=/tmp/kflib
fi
mpirun --version 2>&1 | head -1 | tee -a "$OUT/machine.txt"
if [ -n "${QUICK:-}" ]; then
  A="--quick --raw-seconds 0.3 --sizes 4,1M"; NPS="2 4"; TOPS=STAR,AUTO; SC="--np 8 --topologies STAR --repeats 2"
else
  A="--repeats 5 --raw-seconds 2"; NPS="2,4 8 16"; TOPS=STAR,RING,BINARY_TREE,BINARY_TREE_STAR,CLIQUE,AUTO
  SC="--np 32,64,128 --repeats 3"
fi
only=raw,runtime,mpi
for np in $NPS; do  # one run per np, so that a time limit loses only the last
  tag=$(echo "$np" | tr , _)
  timeout "${T_AR:-170}" $PY -m benchmarks.allreduce --prebuilt --only $only --np "$np" --topologies $TOPS $A \
    --json "$OUT/allreduce_np$tag.json" > "$OUT/allreduce_np$tag.log" 2>&1
  echo "allreduce np=$np rc=$? at $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  only=runtime,mpi
done
timeout "${T_SC:-200}" $PY -m benchmarks.scaling $SC --json "$OUT/scaling.json" > "$OUT/scaling.log" 2>&1
echo "scaling rc=$? at $(date +%T)"
