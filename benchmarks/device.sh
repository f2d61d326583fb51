#!/usr/bin/env bash
# One prepared command for a lent GPU machine (16 CPU cores, one NVIDIA GPU): the CUDA tests,
# the engine and query benchmarks on the device, and real MPI scaling on its cores, each step
# bounded so that the whole run ends inside ~8 minutes. Everything it prints and writes lands
# under OUT (the device tool's $OUT): summary.txt as it goes, and results.tar.gz at the end.
#
# Here, once per session that has a GPU (the image lacks these; see ../shared/device/wheels.sh):
#   echo /.whl/ >> .git/info/exclude; PYTHON=.venv/bin/python ../shared/device/wheels.sh .whl
# Then, through the device tool: command `bash benchmarks/device.sh`, carry [".whl"],
# timeout_s 560. STEPS="tests engine" runs some steps only; SECONDS_SCALE=0.5 shortens them.
set -u
out=${OUT:-${1:-/tmp/device-out}}
work=/tmp/device-results
mkdir -p "$out" "$work"
summary=$out/summary.txt
steps=${STEPS:-"env tests engine queries mpi idle"}  # "cpu": the 16-thread baseline, measured
scale=${SECONDS_SCALE:-1}
started=$(date +%s)

say() { echo "$*" | tee -a "$summary"; }
bounded() {  # bounded SECONDS NAME COMMAND...: run it under a time limit, log to NAME.txt
  local limit name=$2 rc t0
  limit=$(python3 -c "print(max(10, int($1 * $scale)))")
  shift 2
  t0=$(date +%s)
  PYTHONUNBUFFERED=1 timeout --kill-after=10 "$limit" "$@" >"$work/$name.txt" 2>&1
  rc=$?
  say "$(printf '%-28s rc=%-3s %4ss (limit %ss)' "$name" "$rc" $(( $(date +%s) - t0 )) "$limit")"
  tail -n 25 "$work/$name.txt" >>"$summary"
}
wants() { [[ " $steps " == *" $1 "* ]]; }

if [ -d .whl ]; then
  # mpich by --prefix: with --target pip drops a wheel's data/lib, where libmpi lives
  { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site $(ls .whl/*.whl | grep -v /mpich-) &&
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --prefix /tmp/mpich .whl/mpich-*.whl; } || { say "installing the carried wheels failed"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/mpich/bin:/tmp/site/bin:$PATH \
    MPIEXEC=/tmp/mpich/bin/mpiexec
  # mpi4py's wheel picks its MPI at run time: name mpich, or the image's Open MPI wins
  export MPI4PY_MPIABI=mpich MPI4PY_LIBMPI=/tmp/mpich/lib/libmpi.so.12 \
    LD_LIBRARY_PATH=/tmp/mpich/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
else
  export PYTHONPATH=$PWD
fi
export MPIR_CVAR_ENABLE_HEAVY_YIELD=1 NUMBA_CACHE_DIR=/tmp/numba-cache

if wants env; then
  bounded 60 env bash -c 'nvidia-smi; python3 -c "import torch, torch_geometric, numba, numpy;
print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0));
print(torch_geometric.__version__, numba.__version__, numpy.__version__)"; nproc'
fi

if wants tests; then  # every CUDA path against PyG (float64, 1e-9)
  bounded 150 cuda-tests python3 -m pytest -q -x -p no:cacheprovider \
    tests/test_engine.py tests/test_queries.py -k cuda
fi

if wants engine; then  # issue 51's table: arxiv-like, 2 layers, bs 1 / 100 / 1000 / 10,000
  bounded 170 engine-cuda python3 benchmarks/engine.py --device cuda --threads 8 --layers 2 \
    --workloads "GraphConv sum" "GraphConv max" GAT --batch-sizes 1 100 1000 10000 \
    --seconds 2 --out "$work/engine-cuda.json"
fi

if wants queries; then  # batch 1,024 on arxiv-like: exact and SRPE on the CPU and on cuda
  bounded 120 queries python3 benchmarks/queries.py --dataset arxiv-like --batch-sizes 1024 \
    --parts main --quick --threads 16 --epochs 5 --devices cpu cuda --out "$work" \
    --json "$work/queries.json"
fi

if wants cpu; then  # the baseline MPI must beat: one process, 16 threads, on the same cores
  bounded 90 engine-cpu16 python3 benchmarks/engine.py --device cpu --threads 16 --layers 2 \
    --workloads "GraphConv sum" --batch-sizes 1000 10000 --seconds 4 \
    --out "$work/engine-cpu16.json"
fi

if wants mpi; then  # real mpiexec on the 16 cores: 1 + P ranks, arxiv-like, bs 1,000 and 10,000
  bounded 30 mpi-check mpiexec -n 2 python3 -c "from mpi4py import MPI;
import mpi4py; c = MPI.COMM_WORLD;
print(c.Get_rank(), c.Get_size(), MPI.Get_library_version()[:12], mpi4py.__file__)"
  if grep -q '2 MPICH' "$work/mpi-check.txt"; then
    for run in "1000 1" "1000 4" "1000 8" "10000 1" "10000 4" "10000 8"; do
      read -r bs p <<<"$run"
      # one batch at a time, then as many streamed as serve streams them (two in flight)
      bounded 55 "scale-${bs}-${p}w" mpiexec -n $((p + 1)) python3 benchmarks/scale.py \
        --dataset arxiv-like --model graphconv-sum --batch "$bs" --batches $((20000 / bs + 4))
      cp "benchmarks/results/scale-arxiv-like-graphconv-sum-${p}w.json" \
        "$work/scale-arxiv-like-${bs}-${p}w.json" 2>/dev/null
    done
  else
    say "mpi: ranks do not see each other under MPICH (see mpi-check.txt): scaling skipped"
  fi
fi

if wants idle && grep -q '2 MPICH' "$work/mpi-check.txt" 2>/dev/null; then
  # issue 52's idle superstep (<= 50 us) with a core per rank: P = 4, 5 ranks
  bounded 100 idle-4 python3 benchmarks/idle.py --partitions 4 --batches 100 \
    --out "$work/idle-4.json"
fi

say "total $(( $(date +%s) - started ))s"
tar -czf "$out/results.tar.gz" -C "$work" .
