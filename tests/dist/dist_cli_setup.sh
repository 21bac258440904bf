# Shared set-up of the `exatrain train` tests under mpirun (dist_train_cli.sh, dist_fault_resume.sh).
# Source it with MPIEXEC, EXA and WORK set. MPIEXEC = srun runs the ranks under Slurm instead
# (srun --mpi=pmix; the test exits 77 = skipped when no Slurm answers: scripts/local-slurm.sh
# starts a one-node one, as .ci/run does). It leaves the shell in a fresh WORK directory holding a
# byte-level dataset prepared from a small text (data/), and defines TEST_DIR (tests/) and
#   MPIRUN                        the launcher for 2 ranks;
#   write_job FILE PARALLEL TRAIN the 2-rank job both tests train (dp 2, ZeRO 1, a 2-layer model),
#                                 with extra [parallel] and [train] lines;
#   rank_pid MPIRUN_PID R         the pid of world rank R among that mpirun's children ("" if none).
TEST_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)  # tests/, for the Python helpers
rm -rf "$WORK" && mkdir -p "$WORK" && cd "$WORK" || exit 1
for i in $(seq 1 300); do echo "line $i of a small test text, with some words to learn."; done > text.txt
"$EXA" data prepare --input text.txt --out data --tokenizer byte > prep.log 2>&1 || { echo "FAIL: prepare"; cat prep.log; exit 1; }
MPIRUN=("$MPIEXEC" --allow-run-as-root --oversubscribe -np 2)
LAUNCHER=mpirun
if [ "$(basename "$MPIEXEC")" = srun ]; then
  LAUNCHER=srun
  SLURM_TEST_NAME=exatrain-test-$$  # finds this test's ranks among other jobs' (rank_pid)
  command -v srun > /dev/null || { echo "SKIP: no srun (Slurm) on this machine"; exit 77; }
  timeout 30 srun -n 1 -J "$SLURM_TEST_NAME" true > /dev/null 2>&1 ||
    { echo "SKIP: srun -n 1 true failed: no Slurm answering (scripts/local-slurm.sh starts one)"; exit 77; }
  srun --mpi=list 2>&1 | grep -qw pmix || { echo "SKIP: this Slurm has no pmix MPI plugin (Open MPI needs it)"; exit 77; }
  MPIRUN=(srun --mpi=pmix --oversubscribe -n 2 -J "$SLURM_TEST_NAME")
fi

write_job() {
  cat > "$1" <<TOML
[model]
layers = 2
hidden = 32
heads = 2
seq_len = 16
[parallel]
gpus = 2
tp = 1
pp = 1
dp = 2
cp = 1
vp = 1
zero = 1
global_batch = 4
micro_batch = 1
recompute = "none"
seq_parallel = false
schedule = "1f1b"
$2
[train]
threads = 1
data = "data"
run_dir = "run"
$3
TOML
}

rank_pid() {
  local pid
  if [ "$LAUNCHER" = srun ]; then  # the ranks are slurmstepd's children: find them by their job name
    for pid in $(pgrep -f -- "$EXA"); do
      local env
      env=$(tr '\0' '\n' < /proc/$pid/environ 2>/dev/null)
      if grep -qx "SLURM_JOB_NAME=$SLURM_TEST_NAME" <<< "$env" && grep -qx "SLURM_PROCID=$2" <<< "$env"; then echo "$pid"; return; fi
    done
    return
  fi
  for pid in $(ps -o pid= --ppid "$1"); do
    if tr '\0' '\n' < /proc/$pid/environ 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2"; then echo "$pid"; return; fi
  done
}
